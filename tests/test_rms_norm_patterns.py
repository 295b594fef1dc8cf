"""Families rms_norm (lossless, ``aten._fused_rms_norm``) and rms_norm_chain (tier high, pow → mean → rsqrt).

On a CPU build ``_fused_rms_norm`` has no kernel, so AOTAutograd decomposes it into the chain;
on CUDA it has one and the graph keeps the op. The fixture ``fused_rms_norm_kernel_on_cpu``
gives it a CPU kernel (its own decomposition) so that CPU graphs hold the op as CUDA graphs do.
On CPU every op call takes its reference path: equality with eager here checks the matchers,
the rewrite and the reference impls; the kernels are checked in tests/kernels/test_rms_norm.py
(interpreter) and tests/gpu/test_rms_norm_gpu.py.
"""

from __future__ import annotations

import collections

import pytest
import torch
from diffusers.models.normalization import RMSNorm
from torch._dynamo.backends.common import aot_autograd

import diffusion_fuse
from diffusion_fuse.fxpasses import PassManager
from diffusion_fuse.lowering.rms_norm import row_layout, rms_norm_chain_tail
from diffusion_fuse.testing.tiny_models import build
from helpers import bitwise_equal, compile_and_run
from test_models_lossless import expected

R, C, RR, RCR = "rms_norm", "rms_norm_chain", "rms_norm_rope", "rms_norm_cat_rope"
# torch.nn.RMSNorm QK norms (FLUX/FLUX.2: norm_q/k and norm_added_q/k of the double block, norm_q/k
# of the single block; Wan: attn1 and attn2 norm_q/k) and diffusers RMSNorm chains (`python -m diffusion_fuse census`).
FUSED_SITES = {"flux": 6, "flux2": 6, "wan21": 4, "wan22_ti2v": 4}
# of which RoPE follows the norm directly (family rms_norm_rope): the single block's q and k; and of which the
# double block's text and image norms are cat, then RoPE'd (family rms_norm_cat_rope: one site per two norms)
ROPE_SITES = {"flux": 2, "flux2": 2, "wan21": 0, "wan22_ti2v": 0}
CAT_ROPE_SITES = {"flux": 2, "flux2": 2, "wan21": 0, "wan22_ti2v": 0}
CHAIN_SITES = {"flux": 6, "flux2": 6, "wan21": 4, "wan22_ti2v": 4, "sana": 1, "qwen_image": 5, "sd35": 10}


@pytest.fixture
def fused_rms_norm_kernel_on_cpu():
    from torch._decomp.decompositions import _fused_rms_norm

    ops = (torch.ops.aten._fused_rms_norm.default, torch.ops.aten.rms_norm.default)
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_fused_rms_norm", lambda x, shape, w, eps: _fused_rms_norm(x, shape, w, eps), "CPU")
    for op in ops:  # the Python dispatcher caches per dispatch key whether to decompose
        op._dispatch_cache.clear()
    yield
    lib._destroy()
    for op in ops:
        op._dispatch_cache.clear()


def rewrite_high(model, *args, **kwargs):
    """Trace ``model`` to the ATen graph the backend sees (no decompositions), rewrite it with the
    tier-high families and run both: (pass context, ATen graph output, rewritten graph output, rewritten graph)."""
    got = {}

    def compiler(gm, _):
        fused, ctx = PassManager(diffusion_fuse.parse_options({"quality": "high"})).rewrite(gm)
        got.update(ctx=ctx, fused=fused)

        def run(*a):
            got["ref"], got["out"] = gm(*a), fused(*a)
            return got["ref"]

        return run

    with torch.no_grad():
        torch.compile(model, backend=aot_autograd(fw_compiler=compiler, inference_compiler=compiler),
                      fullgraph=True)(*args, **kwargs)
    return got["ctx"], got["ref"], got["out"], got["fused"]


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


# ----------------------------------------------------------------------------------------
# lowering helpers
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


def test_chain_tail_dtypes_follow_eager_promotion():
    w16, w32 = torch.ones(4, dtype=torch.bfloat16), torch.ones(4)
    sc = torch.ones(1, 4, dtype=torch.bfloat16)
    tail, final = rms_norm_chain_tail(torch.bfloat16, w16, None, None, sc, sc, None)
    assert (tail.c1, tail.w, tail.t, tail.u, tail.v, final) == (torch.bfloat16,) * 6
    tail, final = rms_norm_chain_tail(None, w32, None, torch.bfloat16, None, None, None)
    assert (tail.c1, tail.w, tail.c2, final) == (None, torch.float32, torch.bfloat16, torch.bfloat16)
    tail, final = rms_norm_chain_tail(torch.bfloat16, w32, None, None, sc, None, torch.bfloat16)
    assert (tail.w, tail.u, tail.v, final) == (torch.float32, torch.float32, None, torch.bfloat16)


