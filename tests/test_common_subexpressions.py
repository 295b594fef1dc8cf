"""fxpasses/common_subexpressions.py: a call repeating an earlier one's arguments reads its result."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import bitwise_equal, compile_and_run

from diffusion_fuse.config import Options
from diffusion_fuse.fxpasses.base import PassContext
from diffusion_fuse.fxpasses.common_subexpressions import CommonSubexpressionsPass
from diffusion_fuse.fxpasses.pass_manager import pass_order
from diffusion_fuse.testing.pointwise import trace
from diffusion_fuse.testing.tiny_models import build

aten = torch.ops.aten


def _run_pass(fn, *args, quality="lossless"):
    gm = trace(fn, *args)
    ctx = PassContext(options=Options(quality=quality))
    CommonSubexpressionsPass()(gm.graph, ctx)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm, ctx


def _count(gm, target) -> int:
    return sum(n.target is target for n in gm.graph.nodes)


def per_block_masks(text_mask, q, k, v):
    """Two blocks that each build the joint mask and attend with it (Qwen-Image's attention processor)."""
    out = q
    for _ in range(2):
        image_mask = torch.ones(q.shape[0], q.shape[2] - text_mask.shape[1], dtype=torch.bool, device=q.device)
        mask = torch.cat([text_mask, image_mask], dim=1)[:, None, None, :]
        out = F.scaled_dot_product_attention(out, k, v, attn_mask=mask)
    return out


def test_a_mask_each_block_builds_again_is_built_once():
    args = (torch.tensor([[True, True, False]]), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8),
            torch.randn(1, 2, 7, 8))
    gm_ref = trace(per_block_masks, *args)
    gm, ctx = _run_pass(per_block_masks, *args)
    assert _count(gm_ref, aten.ones.default) == 2 and _count(gm, aten.ones.default) == 1
    assert _count(gm_ref, aten.cat.default) == 2 and _count(gm, aten.cat.default) == 1
    assert len(ctx.notes) == 1 and ctx.notes[0].startswith("common_subexpressions: ")
    assert bitwise_equal(gm(*args), per_block_masks(*args))


def chain_twice(x, w):
    a = (x * 2 + 1).sin() @ w
    b = (x * 2 + 1).sin() @ w
    return a + b


def test_a_chain_computed_twice_collapses_link_by_link():
    args = torch.randn(4, 8), torch.randn(8, 8)
    gm, _ = _run_pass(chain_twice, *args)
    for target in (aten.mul.Tensor, aten.add.Tensor, aten.sin.default, aten.mm.default):
        assert _count(gm, target) == (2 if target is aten.add.Tensor else 1), target  # the final add stays
    assert bitwise_equal(gm(*args), chain_twice(*args))


CASES = {
    # random draws: two calls are two draws
    "random": (lambda x: x + torch.rand(4) + torch.rand(4), (torch.randn(4),)),
    # empty buffers hold no value to share
    "empty": (lambda x: torch.empty(4).copy_(x) * torch.empty(4).copy_(x * 2), (torch.randn(4),)),
    # two outputs must stay two tensors
    "outputs": (lambda x: ((x * 2), (x * 2)), (torch.randn(4),)),
    # same op, arguments that differ only where == does not tell (1.0 and 1, 0.0 and -0.0)
    "arguments": (lambda x: (x + 1.0) * (x + 1) * (x * 0.0) * (x * -0.0), (torch.randn(4),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_calls_that_are_not_one_value_are_left_alone(name):
    fn, args = CASES[name]
    before = trace(fn, *args)
    gm, ctx = _run_pass(fn, *args)
    kept = {t: _count(before, t) for t in {n.target for n in before.graph.nodes if n.op == "call_function"}}
    assert {t: _count(gm, t) for t in kept} == kept and not ctx.notes


def test_tier_high_leaves_it_to_inductor():
    args = torch.randn(4, 8), torch.randn(8, 8)
    gm, ctx = _run_pass(chain_twice, *args, quality="high")
    assert _count(gm, aten.sin.default) == 2 and not ctx.notes


def test_it_runs_after_the_pointwise_pass_and_before_cleanup():
    order = pass_order()
    assert order.index("pointwise") < order.index("common_subexpressions") < order.index("cleanup")


def test_flux_computes_its_rotary_tables_once_and_stays_bitwise():
    model, kwargs = build("flux", torch.bfloat16)
    ref, out, report = compile_and_run(model, kwargs)
    assert bitwise_equal(ref, out)
    notes = [n for g in report.graphs for n in g.notes if n.startswith("common_subexpressions: ")]
    assert len(notes) == 1 and "arange" in notes[0], notes
    assert all(s.status == "kept" for s in report.sites())
