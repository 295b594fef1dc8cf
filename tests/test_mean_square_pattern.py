"""Family mean_square (patterns/mean_square.py) through the backend on CPU: which chains become sites, and that
the output is eager's (the op's reference path runs on CPU; the kernel's order is
tests/kernels/test_mean_square_kernel.py's
and tests/gpu/test_mean_square_gpu.py's)."""

from __future__ import annotations

import collections

import pytest
import torch
from helpers import bitwise_equal

import diffusion_fuse
from diffusion_fuse.testing.pointwise import rms_norm_explicit
from diffusion_fuse.testing.tiny_models import QKNorm


def _compile(model, x, options=None):
    report = diffusion_fuse.Report()
    torch._dynamo.reset()
    with torch.no_grad():
        ref = model(x)
        out = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(options, report))(x)
    return ref, out, report


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [96, 2048])  # QK norms over a head, and over the hidden size
def test_diffusers_rms_norm_variance_is_one_site(dtype, head_dim):
    model = QKNorm(3, head_dim).to(dtype)
    x = torch.randn(2, 20, 3 * head_dim).to(dtype)
    ref, out, report = _compile(model, x)
    assert bitwise_equal(ref, out)
    counts = collections.Counter(s.pattern for s in report.sites())
    assert counts["mean_square"] == 1, report.table()
    (site,) = [s for s in report.sites() if s.pattern == "mean_square"]
    assert site.status == "kept" and site.after == "diffusion_fuse::mean_square"
    # the cast and the squares are the site's (bf16: _to_copy, pow, mean; fp32: pow, mean); the tail is pointwise's
    assert ("_to_copy" in " ".join(site.before)) == (dtype == torch.bfloat16), site.before
    assert counts["pointwise"] == 1, report.table()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_a_variance_its_tail_reads_on_every_element_is_left_to_the_tails_kernel(dtype, head_dim):
    """Rows a generated kernel's program can hold (patterns/mean_square.py ``tail_reads_rows``): the whole norm,
    cast, squares and mean included, is one pointwise site, and no mean_square site is made."""
    model = QKNorm(3, head_dim).to(dtype)
    ref, out, report = _compile(model, torch.randn(2, 20, 3 * head_dim).to(dtype))
    assert bitwise_equal(ref, out)
    assert [s.pattern for s in report.sites()] == ["pointwise"], report.table()
    (pw,) = report.sites("kept")
    assert {"pow.Tensor_Scalar", "mean.dim", "rsqrt"} <= set(pw.before), pw.before
    assert ("_to_copy" in " ".join(pw.before)) == (dtype == torch.bfloat16), pw.before
    # fewer than 16 rows sum in another order (a wider block): the mean_square family's, whose guard sends them to
    # the reference path
    _, _, report = _compile(model, torch.randn(1, 5, 3 * head_dim).to(dtype))
    assert "mean_square" in [s.pattern for s in report.sites()], report.table()
    # with the pointwise family off, mean_square takes the variance (it yields to pointwise only while searched)
    ref, out, report = _compile(model, torch.randn(2, 20, 3 * head_dim).to(dtype), {"patterns": {"pointwise": False}})
    assert bitwise_equal(ref, out) and [s.pattern for s in report.sites()] == ["mean_square"], report.table()