# ----------------------------------------------------------------------------------------
# rms_norm_rope: the norm feeding diffusers' apply_rotary_emb only
# ----------------------------------------------------------------------------------------


class NormRope(torch.nn.Module):
    """FLUX single-block q: RMSNorm over head_dim, then apply_rotary_emb along the sequence dim."""

    def __init__(self, D=32, affine=True, also_read_norm=False):
        super().__init__()
        self.norm = torch.nn.RMSNorm(D, eps=1e-6, elementwise_affine=affine)
        if affine:
            with torch.no_grad():
                self.norm.weight.normal_()
        self.also_read_norm = also_read_norm

    def forward(self, x, cos, sin):
        from diffusers.models.embeddings import apply_rotary_emb

        y = self.norm(x)
        out = apply_rotary_emb(y, (cos, sin), sequence_dim=1)
        return (out, y * 2) if self.also_read_norm else out


def _rope_inputs(dtype, B=2, S=7, H=3, D=32):
    g = torch.Generator().manual_seed(3)
    pos = torch.randn(S, D // 2, generator=g).double() * 20
    cos, sin = (f(pos).repeat_interleave(2, dim=1).float() for f in (torch.cos, torch.sin))
    return torch.randn(B, S, H, D, generator=g).to(dtype), cos, sin


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_norm_then_rope_is_one_site(fused_rms_norm_kernel_on_cpu, dtype, affine):
    model = NormRope(affine=affine).to(dtype)
    args = _rope_inputs(dtype)
    report = _assert_compiled_equals_eager(model, args)
    (site,) = report.sites()
    assert site.pattern == RR and site.status == "kept", report.table()
    casts = [] if dtype == torch.float32 else ["_to_copy"]
    assert site.before[:2] == ["_fused_rms_norm", "getitem"] and site.before.count("_to_copy") == 3 * len(casts)
    assert {"unbind.int", "neg", "stack", "add.Tensor"} <= set(site.before), site.before


def test_norm_read_elsewhere_stays_an_rms_norm_site(fused_rms_norm_kernel_on_cpu):
    model = NormRope(also_read_norm=True).to(torch.bfloat16)
    args = _rope_inputs(torch.bfloat16)
    report = _assert_compiled_equals_eager(model, args)
    assert report.count(RR) == 0 and report.count(R) == 1, report.table()


class NormCatRope(torch.nn.Module):
    """FLUX double-block q: text and image RMSNorms, cat along the sequence, then apply_rotary_emb."""

    def __init__(self, D=32, read_text_norm=False):
        super().__init__()
        self.norm_img = torch.nn.RMSNorm(D, eps=1e-6)
        self.norm_txt = torch.nn.RMSNorm(D, eps=1e-5)
        with torch.no_grad():
            self.norm_img.weight.normal_()
            self.norm_txt.weight.normal_()
        self.read_text_norm = read_text_norm

    def forward(self, x_img, x_txt, cos, sin):
        from diffusers.models.embeddings import apply_rotary_emb

        t = self.norm_txt(x_txt)
        q = torch.cat([t, self.norm_img(x_img)], dim=1)
        out = apply_rotary_emb(q, (cos, sin), sequence_dim=1)
        return (out, t + 1) if self.read_text_norm else out


def _cat_rope_inputs(dtype, S_img=7, S_txt=3):
    x, cos, sin = _rope_inputs(dtype, S=S_img + S_txt)
    return x[:, :S_img].contiguous(), x[:, S_img:].contiguous(), cos, sin


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_norms_cat_then_rope_is_one_site(fused_rms_norm_kernel_on_cpu, dtype):
    report = _assert_compiled_equals_eager(NormCatRope().to(dtype), _cat_rope_inputs(dtype))
    (site,) = report.sites()
    assert site.pattern == RCR and site.status == "kept", report.table()
    assert site.before.count("_fused_rms_norm") == 2 and "cat" in site.before


def test_cat_of_a_norm_read_elsewhere_is_not_one_site(fused_rms_norm_kernel_on_cpu):
    report = _assert_compiled_equals_eager(NormCatRope(read_text_norm=True).to(torch.bfloat16),
                                           _cat_rope_inputs(torch.bfloat16))
    assert report.count(RCR) == 0 and report.count(R) == 2, report.table()
