"""diffusion_fuse::norm_modulate on CUDA: bitwise equal to eager's ATen chain, or routed to it.

The matrix: D in {64, 1000, 1536, 2240, 3072, 5120, 6144}, rows 1..75,600, batch 1
and 2, amplitudes 1e-4/1/100, eps 1e-6/1e-5, scale entries exactly -1, 0, 1 and signed zeros;
FLUX bf16 form (with/without shift, affine), fp16, Wan FP32LayerNorm form with [B,1,D] and
per-token strided [B,S,D] modulation. Rows normalized in 16 bits run the kernel with its cache hints,
fp32 rows without (kernels/norm_modulate.py ``use_cache_hints``): both launches are in the matrix.
Compares ``.view(int16/int32)``. Prints a summary table; writes $OUT/norm_modulate_gpu.json when $OUT is set.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from diffusion_fuse.lowering import counters  # noqa: E402
from diffusion_fuse.lowering.norm_modulate import SPEC, can_use_norm_modulate, norm_modulate  # noqa: E402

DIMS = (64, 1000, 1536, 2240, 3072, 5120, 6144)
FORMS = {
    # name: (x dtype, ln_dtype, out_dtype, modulation layout, shift, affine)
    "flux_bf16": (torch.bfloat16, None, None, "b1d", True, False),
    "flux_no_shift": (torch.bfloat16, None, None, "b1d", False, False),
    "affine_bf16": (torch.bfloat16, None, None, "b1d", True, True),
    "fp16": (torch.float16, None, None, "b1d", True, False),
    "fp32": (torch.float32, None, None, "b1d", True, False),
    "wan_fp32_ln": (torch.bfloat16, torch.float32, torch.bfloat16, "b1d", True, False),
    "wan22_per_token": (torch.bfloat16, torch.float32, torch.bfloat16, "per_token", True, False),
}
RESULTS: list[dict] = []


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def make(form, B, S, D, amp, seed, special=False):
    dtype, ln_dtype, _, layout, shift, affine = FORMS[form]
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(B, S, D, device="cuda", generator=g) * amp
         + amp * torch.randn(B, S, 1, device="cuda", generator=g)).to(dtype)
    md = torch.float32 if ln_dtype is not None else dtype
    if layout == "b1d":
        sc = torch.randn(B, 1, D, device="cuda", generator=g).to(md)
        sh = torch.randn(B, 1, D, device="cuda", generator=g).to(md)
    else:
        table = torch.randn(B, S, 6, D, device="cuda", generator=g).to(md)
        sc, sh = table[:, :, 1], table[:, :, 0]
    if special:  # exactly -1, 0, 1 and signed zeros in scale and shift
        vals = torch.tensor([-1.0, 0.0, 1.0, -0.0], device="cuda", dtype=md)
        idx = torch.arange(D, device="cuda") % 8
        pick = vals[idx % 4]
        sc[..., idx < 4] = pick[idx < 4]
        sh[..., idx >= 4] = pick[idx >= 4]
        x[..., :4] = torch.tensor([0.0, -0.0, 1.0, -1.0], device="cuda", dtype=dtype)
    ln_in = ln_dtype or dtype
    w = (1 + 0.3 * torch.randn(D, device="cuda", generator=g)).to(ln_in) if affine else None
    b = (0.1 * torch.randn(D, device="cuda", generator=g)).to(ln_in) if affine else None
    return x, w, b, sc, (sh if shift else None)


def check(form, B, S, D, amp, eps, seed=0, special=False):
    """Mismatching elements of the kernel's output (what the op launches for this layout) against eager's."""
    _, ln_dtype, out_dtype, *_ = FORMS[form]
    x, w, b, sc, sh = make(form, B, S, D, amp, seed, special)
    args = (x, w, b, eps, sc, sh, ln_dtype, out_dtype)
    ok, why = can_use_norm_modulate(SPEC.bind(args))
    assert ok, why
    ref = norm_modulate(*args)
    got = SPEC.run_kernel(*args)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    ndiff = int((_bits(ref) != _bits(got)).sum())
    RESULTS.append(dict(form=form, B=B, S=S, D=D, amp=amp, eps=eps, special=special, ndiff=ndiff,
                        numel=ref.numel()))
    return ndiff


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("D", DIMS)
def test_bit_exact_matrix(form, D):
    bad = []
    for B, S in ((1, 1), (1, 7), (2, 333), (1, 4096)):
        for amp in (1e-4, 1.0, 100.0):
            for eps in (1e-6, 1e-5):
                for special in (False, True):
                    n = check(form, B, S, D, amp, eps, seed=D + S, special=special)
                    if n:
                        bad.append((B, S, amp, eps, special, n))
    assert not bad, f"{form} D={D}: (B, S, amp, eps, special, ndiff) {bad[:6]}"


@pytest.mark.parametrize("form", ["flux_bf16", "fp32", "wan_fp32_ln"])
def test_zero_eps_with_a_subnormal_variance(form):
    # var + eps subnormal (values ~1e-20, eps 0): eager's rsqrtf (nvcc, no -ftz) gives a finite rstd, where
    # rsqrt.approx.ftz (libdevice with Triton's default FTZ reflect; launch.EAGER_NUMERICS turns it off) gives inf
    assert check(form, 1, 64, 3072, 1e-20, 0.0, seed=5) == 0


@pytest.mark.parametrize("layout", ["strided_rows", "transposed"])
def test_non_contiguous_x_is_exact_without_a_copy(layout):
    # SANA's norm1 reads a transposed patch embedding; eager copies it, the kernel reads it in place.
    x, _, _, sc, sh = make("flux_bf16", 2, 300, 1536, 1.0, 3)
    if layout == "strided_rows":
        xv = torch.cat([x, x], dim=1)[:, ::2]
    else:
        xv = x.transpose(1, 2).contiguous().transpose(1, 2)
    args = (xv, None, None, 1e-6, sc, sh, None, None)
    assert not xv.is_contiguous() and can_use_norm_modulate(SPEC.bind(args))[0]
    ref = norm_modulate(*args)
    got = SPEC.run_kernel(*args)
    assert torch.equal(_bits(ref), _bits(got))


@pytest.mark.parametrize("form, B, S, D", [
    ("flux_bf16", 1, 4608, 3072),
    ("wan_fp32_ln", 1, 32760, 5120),
    ("wan22_per_token", 1, 27280, 3072),
    ("flux_bf16", 2, 75600, 1536),
])
def test_bit_exact_real_shapes(form, B, S, D):
    assert check(form, B, S, D, 1.0, 1e-6, seed=1) == 0


def test_guard_routes_what_the_kernel_cannot_take():
    x, _, _, sc, sh = make("flux_bf16", 1, 64, 3072, 1.0, 0)
    buf = torch.empty(x.numel() + 8, dtype=x.dtype, device="cuda")
    unaligned = buf[1:1 + x.numel()].view(x.shape)
    unaligned.copy_(x)
    cases = {
        "unsupported dtype": (x.double(), sc.double(), sh.double()),
        "D=3070": (x[..., :3070].contiguous(), sc[..., :3070], sh[..., :3070]),
        "x is not 16-byte aligned": (unaligned, sc, sh),
    }
    for reason, (xx, ss, hh) in cases.items():
        counters.reset()
        out = torch.ops.diffusion_fuse.norm_modulate(xx, None, None, 1e-6, ss, hh, None, None)
        ref = norm_modulate(xx, None, None, 1e-6, ss, hh, None, None)
        assert torch.equal(_bits(out), _bits(ref))
        fb = counters.snapshot()["fallback"]["norm_modulate"]
        assert list(fb)[0].startswith(reason), fb


@pytest.mark.parametrize("form", ["flux_bf16", "wan22_per_token", "affine_bf16"])
def test_registered_op_repeated_calls_are_exact(form):
    # The op launches a layout's compiled kernel directly after the first call.
    _, ln_dtype, out_dtype, *_ = FORMS[form]
    for seed in range(4):
        x, w, b, sc, sh = make(form, 2, 300, 3072, 10.0 ** (seed - 2), seed)
        out = torch.ops.diffusion_fuse.norm_modulate(x, w, b, 1e-6, sc, sh, ln_dtype, out_dtype)
        ref = norm_modulate(x, w, b, 1e-6, sc, sh, ln_dtype, out_dtype)
        assert torch.equal(_bits(out), _bits(ref)), seed


def test_cuda_graph_capture_and_replay_after_input_mutation():
    x, _, _, sc, sh = make("flux_bf16", 1, 512, 3072, 1.0, 0)
    op = torch.ops.diffusion_fuse.norm_modulate
    op(x, None, None, 1e-6, sc, sh, None, None)  # warm-up compiles the kernel
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = op(x, None, None, 1e-6, sc, sh, None, None)
    for seed in range(3):
        x2, _, _, sc2, sh2 = make("flux_bf16", 1, 512, 3072, 10.0 ** seed, seed + 5)
        x.copy_(x2), sc.copy_(sc2), sh.copy_(sh2)
        g.replay()
        torch.cuda.synchronize()
        ref = norm_modulate(x, None, None, 1e-6, sc, sh, None, None)
        assert torch.equal(_bits(out), _bits(ref))


def teardown_module(module):
    total = len(RESULTS)
    bad = [r for r in RESULTS if r["ndiff"]]
    by_form = {}
    for r in RESULTS:
        f = by_form.setdefault(r["form"], [0, 0])
        f[0] += 1
        f[1] += bool(r["ndiff"])
    print("\nnorm_modulate bit-exactness vs eager (cases, mismatching cases):")
    for form, (n, nb) in by_form.items():
        print(f"  {form:44s} {n:5d} {nb:5d}")
    print(f"  total {total} cases, {len(bad)} with mismatches")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "norm_modulate_gpu.json"), "w") as f:
            json.dump({"cases": RESULTS, "mismatching": bad}, f)
