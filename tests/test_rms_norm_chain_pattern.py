"""Family rms_norm_chain (tier high, not exact): the pow → mean → rsqrt chain of diffusers' RMSNorm and PyTorch's
composite rms_norm as one op; on the CPU every op call takes its reference path."""

from __future__ import annotations

import collections

import pytest
import torch
from diffusers.models.normalization import RMSNorm
from helpers import bitwise_equal, rewrite_high
from test_rms_norm_pattern import CHAIN_SITES, RmsModulate, _mod_inputs

import diffusion_fuse
from diffusion_fuse.kernels.rms_norm import rms_norm_chain_tail
from diffusion_fuse.testing.tiny_models import build

C = "rms_norm_chain"


# ----------------------------------------------------------------------------------------
# rms_norm_chain: the forms (pass level) and the tiny models (tier high)
# ----------------------------------------------------------------------------------------


class DiffusersRms(torch.nn.Module):
    def __init__(self, D=32, affine=True, bias=False, modulate=False, transposed=False):
        super().__init__()
        self.norm = RMSNorm(D, eps=1e-6, elementwise_affine=affine, bias=bias)
        with torch.no_grad():
            for p in self.norm.parameters():
                p.normal_()
        self.modulate, self.transposed = modulate, transposed

    def forward(self, x, scale, shift):
        if self.transposed:  # SD3.5's attention: [B, S, H, Dh] → [B, H, S, Dh], a strided view
            x = x.unflatten(-1, (2, -1)).transpose(1, 2)
        y = self.norm(x)
        return y * (1 + scale) + shift if self.modulate else y


CHAIN_FORMS = {
    # name: (module kwargs, model dtype, param dtype, expected chain tail (cast1, weight, bias, cast2))
    "diffusers_bf16_weight": (dict(), torch.bfloat16, None, (torch.bfloat16, True, False, None)),
    "diffusers_fp32": (dict(), torch.float32, None, (None, True, False, None)),
    "diffusers_fp32_weight_bf16_x": (dict(), torch.bfloat16, torch.float32, (None, True, False, None)),
    "diffusers_no_weight": (dict(affine=False), torch.bfloat16, None, (torch.bfloat16, False, False, None)),
    "diffusers_bias": (dict(bias=True), torch.bfloat16, None, (torch.bfloat16, True, True, None)),
    "ltx_modulate": (dict(affine=False, modulate=True), torch.bfloat16, None, (torch.bfloat16, False, False, None)),
    "sd35_transposed": (dict(D=16, transposed=True), torch.bfloat16, None, (torch.bfloat16, True, False, None)),
    "composite_rms_norm": ("torch", torch.bfloat16, torch.float32, (None, True, False, torch.bfloat16)),
}


@pytest.mark.parametrize("form", sorted(CHAIN_FORMS))
def test_rms_norm_chain_forms_are_one_site_equal_through_the_reference(form):
    kw, dtype, pdtype, (cast1, has_w, has_b, cast2) = CHAIN_FORMS[form]
    if kw == "torch":  # weight dtype != input dtype: PyTorch runs rms_norm_composite (on CUDA too)
        model = RmsModulate(D=32, modulate=False).to(pdtype)
    else:
        model = DiffusersRms(**kw).to(dtype)
        if pdtype is not None:
            model.norm.to(pdtype)
    args = _mod_inputs(dtype, S=5, D=32)
    ctx, ref, out, fused = rewrite_high(model, *args)
    (site,) = ctx.sites
    assert site.pattern == C and not site.exact
    (node,) = [n for n in fused.graph.nodes if n.target is torch.ops.diffusion_fuse.rms_norm_chain.default]
    x, eps, c1, w, b, c2, scale, shift, out_dtype = node.args
    assert (c1, w is not None, b is not None, c2) == (cast1, has_w, has_b, cast2)
    assert eps == pytest.approx(1e-6) and (scale is not None) == ("modulate" in str(kw))
    assert not any(n.target in (torch.ops.aten.rsqrt.default, torch.ops.aten.pow.Tensor_Scalar)
                   for n in fused.graph.nodes)
    assert bitwise_equal(ref, out)  # on CPU the op runs the chain itself


def test_rms_norm_chain_near_misses_and_non_matches():
    class Chain(torch.nn.Module):
        def __init__(self, dim=-1, power=2, share_rsqrt=False):
            super().__init__()
            self.dim, self.power, self.share = dim, power, share_rsqrt

        def forward(self, x):
            r = torch.rsqrt(x.float().pow(self.power).mean(self.dim, keepdim=True) + 1e-6)
            y = x * r
            return (y, r) if self.share else y

    x = torch.randn(2, 8, 16, dtype=torch.bfloat16)
    for kw, reason in ((dict(dim=1), "mean over dims [1]"), (dict(power=3), None),
                       (dict(share_rsqrt=True), "rsqrt is not read by one mul")):
        ctx = rewrite_high(Chain(**kw), x)[0]
        assert ctx.sites == []
        misses = [m.reason for m in ctx.near_misses if m.pattern == C]
        assert (misses == []) if reason is None else (len(misses) == 1 and misses[0].startswith(reason)), misses


@pytest.mark.parametrize("name, dtype", [("qwen_image", torch.bfloat16), ("sana", torch.float32)])
def test_rms_norm_chain_sites_of_the_tiny_models(name, dtype):
    # flux, wan22_ti2v and sd35 (fp32) go through Inductor in tests/test_high_tier.py with these counts
    model, kwargs = build(name, dtype)
    ctx, ref, out, _ = rewrite_high(model, **kwargs)
    assert bitwise_equal(ref, out)  # on CPU the op runs the chain itself
    assert collections.Counter(s.pattern for s in ctx.sites)[C] == CHAIN_SITES[name]
    assert not [m for m in ctx.near_misses if m.pattern == C]


def test_tier_high_marks_chain_sites_non_exact_in_the_report():
    model = DiffusersRms(D=64, modulate=True).to(torch.bfloat16)
    args = _mod_inputs(torch.bfloat16)
    report = diffusion_fuse.Report()
    with torch.no_grad():
        ref = model(*args)
        out = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend({"quality": "high"}, report))(*args)
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    (site,) = report.sites()
    assert (site.pattern, site.tier, site.exact, site.status) == (C, "high", False, "kept")
    assert site.verdict.startswith("within tolerance")
    assert "within tolerance" in report.table()
    (rec,) = [s for g in report.to_dict()["graphs"] for s in g["sites"].values()]
    assert rec["exact"] is False and rec["tier"] == "high"
    assert "tier high, within tolerance" in report.to_html()
    assert report.graphs[0].inductor_sites == [site.id]  # matched inside Inductor's post-grad graph too


def test_chain_tail_dtypes_follow_eager_promotion():
    w16, w32 = torch.ones(4, dtype=torch.bfloat16), torch.ones(4)
    sc = torch.ones(1, 4, dtype=torch.bfloat16)
    tail, final = rms_norm_chain_tail(torch.bfloat16, w16, None, None, sc, sc, None)
    assert (tail.c1, tail.w, tail.t, tail.u, tail.v, final) == (torch.bfloat16,) * 6
    tail, final = rms_norm_chain_tail(None, w32, None, torch.bfloat16, None, None, None)
    assert (tail.c1, tail.w, tail.c2, final) == (None, torch.float32, torch.bfloat16, torch.bfloat16)
    tail, final = rms_norm_chain_tail(torch.bfloat16, w32, None, None, sc, None, torch.bfloat16)
    assert (tail.w, tail.u, tail.v, final) == (torch.float32, torch.float32, None, torch.bfloat16)
