"""Families rms_norm (lossless, ``aten._fused_rms_norm``) and rms_norm_chain (tier high, pow → mean → rsqrt).

On a CPU build ``_fused_rms_norm`` has no kernel, so AOTAutograd decomposes it into the chain;
on CUDA it has one and the graph keeps the op. The fixture ``fused_rms_norm_kernel_on_cpu``
gives it a CPU kernel (its own decomposition) so that CPU graphs hold the op as CUDA graphs do.
On CPU every op call takes its reference path: equality with eager here checks the matchers,
the rewrite and the reference impls; the kernels are checked in tests/kernels/test_rms_norm_kernel.py
(interpreter) and tests/gpu/test_rms_norm_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
from helpers import bitwise_equal, compile_and_run
from test_models_lossless import expected

import diffusion_fuse
from diffusion_fuse.kernels.rows import row_layout
from diffusion_fuse.testing.tiny_models import build

R, C, RR, RCR = "rms_norm", "rms_norm_chain", "rms_norm_rope", "rms_norm_cat_rope"
# torch.nn.RMSNorm QK norms (FLUX/FLUX.2: norm_q/k and norm_added_q/k of the double block, norm_q/k
# of the single block; Wan: attn1 and attn2 norm_q/k) and diffusers RMSNorm chains (`python -m diffusion_fuse census`).
FUSED_SITES = {"flux": 6, "flux2": 6, "wan21": 4, "wan22_ti2v": 4}
# of which RoPE follows the norm directly (family rms_norm_rope): the single block's q and k; and of which the
# double block's text and image norms are cat, then RoPE'd (family rms_norm_cat_rope: one site per two norms)
ROPE_SITES = {"flux": 2, "flux2": 2, "wan21": 0, "wan22_ti2v": 0}
CAT_ROPE_SITES = {"flux": 2, "flux2": 2, "wan21": 0, "wan22_ti2v": 0}
CHAIN_SITES = {"flux": 6, "flux2": 6, "wan21": 4, "wan22_ti2v": 4, "sana": 1, "qwen_image": 5, "sd35": 10}


# ----------------------------------------------------------------------------------------
# rms_norm: tiny models and forms, as CUDA graphs hold them
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, dtype", [("flux", torch.bfloat16), ("flux2", torch.float32),
                                         ("wan22_ti2v", torch.bfloat16)])
def test_qk_norms_of_tiny_models_are_sites_and_the_output_is_eager(fused_rms_norm_kernel_on_cpu, name, dtype):
    model, kwargs = build(name, dtype)
    ref, out, report = compile_and_run(model, kwargs)
    assert bitwise_equal(ref, out)
    assert report.count(R) + report.count(RR) + 2 * report.count(RCR) == FUSED_SITES[name], report.table()
    assert report.count(RR) == ROPE_SITES[name] and report.count(RCR) == CAT_ROPE_SITES[name], report.table()
    sites = [s for s in report.sites() if s.pattern in (R, RR, RCR)]
    assert all(s.status == "kept" and s.exact and s.verdict == "bitwise equal" for s in sites), report.table()
    fams, _ = expected(name, dtype)  # every other family keeps its sites
    fams.pop("pointwise")  # (pointwise groups what is left: fewer ops once the norms are rms_norm sites)
    assert {f: report.count(f) for f in fams} == fams, report.table()
    fallback = report.counters()["fallback"]
    plain = FUSED_SITES[name] - ROPE_SITES[name] - 2 * CAT_ROPE_SITES[name]
    assert fallback.get("rms_norm", {}) == ({"device is cpu": 2 * plain} if plain else {})
    if ROPE_SITES[name]:
        assert fallback["rms_norm_rope"] == {"device is cpu": 2 * ROPE_SITES[name]}
        rope = [s for s in sites if s.pattern == RR]
        assert all(s.before[:4] == ["_fused_rms_norm", "getitem", "view", "unbind.int"] for s in rope), rope
    if CAT_ROPE_SITES[name]:
        assert fallback["rms_norm_cat_rope"] == {"device is cpu": 2 * CAT_ROPE_SITES[name]}
        cat = [s for s in sites if s.pattern == RCR]
        assert all(s.before[:6] == ["_fused_rms_norm", "getitem", "_fused_rms_norm", "getitem", "cat", "view"]
                   for s in cat), cat
    # the site is named by the model line that called the norm, not by torch's F.rms_norm
    assert {s.location.split("/")[-1] for s in sites} <= {
        "transformer_flux.py:102", "transformer_flux.py:103", "transformer_flux.py:110", "transformer_flux.py:111",
        "transformer_flux2.py:353", "transformer_flux2.py:354", "transformer_flux2.py:361", "transformer_flux2.py:362",
        "transformer_flux2.py:605", "transformer_flux2.py:606", "transformer_wan.py:95", "transformer_wan.py:96"}


class RmsModulate(torch.nn.Module):
    """torch.nn.RMSNorm [+ AdaLN modulate], as LTX/HiDream-style blocks write it."""

    def __init__(self, D=64, affine=True, eps=1e-6, modulate=True, cast=None, swapped=False, shape=None):
        super().__init__()
        self.norm = torch.nn.RMSNorm(shape or D, eps=eps, elementwise_affine=affine)
        if affine:
            with torch.no_grad():
                self.norm.weight.normal_()
        self.modulate, self.cast, self.swapped = modulate, cast, swapped

    def forward(self, x, scale, shift):
        y = self.norm(x)
        if self.modulate:
            y = (1 + scale) * y if self.swapped else y * (1 + scale)
            y = y + shift
            if self.cast is not None:
                y = y.to(self.cast)
        return y


def _mod_inputs(dtype, B=2, S=9, D=64, per_token=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, S, D, generator=g).to(dtype)
    sc, sh = (torch.randn(B, S if per_token else 1, D, generator=g).to(dtype) for _ in range(2))
    return x, sc, sh


def _assert_compiled_equals_eager(model, args) -> diffusion_fuse.Report:
    """Compile ``model`` with the lossless backend, check its output is eager's bit for bit; the report."""
    with torch.no_grad():
        ref = model(*args)
    report = diffusion_fuse.Report()
    with torch.no_grad():
        out = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)(*args)
    assert bitwise_equal(ref, out)
    return report


