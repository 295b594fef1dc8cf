"""Wan's chunked timestep table read by the fused ops as table + temb (patterns/table_slice.py).

``(scale_shift_table + temb.float()).chunk(6, dim)`` is never written: every LN + modulate and
gated residual reads the table and the temb itself and adds them in fp32. Checked on the
rewritten ATen graphs of the tiny Wan 2.1 / Wan 2.2 TI2V models (whole model and
``compile_repeated_blocks``), bitwise against eager, and on small modules spelling the chunk
every way the matcher takes (and one it must not).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.fx as fx
from functorch.compile import make_boxed_func
from helpers import bitwise_equal, compile_and_run
from torch._dynamo.backends.common import aot_autograd

import diffusion_fuse
from diffusion_fuse.fxpasses import PassManager
from diffusion_fuse.lowering import faults
from diffusion_fuse.testing.tiny_models import build

aten = torch.ops.aten
LN_MOD = torch.ops.diffusion_fuse.norm_modulate.default
GATED_LN = torch.ops.diffusion_fuse.gated_residual_norm_modulate.default
GATED = torch.ops.diffusion_fuse.gated_residual.default
DTYPES = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
WANS = pytest.mark.parametrize("name", ["wan21", "wan22_ti2v"])


def capture(model, kwargs, repeated_blocks=False) -> tuple[fx.GraphModule, list]:
    """The first ATen inference graph the lossless backend would see, and the real inputs of its call."""
    graphs, calls = [], []

    def compiler(gm, _):
        graphs.append(gm)

        def run(*args):
            calls.append(list(args))
            return gm.forward(*args)

        return make_boxed_func(run)

    backend = aot_autograd(fw_compiler=compiler, inference_compiler=compiler)
    torch._dynamo.reset()
    with torch.no_grad():
        if repeated_blocks:
            model.compile_repeated_blocks(backend=backend, fullgraph=True)
            model(**kwargs)
        else:
            torch.compile(model, backend=backend, fullgraph=True)(**kwargs)
    torch._dynamo.reset()
    return graphs[0], calls[0]


def table_sums(gm: fx.GraphModule) -> list[fx.Node]:
    """The fp32 table sums the graph chunks (the inputs of its split.Tensor nodes)."""
    return [n.args[0] for n in gm.graph.nodes if n.target is aten.split.Tensor]


def fp32_values_of_shape(gm: fx.GraphModule, shapes: set[tuple]) -> list[str]:
    """fp32 sums and casts of these shapes: the table sum and ``temb.float()`` (an fp32 model's own temb,
    a view of its projection, and Wan 2.1's [1,6,D] table parameter are not)."""
    out = []
    for n in gm.graph.nodes:
        v = n.meta.get("val") if n.target in (aten.add.Tensor, aten._to_copy.default) else None
        if isinstance(v, torch.Tensor) and v.dtype == torch.float32 and tuple(v.shape) in shapes:
            out.append(n.format_node())
    return out


def check_folded(gm: fx.GraphModule, args: list, expected_ops: dict) -> fx.GraphModule:
    """Rewrite ``gm``; assert no table sum (or fp32 copy of temb) is left, each op reads table + temb,
    and the rewritten graph equals the ATen graph bitwise (ops on their reference path on CPU)."""
    sums = table_sums(gm)
    shapes = {tuple(s.meta["val"].shape) for s in sums}
    assert sums and all(len(s) in (3, 4) and s[-2] in (2, 6) for s in shapes), shapes
    fused, ctx = PassManager(diffusion_fuse.parse_options(None)).rewrite(gm)
    assert not table_sums(fused)
    assert not fp32_values_of_shape(fused, shapes)
    ops = [n for n in fused.graph.nodes if n.op == "call_function" and n.target in (LN_MOD, GATED_LN, GATED)]
    assert {t: sum(n.target is t for n in ops) for t in expected_ops} == expected_ops
    for n in ops:  # the table's second addend is passed to every scale, shift and gate
        if n.target is LN_MOD:
            assert len(n.args) == 10 and n.args[8] is not None and n.args[9] is not None, n.format_node()
        elif n.target is GATED_LN:
            has_scale = n.args[6] is not None
            unit_gate = n.args[2].target is aten.full.default  # an ungated residual (norm3's)
            assert (unit_gate or n.args[9] is not None) and (not has_scale or None not in n.args[10:12]), \
                n.format_node()
        else:
            assert n.args[3] is not None, n.format_node()
    with torch.no_grad():
        assert bitwise_equal(gm(*args), fused(*args))
    return fused


@DTYPES
@WANS
def test_wan_temb_table_is_folded_into_its_consumers(name, dtype):
    gm, args = capture(*build(name, dtype))
    assert len(table_sums(gm)) == 2  # the block's 6-chunk table and norm_out's 2-chunk table
    check_folded(gm, args, {LN_MOD: 1, GATED_LN: 3, GATED: 0})  # norm3: the ungated cross-attention residual


@DTYPES
@WANS
def test_repeated_blocks_graph_folds_the_table_and_the_block_end_residual(name, dtype):
    # compile_repeated_blocks: the block ends with its FFN residual, read by no LayerNorm in this graph.
    gm, args = capture(*build(name, dtype), repeated_blocks=True)
    assert len(table_sums(gm)) == 1
    check_folded(gm, args, {LN_MOD: 1, GATED_LN: 2, GATED: 1})


@DTYPES
@WANS
def test_repeated_blocks_through_the_backend_equal_eager(name, dtype):
    model, kwargs = build(name, dtype)
    report = diffusion_fuse.Report()
    with torch.no_grad():
        ref = model(**kwargs)
        model.compile_repeated_blocks(backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)
        out = model(**kwargs)
    torch._dynamo.reset()
    assert bitwise_equal(ref, out)
    counts = {f: report.count(f, status="kept") for f in
              ("norm_modulate", "gated_residual_norm_modulate", "gated_residual")}
    assert counts == {"norm_modulate": 1, "gated_residual_norm_modulate": 2, "gated_residual": 1}, report.table()


def test_a_slice_another_op_reads_keeps_the_sum_for_it_and_the_rest_still_read_the_table():
    # The gates' consumers not fused (families off): they read slices of the sum, which stays;
    # the LN + modulate sites still read table + temb.
    model, kwargs = build("wan22_ti2v", torch.bfloat16)
    opts = {"patterns": {"gated_residual_norm_modulate": False, "gated_residual": False}}
    ref, out, report = compile_and_run(model, kwargs, opts)
    assert bitwise_equal(ref, out)
    g = report.graphs[0]
    assert report.count("norm_modulate", status="kept") == 3 and "split" in g.final_code
    assert g.final_code.count("diffusion_fuse.norm_modulate.default(") == 3
    assert "torch.ops.aten.select.int(unsqueeze_2, 2, 1)" in g.final_code  # norm1's scale: a table row


def test_rejected_sites_put_the_table_sum_back():
    model, kwargs = build("wan22_ti2v", torch.bfloat16)
    with faults.inject("gated_residual_norm_modulate", "perturb", index=5):
        ref, out, report = compile_and_run(model, kwargs)
    assert bitwise_equal(ref, out)
    statuses = {s.pattern: s.status for s in report.sites() if s.pattern != "pointwise"}  # pointwise: its own
    assert statuses == {"norm_modulate": "kept", "gated_residual_norm_modulate": "rejected"}
    code = report.graphs[0].final_code
    # the sum is back (as the ATen add, or inside a pointwise group that computes it) and split six ways
    assert re.search(r"torch\.ops\.aten\.split\.Tensor\(\w+, 1, 2\)", code), code
    assert "diffusion_fuse.norm_modulate.default(" in code


# --- the matcher on the spellings of the chunk ------------------------------------------------------------
class TableBlock(torch.nn.Module):
    """A Wan-like block: modulation from ``table + temb`` chunked six ways; LN + modulate, gated
    residual into LN + modulate, gated residual at the end."""

    def __init__(self, D=32, per_token=False, order="table_first", split="chunk", table_dtype=torch.float32):
        super().__init__()
        self.per_token, self.order, self.split = per_token, order, split
        self.table = torch.nn.Parameter((torch.randn(1, 6, D) / D**0.5).to(table_dtype))
        self.norm = torch.nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
        self.proj = torch.nn.Linear(D, D)

    def forward(self, x, temb):
        table = self.table.unsqueeze(0) if self.per_token else self.table
        t = temb.float() if self.table.dtype == torch.float32 else temb
        s = table + t if self.order == "table_first" else t + table
        dim = 2 if self.per_token else 1
        if self.split == "chunk":
            parts = s.chunk(6, dim=dim - s.dim())  # a negative dim
        else:
            parts = torch.split(s, [1] * 6, dim)  # split_with_sizes
        if self.per_token:
            parts = [p.squeeze(dim) for p in parts]
        shift, scale, gate, c_shift, c_scale, c_gate = parts
        h = self.proj((self.norm(x.float()) * (1 + scale) + shift).type_as(x))
        x = (x.float() + h * gate).type_as(x)
        h = self.proj((self.norm(x.float()) * (1 + c_scale) + c_shift).type_as(x))
        return (x.float() + h.float() * c_gate).type_as(x)


def block_inputs(per_token, B=2, S=8, D=32):
    g = torch.Generator().manual_seed(0)
    temb_shape = (B, S, 6, D) if per_token else (B, 6, D)
    return torch.randn(B, S, D, generator=g).bfloat16(), torch.randn(*temb_shape, generator=g).bfloat16()


@pytest.mark.parametrize("per_token", [False, True], ids=["b6d", "per_token"])
@pytest.mark.parametrize("order", ["table_first", "temb_first"])
@pytest.mark.parametrize("split", ["chunk", "split_with_sizes"])
def test_every_spelling_of_the_chunk_is_folded(per_token, order, split):
    block = TableBlock(per_token=per_token, order=order, split=split).bfloat16()
    block.table.data = block.table.data.float()  # kept in fp32, as from_pretrained keeps Wan's
    x, temb = block_inputs(per_token)
    ref, out, report = compile_and_run(block, {"x": x, "temb": temb})
    assert bitwise_equal(ref, out)
    counts = {f: report.count(f, status="kept") for f in
              ("norm_modulate", "gated_residual_norm_modulate", "gated_residual")}
    assert counts == {"norm_modulate": 1, "gated_residual_norm_modulate": 1, "gated_residual": 1}, report.table()
    code = report.graphs[0].final_code
    assert "split" not in code and "torch.ops.aten.add.Tensor" not in code, code


def test_a_bf16_table_sum_is_read_as_a_slice():
    # SANA-like bf16 table + bf16 temb: the sum rounds to bf16, which the kernels do not do.
    block = TableBlock(table_dtype=torch.bfloat16).bfloat16()
    x, temb = block_inputs(False)
    ref, out, report = compile_and_run(block, {"x": x, "temb": temb})
    assert bitwise_equal(ref, out)
    assert report.count(status="kept") == 3 and "split" in report.graphs[0].final_code
