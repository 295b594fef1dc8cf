"""``diffusion_fuse::layer_norm`` on CUDA: the kernel's output bitwise equal (int16/int32 views) to eager's
``native_layer_norm`` (the op's reference) with its casts.

Forms: bf16, fp16 and fp32 LayerNorms with and without weight and bias, and the FP32LayerNorm form (bf16 x
normalized in fp32 with fp32 weight and bias, the output cast back to bf16); D in {16, 64, 72, 128, 1000, 1536,
3072, 5120} (up to 128: 16 rows a program), rows
1..4096, amplitudes 1e-4/1/100 with a per-row offset, eps 1e-6/1e-5; rank-4 rows (contiguous [B, H, S, D],
[B, S, H, D] transposed to [B, H, S, D] with B = 1 and 2, every other token) and strided rank-3 rows, through the
op (its counters show the kernel ran).
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from diffusion_fuse.lowering import counters  # noqa: E402
from diffusion_fuse.lowering.layer_norm import SPEC, can_use_layer_norm, layer_norm  # noqa: E402

DIMS = (16, 64, 72, 128, 1000, 1536, 3072, 5120)  # up to 128: the multi-row kernel (QK norms)
FORMS = {  # name: (x dtype, ln_dtype, out_dtype, weight, bias)
    "bf16": (torch.bfloat16, None, None, False, False),
    "bf16_affine": (torch.bfloat16, None, None, True, True),
    "bf16_weight_only": (torch.bfloat16, None, None, True, False),
    "fp16_affine": (torch.float16, None, None, True, True),
    "fp32": (torch.float32, None, None, False, False),
    "fp32_affine": (torch.float32, None, None, True, True),
    "fp32_layer_norm": (torch.bfloat16, torch.float32, torch.bfloat16, True, True),
    "fp32_layer_norm_plain": (torch.bfloat16, torch.float32, torch.bfloat16, False, False),
}


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def make(form, shape, amp, seed):
    dtype, ln_dtype, out_dtype, has_w, has_b = FORMS[form]
    g = torch.Generator(device="cuda").manual_seed(seed)
    D = shape[-1]
    x = (torch.randn(shape, device="cuda", generator=g) * amp
         + amp * torch.randn(*shape[:-1], 1, device="cuda", generator=g)).to(dtype)
    ln_in = ln_dtype or dtype
    w = (1 + 0.3 * torch.randn(D, device="cuda", generator=g)).to(ln_in) if has_w else None
    b = (0.1 * torch.randn(D, device="cuda", generator=g)).to(ln_in) if has_b else None
    return x, w, b, ln_dtype, out_dtype


def ndiff(x, w, b, eps, ln_dtype, out_dtype) -> int:
    args = (x, w, b, eps, ln_dtype, out_dtype)
    ok, why = can_use_layer_norm(SPEC.bind(args))
    assert ok, why
    ref, got = layer_norm(*args), SPEC.run_kernel(*args)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    return int((_bits(ref) != _bits(got)).sum())


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("form", list(FORMS))
def test_bit_exact_matrix(form, D):
    bad = []
    for shape in ((1, 1, D), (1, 7, D), (2, 333, D), (4096, D)):
        for amp in (1e-4, 1.0, 100.0):
            for eps in (1e-6, 1e-5):
                x, w, b, ln_dtype, out_dtype = make(form, shape, amp, seed=D + shape[-2])
                n = ndiff(x, w, b, eps, ln_dtype, out_dtype)
                if n:
                    bad.append((shape, amp, eps, n))
    assert not bad, f"{form} D={D}: (shape, amp, eps, ndiff) {bad[:6]}"


@pytest.mark.parametrize("layout", ["rank4", "rank4_heads_transposed_b1", "rank4_heads_transposed",
                                    "rank4_every_other_token", "rank3_every_other_token"])
@pytest.mark.parametrize("form", ["bf16_affine", "fp32", "fp32_layer_norm"])
def test_row_layouts_through_the_op(form, layout):
    shape = {"rank4": (2, 24, 300, 128), "rank4_heads_transposed_b1": (1, 300, 24, 128),
             "rank4_heads_transposed": (2, 333, 24, 128),
             "rank4_every_other_token": (2, 8, 600, 128), "rank3_every_other_token": (2, 600, 1536)}[layout]
    x, w, b, ln_dtype, out_dtype = make(form, shape, 1.0, seed=7)
    if layout.startswith("rank4_heads_transposed"):
        x = x.transpose(1, 2)
    elif layout.endswith("every_other_token"):
        x = x[..., ::2, :]
    args = (x, w, b, 1e-6, ln_dtype, out_dtype)
    counters.reset()
    got = torch.ops.diffusion_fuse.layer_norm(*args)
    assert counters.snapshot()["kernel"] == {"layer_norm": 1}, counters.snapshot()
    assert torch.equal(_bits(layer_norm(*args)), _bits(got))


@pytest.mark.parametrize("form", ["bf16_affine", "fp32", "fp32_layer_norm"])
def test_short_rows_with_zeros_infinities_nans_and_huge_values(form):
    # rows of 128 (16 a program) whose statistics overflow, or whose count-0 combines meet an infinite delta
    x, w, b, ln_dtype, out_dtype = make(form, (3, 40, 128), 1.0, seed=11)
    x[0, 0] = 0.0
    x[0, 1] = -0.0
    x[0, 2, :3] = float("inf")
    x[0, 3, 5] = float("-inf")
    x[1, 0, 7] = float("nan")
    x[1, 1] = 3e38 if x.dtype != torch.float16 else 6e4
    x[1, 2, ::2] = -x[1, 1, ::2]
    assert ndiff(x, w, b, 1e-6, ln_dtype, out_dtype) == 0


def test_zero_eps_with_a_subnormal_variance():
    x, w, b, ln_dtype, out_dtype = make("fp32_layer_norm", (1, 64, 3072), 1e-20, seed=5)
    assert ndiff(x, w, b, 0.0, ln_dtype, out_dtype) == 0