@pytest.mark.parametrize("form", [
    dict(), dict(affine=False), dict(modulate=False), dict(eps=None), dict(cast=torch.float32), dict(swapped=True),
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_rms_norm_forms(fused_rms_norm_kernel_on_cpu, form, dtype):
    model = RmsModulate(**form).to(dtype)
    args = _mod_inputs(dtype, per_token=dtype == torch.float32)
    report = _assert_compiled_equals_eager(model, args)
    (site,) = report.sites()
    assert site.pattern == R and site.status == "kept", report.table()
    befores = {"modulate": ["_fused_rms_norm", "getitem", "mul.Tensor", "add.Tensor"]}
    if form.get("modulate", True):
        cast = form.get("cast") not in (None, dtype)  # a cast to the dtype it has is no op in the graph
        assert site.before[:4] == befores["modulate"] and (site.before[4:] == ["_to_copy"]) == cast
    else:
        assert site.before == ["_fused_rms_norm", "getitem"]


def test_fused_rms_norm_near_misses(fused_rms_norm_kernel_on_cpu):
    class Rstd(torch.nn.Module):
        def forward(self, x):
            y, rstd = torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], None, 1e-6)
            return y * rstd

    x = torch.randn(2, 8, 16)
    for model, reason in ((Rstd(), "rstd output is used"),
                          (RmsModulate(D=16, shape=(8, 16), modulate=False), "normalized_shape [8, 16] spans")):
        torch._dynamo.reset()
        ref, out, report = compile_and_run(model, {"x": x} if isinstance(model, Rstd) else
                                           dict(x=x, scale=None, shift=None))
        assert bitwise_equal(ref, out) and report.sites() == []
        (miss,) = [m for g in report.graphs for m in g.near_misses]
        assert miss.pattern == R and miss.reason.startswith(reason), miss


# ----------------------------------------------------------------------------------------
# the row layout the norm kernels walk
# ----------------------------------------------------------------------------------------


def test_row_layout_merges_what_every_tensor_allows():
    # QK norm [B, S, H, Dh] contiguous: one row dim
    assert row_layout((2, 5, 3, 64), (960, 192, 64, 1), (960, 192, 64, 1)) == ((1, 1, 30), [(0, 0, 64), (0, 0, 64)])
    # SD3.5's transposed [B, H, S, Dh] view: three row dims
    assert row_layout((2, 3, 5, 64), (960, 64, 192, 1)) == ((2, 3, 5), [(960, 64, 192)])
    # a [B, 1, D] scale broadcast over S keeps B and S apart
    assert row_layout((2, 7, 64), (448, 64, 1), (64, 0, 1)) == ((1, 2, 7), [(0, 448, 64), (0, 64, 0)])
    # four unmergeable row dims: a permuted [7, 5, 3, 2, 8]
    assert row_layout((2, 3, 5, 7, 8), (8, 16, 48, 240, 1)) is None
