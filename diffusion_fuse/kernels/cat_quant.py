"""Triton kernel for ``diffusion_fuse::cat_quant``: ``cat([a, b], -1)`` quantized to e4m3 in one pass.

FLUX's single block concatenates the attention output and the MLP activation along the
features before ``proj_out``; FLUX.2's concatenates attention and SwiGLU before ``to_out``.
With an FP8-static projection, eager writes the concatenation, then quantizes it in four
passes. This kernel reads each element of ``a`` and ``b`` once and writes its e4m3 value;
the concatenation is written too only when something else reads it (``keep_cat``).

Numerics contract (lossless tier): the concatenation copies values (no rounding), then each
element is quantized exactly as kernels/fp8_quant.py states.
Inputs: ``a`` [.., Da] and ``b`` [.., Db] of one dtype with the same rows ([M, D] or
[B, S, D]), unit stride along D, any row strides. Outputs are contiguous.
Verified shapes: tests/gpu/test_fp8_quant_gpu.py.
"""

from __future__ import annotations

import torch

from .fp8_quant import BLOCK, NUM_WARPS, Q_MODES, eager_nan_keeps_sign, quantize_e4m3, row_strides
from .launch import CachedLaunch
from .layer_norm_stats import program_row
from .optional_triton import tl, triton


@triton.jit(do_not_specialize=["S", "a_sb", "a_ss", "b_sb", "b_ss", "q_lo", "q_hi"])
def _cat_quant_kernel(
    A, B, SCALE, C, Q, NA, W, S, a_sb, a_ss, b_sb, b_ss, q_lo, q_hi,
    BLOCK: tl.constexpr, KEEP_CAT: tl.constexpr, Q_MODE: tl.constexpr, NAN_SIGN: tl.constexpr,
):
    row, bi, si = program_row(S)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < W
    in_a = offs < NA
    va = tl.load(A + bi * a_sb + si * a_ss + offs, mask=mask & in_a, other=0.0)
    vb = tl.load(B + bi * b_sb + si * b_ss + (offs - NA), mask=mask & (offs >= NA), other=0.0)
    v = tl.where(in_a, va, vb)
    if KEEP_CAT:
        tl.store(C + row * W + offs, v, mask=mask)
    s = tl.load(SCALE).to(tl.float32)
    tl.store(Q + row * W + offs, quantize_e4m3(v.to(tl.float32), s, q_lo, q_hi, Q_MODE, NAN_SIGN), mask=mask)


def plan_cat_quant(a):
    """A launch for inputs of this layout: ``a`` holds the op's arguments by name (lowering/cat_quant.py; its
    guard accepted them), and so does the launch's argument."""
    NA, W = a.a.shape[-1], a.a.shape[-1] + a.b.shape[-1]
    rows = a.a.numel() // NA
    shape, device, dtype = (*a.a.shape[:-1], W), a.a.device, a.a.dtype
    S, a_sb, a_ss = row_strides(a.a)
    _, b_sb, b_ss = row_strides(a.b)
    keep_cat = a.keep_cat
    kernel = CachedLaunch(_cat_quant_kernel, (rows, triton.cdiv(W, BLOCK)),
                          dict(BLOCK=BLOCK, KEEP_CAT=keep_cat, Q_MODE=Q_MODES[a.q_mode],
                               NAN_SIGN=eager_nan_keeps_sign(device)),
                          num_warps=NUM_WARPS)

    def launch(a):
        q = torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
        c = torch.empty(shape, dtype=dtype, device=device) if keep_cat else q
        kernel(a.a, a.b, a.scale, c, q.view(torch.uint8), NA, W, S, a_sb, a_ss, b_sb, b_ss, a.lo, a.hi)
        return [c, q] if keep_cat else [q]

    return launch
