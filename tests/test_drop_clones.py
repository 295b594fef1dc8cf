"""fxpasses/drop_clones.py: a standalone clone of a contiguous intermediate is that intermediate."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from helpers import bitwise_equal, compile_and_run, dropout_clones

from diffusion_fuse.config import Options
from diffusion_fuse.fxpasses.base import PassContext, writes_only_inputs
from diffusion_fuse.fxpasses.drop_clones import DropClonesPass, storage_base
from diffusion_fuse.testing.pointwise import trace

aten = torch.ops.aten


def _clones(gm) -> int:
    return sum(n.target is aten.clone.default for n in gm.graph.nodes)


def _run_pass(fn, *args, quality="lossless"):
    gm = trace(fn, *args)
    ctx = PassContext(options=Options(quality=quality))
    before = _clones(gm)
    DropClonesPass()(gm.graph, ctx)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm, before, ctx


def linear_dropout_residual(x, w, b, res):  # attn.to_out = [Linear, Dropout]: eval Dropout traced as a clone
    return res + torch.nn.functional.linear(x, w, b).view(2, 4, 8).clone()


def split_then_clone(x):  # a contiguous view of a fresh tensor through a multi-result op (split's getitem)
    a, _ = (x * 2).split([1, 3], dim=0)
    return a.clone() + 1


def test_a_dropout_clone_reads_its_input():
    args = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8), torch.randn(2, 4, 8)
    gm, before, ctx = _run_pass(linear_dropout_residual, *args)
    assert before == 1 and _clones(gm) == 0
    assert len(ctx.notes) == 1 and "drop_clones: 1 clone(s)" in ctx.notes[0]
    assert bitwise_equal(gm(*args), linear_dropout_residual(*args))


CASES = {
    "clone of a graph input": lambda x: x.clone() + 1,
    "clone of a view of the input": lambda x: x.view(8, 8).clone() + 1,
    "clone is the output": lambda x: (x * 2).clone(),
    "a view of the clone is the output": lambda x: (x * 2).clone().view(64),
    "non-contiguous input": lambda x: (x * 2).transpose(0, 1).clone() + 1,
    "channels_last": lambda x: (x * 2).view(1, 4, 4, 4).clone(memory_format=torch.channels_last) + 1,
    "input 4 bytes into its buffer": lambda x: (x * 2).view(-1)[1:].clone() + 1,
}


@pytest.mark.parametrize("name", list(CASES))
def test_anything_else_keeps_its_clone(name):
    fn = CASES[name]
    x = torch.randn(4, 16)
    gm, before, ctx = _run_pass(fn, x)
    assert before == 1 and _clones(gm) == 1 and not ctx.notes, name
    assert bitwise_equal(gm(x), fn(x))


def test_a_view_through_split_is_traced_to_its_fresh_base():
    x = torch.randn(4, 8)
    (clone,) = [n for n in trace(split_then_clone, x).graph.nodes if n.target is aten.clone.default]
    assert storage_base(clone.args[0]).target is aten.mul.Tensor
    gm, before, _ = _run_pass(split_then_clone, x)
    assert before == 1 and _clones(gm) == 0
    assert bitwise_equal(gm(x), split_then_clone(x))


def test_a_16_byte_aligned_offset_is_dropped():
    fn = lambda x: (x * 2).view(-1)[4:].clone() + 1  # noqa: E731 - 4 fp32 elements in: aligned
    x = torch.randn(4, 16)
    gm, before, _ = _run_pass(fn, x)
    assert before == 1 and _clones(gm) == 0
    assert bitwise_equal(gm(x), fn(x))


def test_unsafe_view_aliases_what_it_views():
    # reshape of a non-contiguous tensor traces to clone + _unsafe_view, whose schema has no alias annotation:
    # a clone read by an _unsafe_view that is an output reaches that output
    g = fx.Graph()
    x = g.placeholder("x")
    m = g.call_function(aten.mul.Tensor, (x, 2.0))
    c = g.call_function(aten.clone.default, (m,))
    u = g.call_function(aten._unsafe_view.default, (c, [16]))
    g.output((u, m))
    val = torch.empty(4, 4)
    for n in (m, c):
        n.meta["val"] = val
    x.meta["val"] = val
    u.meta["val"] = val.view(16)
    ctx = PassContext(options=Options())
    DropClonesPass()(g, ctx)
    assert sum(n.target is aten.clone.default for n in g.nodes) == 1 and not ctx.notes
    assert storage_base(u) is c  # a view of the clone's fresh tensor
    assert storage_base(g.call_function(aten._unsafe_view.default, (x, [16]))) is None  # a view of the input


def test_storage_base_of_a_placeholder_is_none():
    gm = trace(lambda x: x.view(16).clone() + 1, torch.randn(4, 4))
    (view,) = [n for n in gm.graph.nodes if n.target is aten.view.default]
    assert storage_base(view) is None


def test_tier_high_leaves_clones_to_inductor():
    args = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8), torch.randn(2, 4, 8)
    gm, before, ctx = _run_pass(linear_dropout_residual, *args, quality="high")
    assert before == 1 and _clones(gm) == 1 and not ctx.notes


def _graph_with_inplace(into_input: bool) -> fx.Graph:
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(aten.mul.Tensor, (x, 2.0))
    c = g.call_function(aten.clone.default, (y,))
    g.call_function(aten.add_.Tensor, (x if into_input else y, 1.0))
    g.output(g.call_function(aten.add.Tensor, (c, 1.0)))
    return g


def test_a_graph_that_writes_into_its_own_tensors_is_left_alone():
    assert writes_only_inputs(_graph_with_inplace(into_input=True))
    assert not writes_only_inputs(_graph_with_inplace(into_input=False))
    g = fx.Graph()  # an out= op writing into a tensor the graph made (the written argument is a keyword)
    x = g.placeholder("x")
    y = g.call_function(aten.mul.Tensor, (x, 2.0))
    g.call_function(aten.add.out, (x, x), {"out": y})
    g.output(g.call_function(aten.clone.default, (y,)))
    assert not writes_only_inputs(g)
    g = fx.Graph()  # AOTAutograd's input mutation: copy_ into a view of an input, at the end
    x = g.placeholder("x")
    y = g.call_function(aten.mul.Tensor, (x, 2.0))
    g.call_function(aten.copy_.default, (g.call_function(aten.view.default, (x, [16])), y))
    g.output(y)
    assert writes_only_inputs(g)
    g = _graph_with_inplace(into_input=False)
    ctx = PassContext(options=Options())
    DropClonesPass()(g, ctx)
    assert sum(n.target is aten.clone.default for n in g.nodes) == 1 and not ctx.notes


def test_flux_block_drops_its_to_out_dropout_and_equals_eager():
    from diffusion_fuse.testing.tiny_models import build

    model, kwargs = build("flux")
    ref, out, report = compile_and_run(model, kwargs)
    assert bitwise_equal(ref, out)
    # torch <= 2.13 traces eval-mode Dropout as a plain clone (attn.to_out[1], the FF's dropout), 2.14 as nothing:
    # either way none is left. The contiguous_format clones of RoPE's expands are real copies and stay.
    (g,) = report.graphs
    traced = dropout_clones(g.ref_code)
    notes = [n for n in g.notes if n.startswith("drop_clones")]
    if traced:
        (note,) = notes
        assert f"{len(traced)} clone(s)" in note and note.endswith(", ".join(traced)), (traced, note)
    else:
        assert not notes, notes
    assert not dropout_clones(g.final_code)
