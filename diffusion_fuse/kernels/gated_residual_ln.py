"""Triton kernel for ``diffusion_fuse::gated_residual_ln_modulate``.

Numerics contract (lossless tier): per element, in fp32 and rounded as eager rounds each op::

    m = round_m(gate * x)           # promote(gate, x)
    r = round_r(residual + m)       # promote(residual, m): stored, it is the next residual

then, on the rounded ``r``, exactly ``kernels/ln_modulate.py``'s row (eager's LayerNorm
statistics, normalize, modulate). When D % 512 == 0 (UNIFORM) ``r`` is computed in registers in
the LayerNorm's lane layout, stored once and normalized from registers; otherwise the row of
``r`` is written, a CTA barrier makes it visible to every thread of the program, and the
LayerNorm pass reads it back (from L1/L2). The normalized tensor is never written.

Inputs: residual and x [M, D] or [B, S, D] of one shape with unit stride along D (any row
strides), D % 4 == 0; gate/scale/shift broadcast to x with unit stride along D.
Verified shapes: see tests/gpu/test_gated_residual_gpu.py (written; not yet run on a GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..lowering.gated_residual import residual_dtypes
from ..lowering.norm_modulate import result_dtypes
from .fp8_quant import QuantEpilogue, load_scales
from .launch import CachedLaunch
from .layer_norm_stats import DEFAULT_VARIANT, LANES, load_row_tile, store_row_tile
from .ln_modulate import _DT_CODE, _row_strides, ln_modulate_row, ln_modulate_tile, modulate_constexprs, round_to


@triton.jit(do_not_specialize=["S", "q_plane", "q_lo", "q_hi"])
def _gated_residual_ln_modulate_kernel(
    RES, X, GATE, W, B, SCALE, SHIFT, R_OUT, OUT,
    N, S, eps,
    res_sb, res_ss, x_sb, x_ss, g_sb, g_ss, sc_sb, sc_ss, sh_sb, sh_ss,
    Q, q_plane, S0, S1, S2, S3, q_lo, q_hi,
    M_DT: tl.constexpr,
    N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_SHIFT: tl.constexpr,
    LN_DT: tl.constexpr, T_DT: tl.constexpr, U_DT: tl.constexpr, V_DT: tl.constexpr,
    PUSH_MEAN_FMA: tl.constexpr, PUSH_M2_FMA: tl.constexpr, COMB_MEAN: tl.constexpr,
    COMB_M2_FMA: tl.constexpr, AFFINE_FMA: tl.constexpr, UNIFORM: tl.constexpr,
    N_Q: tl.constexpr, STORE_OUT: tl.constexpr, OUT_DT: tl.constexpr, Q_MODE: tl.constexpr, NAN_SIGN: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    bi = row // S
    si = row % S
    res_row = RES + bi * res_sb + si * res_ss
    x_row = X + bi * x_sb + si * x_ss
    g_row = GATE + bi * g_sb + si * g_ss
    r_row = R_OUT + row * N
    sc_row = SCALE + bi * sc_sb + si * sc_ss
    sh_row = SHIFT + bi * sh_sb + si * sh_ss
    q_row = Q + row * N
    if UNIFORM:
        s0, s1, s2, s3 = load_scales(S0, S1, S2, S3, N_Q)
        # r is computed in registers in the LayerNorm's lane layout: stored once, never read back.
        g = load_row_tile(g_row, 1, N_ITERS, LANES, VEC).to(tl.float32)
        xv = load_row_tile(x_row, 1, N_ITERS, LANES, VEC).to(tl.float32)
        m = round_to(g * xv, M_DT)
        r = (load_row_tile(res_row, 1, N_ITERS, LANES, VEC).to(tl.float32) + m).to(R_OUT.dtype.element_ty)
        store_row_tile(r_row, r, N_ITERS, LANES, VEC)
        ln_modulate_tile(r, W, B, sc_row, sh_row, OUT + row * N, N, eps, N_ITERS, LANES, VEC, HAS_W, HAS_B,
                         HAS_SHIFT, LN_DT, T_DT, U_DT, V_DT, PUSH_MEAN_FMA, PUSH_M2_FMA, COMB_MEAN, COMB_M2_FMA,
                         AFFINE_FMA, q_row, q_plane, s0, s1, s2, s3, q_lo, q_hi, N_Q, STORE_OUT, OUT_DT, Q_MODE,
                         NAN_SIGN)
    else:
        lane = tl.arange(0, LANES)
        col = tl.arange(0, VEC)
        for it in tl.static_range(N_ITERS):
            offs = (it * LANES + lane)[:, None] * VEC + col[None, :]
            mask = offs < N
            g = tl.load(g_row + offs, mask=mask, other=0.0).to(tl.float32)
            xv = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
            m = round_to(g * xv, M_DT)
            r = tl.load(res_row + offs, mask=mask, other=0.0).to(tl.float32) + m
            tl.store(r_row + offs, r.to(R_OUT.dtype.element_ty), mask=mask)
        tl.debug_barrier()  # the whole row of r is in memory before any thread reads it back
        ln_modulate_row(r_row, 1, W, B, sc_row, sh_row, OUT + row * N,
                        N, eps, N_ITERS, LANES, VEC, HAS_W, HAS_B, HAS_SHIFT, LN_DT, T_DT, U_DT, V_DT,
                        PUSH_MEAN_FMA, PUSH_M2_FMA, COMB_MEAN, COMB_M2_FMA, AFFINE_FMA, UNIFORM,
                        q_row, q_plane, S0, S1, S2, S3, q_lo, q_hi, N_Q, STORE_OUT, OUT_DT, Q_MODE, NAN_SIGN)


def plan_gated_residual_ln_modulate(residual, x, gate, weight, bias, eps, scale, shift, out_dtype,
                                    variant=DEFAULT_VARIANT, affine_fma: bool = True,
                                    quant: tuple[int, int, bool] | None = None, nan_sign: bool | None = None):
    """A launch for inputs of this layout (they must satisfy ``can_use_gated_residual_ln_modulate``).

    ``quant``: ``(n, q_mode, keep_out)`` for ``diffusion_fuse::gated_residual_ln_modulate_quant``
    (its launch then takes that op's arguments and returns its Tensor[]), None otherwise.
    """
    D = x.shape[-1]
    S = x.shape[1] if x.dim() == 3 else 1
    m_dt, r_dt = residual_dtypes(residual.dtype, x.dtype, gate.dtype)
    ln_dt, t_dt, u_dt, v_dt, final = result_dtypes(
        r_dt, scale.dtype, None if shift is None else shift.dtype, None, out_dtype)
    shape, device = x.shape, x.device
    strides = (*_row_strides(residual, x), *_row_strides(x, x), *_row_strides(gate, x), *_row_strides(scale, x),
               *_row_strides(shift, x))
    epi = QuantEpilogue(quant, shape, _DT_CODE[final], device, nan_sign)
    const = dict(M_DT=_DT_CODE[m_dt],
                 **modulate_constexprs(D, weight, bias, shift, ln_dt, t_dt, u_dt, v_dt, variant, affine_fma),
                 **epi.constexprs)
    kernel = CachedLaunch(_gated_residual_ln_modulate_kernel, (x.numel() // D,), const, num_warps=LANES // 32,
                          enable_fp_fusion=False)

    def launch(residual, x, gate, weight, bias, eps, scale, shift, out_dtype, *quant_args):
        r = torch.empty(shape, dtype=r_dt, device=device)
        out = torch.empty(shape, dtype=final, device=device) if epi.keep_out else r
        q_args, q = epi.args(x, *quant_args)
        kernel(residual, x, gate, weight if weight is not None else x, bias if bias is not None else x, scale,
               shift if shift is not None else scale, r, out, D, S, eps, *strides, *q_args)
        return (r, out) if q is None else epi.outputs([r], out, q)

    return launch


def gated_residual_ln_modulate_triton(*args, **kwargs):
    """Plan and launch once (tests, benchmarks); the op caches plans per layout instead."""
    return plan_gated_residual_ln_modulate(*args, **kwargs)(*args)