class UpcastRMSNorm(torch.nn.Module):
    """The norm as Llama-style code spells it: one fp32 copy of x read by the squares and by the scaling."""

    def __init__(self, d: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * self.weight.to(x.dtype)


@pytest.mark.parametrize("d", [96, 2048])
def test_a_cast_the_tail_also_reads_is_read_by_no_one(d):
    """The variance reads x in bf16 and the pointwise pass folds the shared cast into the tail: no fp32 copy of x
    is left to run eagerly."""
    x = torch.randn(2, 20, d).bfloat16()
    ref, out, report = _compile(UpcastRMSNorm(d).bfloat16().eval(), x)
    assert bitwise_equal(ref, out)
    (ms,) = [s for s in report.sites("kept") if s.pattern == "mean_square"]
    assert ms.input_shapes == [f"bfloat16[2, 20, {d}]"] and ms.before == ["pow.Tensor_Scalar", "mean.dim"], ms
    (pw,) = [s for s in report.sites("kept") if s.pattern == "pointwise"]
    assert "_to_copy" in pw.before, pw.before
    left = [op for g in report.graphs for op in g.final_ops if "_to_copy" in op]
    assert not left, left


@pytest.mark.parametrize("head_dim", [16, 130])  # shorter than a warp; not vectorized, longer than 128
def test_a_head_dim_the_kernel_cannot_take_is_left_to_the_pointwise_pass(head_dim):
    model = QKNorm(2, head_dim).to(torch.bfloat16)
    ref, out, report = _compile(model, torch.randn(1, 20, 2 * head_dim).bfloat16())
    assert bitwise_equal(ref, out)
    assert not [s for s in report.sites() if s.pattern == "mean_square"]


def test_off_in_tier_high_and_by_option():
    model = QKNorm(2, 96).to(torch.bfloat16)
    x = torch.randn(1, 20, 192).bfloat16()
    _, _, report = _compile(model, x, {"quality": "high"})
    assert not [s for s in report.sites() if s.pattern == "mean_square"]  # rms_norm_chain takes the whole norm
    ref, out, report = _compile(model, x, {"patterns": {"mean_square": False}})
    assert bitwise_equal(ref, out) and not [s for s in report.sites() if s.pattern == "mean_square"]


def test_a_symbolic_row_size_is_left_to_the_guard():
    """A dynamic-shape graph whose row size is symbolic: the static guard leaves it to the call's guard, and the
    graph's passes run (a pass that raises leaves the graph as traced, with a note)."""
    def variance(x):
        return x.float().pow(2).mean(-1, keepdim=True) * 2

    report = diffusion_fuse.Report()
    torch._dynamo.reset()
    compiled = torch.compile(variance, backend=diffusion_fuse.DiffusionFuseBackend(None, report), dynamic=True)
    x = torch.randn(4, 20, 96).bfloat16()
    assert bitwise_equal(variance(x), compiled(x))
    assert not [n for g in report.graphs for n in g.notes if "runs as traced" in n], report.table()
    assert [s.pattern for s in report.sites()].count("mean_square") == 1, report.table()


def _mean_of(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn)(*args)
    return next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mean.dim)


def _norm(x, w):  # (make_fx traces every parameter: eps stays a constant)
    return rms_norm_explicit(x, w)


def test_which_variances_the_tail_takes():
    from diffusion_fuse.patterns.mean_square import tail_reads_rows

    w = torch.ones(64).bfloat16()
    x = torch.randn(2, 20, 64).bfloat16()
    assert tail_reads_rows(_mean_of(_norm, x, w))
    assert tail_reads_rows(_mean_of(_norm, x.transpose(0, 1), w))  # rows of any order, unit stride along them
    for d in (16, 96, 2048):  # not a power of two from 32 to 1024
        assert not tail_reads_rows(_mean_of(_norm, torch.randn(2, 20, d).bfloat16(), torch.ones(d).bfloat16()))
    assert not tail_reads_rows(_mean_of(_norm, torch.randn(1, 15, 64).bfloat16(), w))  # fewer than 16 rows

    def also_returns_the_variance(x):
        v = x.float().pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(v + 1e-6), v

    def scales_a_row_value(x):  # the rsqrt read at the mean's own size, not on every element of the row
        v = x.float().pow(2).mean(-1, keepdim=True)
        return torch.rsqrt(v + 1e-6) * v

    for fn in (also_returns_the_variance, scales_a_row_value):
        assert not tail_reads_rows(_mean_of(fn, x)), fn.__name__

