"""patterns/grouped_gemv.py, fxpasses/grouped_gemv.py and lowering/grouped_gemv.py on the CPU: which linears
are grouped, where the op goes, the report, the op's reference path.

On the CPU the op runs its reference (the same ``addmm`` calls as eager), so the outputs are eager's bits;
tests/kernels/test_grouped_gemv_kernel.py checks the kernel in Triton's interpreter and tests/gpu/ on an H200.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from helpers import bitwise_equal, capture_graphs, compile_and_run, full_only

from diffusion_fuse.lowering.grouped_gemv import grouped_gemv
from diffusion_fuse.testing.tiny_models import build


def _sites(report, status=None):
    return [v for g in report.graphs for k, v in g.sites.items()
            if k.startswith("grouped_gemv") and (status is None or v.status == status)]


def _notes(report):
    return [n for g in report.graphs for n in g.notes if n.startswith("grouped_gemv")]


# tiny configs: FLUX one double + one single block + norm_out, Qwen-Image one block + norm_out, SD3.5 two
# blocks + norm_out, FLUX.2 its shared modulations (double-stream image and text, single-stream) + norm_out
@pytest.mark.parametrize("name, members", [("flux", 4), ("qwen_image", 3), ("sd35", 5), pytest.param(
    "flux2", 4, marks=full_only("FLUX.1's: modulation linears of one silu(temb) grouped into one launch"))])
def test_modulation_linears_become_one_launch_and_equal_eager(name, members):
    torch._dynamo.reset()
    model, kwargs = build(name)
    ref, out, report = compile_and_run(model, kwargs)
    assert bitwise_equal(ref, out)
    kept = _sites(report, "kept")
    assert len(kept) == 1, [(s.status, s.reason) for s in _sites(report)]
    assert sum(op in ("addmm", "mm") for op in kept[0].before) == members  # FLUX.2's linears have no bias
    assert _notes(report) and "silu" in _notes(report)[0]


def test_the_family_can_be_turned_off():
    # the module the tests below group into one site
    torch._dynamo.reset()
    ref, out, report = compile_and_run(_Modulations(), _inputs(), options={"patterns": {"grouped_gemv": False}})
    assert bitwise_equal(ref, out) and not _sites(report) and not _notes(report)


class _Modulations(torch.nn.Module):
    """Three modulation linears of one silu(temb), read by three consumers spread over the forward."""

    def __init__(self, dim=32, rows_of=(64, 96, 32), bias=(True, False, True), dtype=torch.bfloat16):
        super().__init__()
        self.lins = torch.nn.ModuleList(torch.nn.Linear(dim, n, bias=b, dtype=dtype) for n, b in zip(rows_of, bias))

    def forward(self, x, temb):
        for lin in self.lins:
            mod = lin(torch.nn.functional.silu(temb))
            x = x * (1 + mod[:, : x.shape[-1]]) + mod[:, -x.shape[-1]:]
        return x


def _inputs(rows=1, dim=32, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(rows, dim, generator=g).to(dtype), "temb": torch.randn(rows, dim, generator=g).to(dtype)}


@pytest.mark.parametrize("rows", [1, 2, 16])
def test_members_with_and_without_bias_and_a_few_rows(rows):
    torch._dynamo.reset()
    ref, out, report = compile_and_run(_Modulations(), _inputs(rows))
    assert bitwise_equal(ref, out)
    assert len(_sites(report, "kept")) == 1


def test_a_member_the_kernel_would_refuse_is_left_out_of_the_group():
    # 36 rows of bf16 do not end on a 16-byte boundary: that linear stays eager's, the other two are grouped
    torch._dynamo.reset()
    ref, out, report = compile_and_run(_Modulations(rows_of=(64, 36, 32)), _inputs())
    assert bitwise_equal(ref, out) and len(_sites(report, "kept")) == 1
    graph = _rewritten_graph(_Modulations(rows_of=(64, 36, 32)), _inputs())
    (op,) = [n for n in graph.nodes if n.target is torch.ops.diffusion_fuse.grouped_gemv.default]
    assert [w.meta["val"].shape[0] for w in op.args[1]] == [64, 32]


def test_seventeen_rows_are_not_a_gemv():
    torch._dynamo.reset()
    ref, out, report = compile_and_run(_Modulations(), _inputs(17))
    assert bitwise_equal(ref, out) and not _sites(report)


def test_fp32_linears_are_left_to_aten():
    torch._dynamo.reset()
    ref, out, report = compile_and_run(_Modulations(dtype=torch.float32), _inputs(dtype=torch.float32))
    assert bitwise_equal(ref, out) and not _sites(report)


class _TwoLinears(torch.nn.Module):
    """Two bf16 linears ``a`` and ``b`` of 32 features to 64; each subclass's forward says how they are fed."""

    def __init__(self, dim=32, bias=True):
        super().__init__()
        self.a = torch.nn.Linear(dim, 64, bias=bias, dtype=torch.bfloat16)
        self.b = torch.nn.Linear(dim, 64, bias=bias, dtype=torch.bfloat16)


class _ComputedWeight(_TwoLinears):
    """A weight computed in the forward (its address changes every call): not a member."""

    def forward(self, x, temb):
        s = torch.nn.functional.silu(temb)
        return self.a(s) + torch.nn.functional.linear(s, self.b.weight * 2, self.b.bias) + x.sum()


def test_a_computed_weight_is_not_grouped_and_a_group_of_one_is_not_made():
    torch._dynamo.reset()
    ref, out, report = compile_and_run(_ComputedWeight(), _inputs())
    assert bitwise_equal(ref, out) and not _sites(report)


class _ReturnedInputs(_TwoLinears):
    """Two linears of two silu(temb) that the forward also returns: eager gives two tensors."""

    def forward(self, x, temb):
        s1 = torch.nn.functional.silu(temb)
        s2 = torch.nn.functional.silu(temb)
        return self.a(s1) + x.sum(), self.b(s2), s1, s2


def test_returned_copies_are_not_merged_into_one_tensor():
    torch._dynamo.reset()
    ref, out, report = compile_and_run(_ReturnedInputs(), _inputs())
    assert bitwise_equal(ref, out) and not _notes(report)
    assert out[2].data_ptr() != out[3].data_ptr()
    out[2].mul_(0)  # the caller owns each output: changing one must leave the other as it was
    assert torch.equal(out[3], ref[3])


class _SignedZero(_TwoLinears):
    """``x + 0.0`` and ``x + -0.0`` look alike to ``==`` but differ on -0.0 inputs: not one op."""

    def forward(self, x, temb):
        u = temb + (-0.0)
        return self.a(temb + 0.0), self.b(u), u * x


def test_scalars_equal_by_value_but_not_by_bits_are_not_merged():
    torch._dynamo.reset()
    kwargs = {"x": torch.ones(1, 32, dtype=torch.bfloat16), "temb": -torch.zeros(1, 32, dtype=torch.bfloat16)}
    ref, out, report = compile_and_run(_SignedZero(bias=False), kwargs)
    assert bitwise_equal(ref, out) and not _notes(report)
    assert torch.signbit(out[2]).all()


def _rewritten_graph(model, kwargs) -> fx.Graph:
    from diffusion_fuse.config import Options
    from diffusion_fuse.fxpasses.pass_manager import PassManager

    (gm,) = capture_graphs(model, kwargs)
    PassManager(Options()).run(gm.graph)
    return gm.graph


def test_the_op_comes_before_every_reader_of_its_members():
    graph = _rewritten_graph(_Modulations(), _inputs())
    nodes = list(graph.nodes)
    (op,) = [n for n in nodes if n.target is torch.ops.diffusion_fuse.grouped_gemv.default]
    assert not any(n.target in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default) for n in nodes)
    pieces = [u for u in op.users]
    assert len(pieces) == 3 and all(nodes.index(u) > nodes.index(op) for p in pieces for u in p.users)
    x_in = op.args[0]
    assert x_in.target is torch.ops.aten.silu.default or x_in.op == "call_function"


def test_reference_lays_members_out_one_after_another():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 32, generator=g)
    ws = [torch.randn(8, 32, generator=g), torch.randn(16, 32, generator=g)]
    bs = [torch.randn(8, generator=g), None]
    flat = grouped_gemv(x, ws, bs)
    assert torch.equal(flat[:16].view(2, 8), torch.addmm(bs[0], x, ws[0].t()))
    assert torch.equal(flat[16:].view(2, 16), torch.mm(x, ws[1].t()))
