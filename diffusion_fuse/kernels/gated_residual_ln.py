"""Triton kernels for ``diffusion_fuse::gated_residual_ln_modulate`` and ``diffusion_fuse::gated_residual``.

Numerics contract (lossless tier): per element, in fp32 and rounded as eager rounds each op::

    g = gate [+ gate_temb]          # second addend: one fp32 add (Wan's table + temb.float())
    m = round_m(g * x)              # promote(gate, x)
    r = round_r(residual + m)       # promote(residual, m), or r_dtype (Wan's .type_as): stored, the next residual

then, on the rounded ``r`` (widened to fp32 when ln_dtype is fp32: Wan's FP32LayerNorm), exactly
``kernels/ln_modulate.py``'s row (eager's LayerNorm statistics, normalize, modulate or not). ``r``
rounded to its dtype once from the fp32 sum is what eager's add and then ``_to_copy`` give. When D % 512 == 0 (UNIFORM) ``r`` is computed in registers in
the LayerNorm's lane layout, stored once and normalized from registers; otherwise the row of
``r`` is written, a CTA barrier makes it visible to every thread of the program, and the
LayerNorm pass reads it back (from L1/L2). The normalized tensor is never written.
``gated_residual`` is the first part alone (one program per row, ``r`` stored and nothing else).

Inputs: residual and x [M, D] or [B, S, D] of one shape with unit stride along D (any row
strides), D % 4 == 0; gate/scale/shift and their second addends broadcast to x with unit stride
along D ([B,1,D], [B,S,D], per-token views of Wan's [B,S,6,D] temb).
Verified shapes: see tests/gpu/test_gated_residual_gpu.py and tests/gpu/test_wan_temb_gpu.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..lowering.gated_residual import residual_dtypes
from ..lowering.norm_modulate import result_dtypes, sum_dtype
from .fp8_quant import QuantEpilogue, load_scales
from .launch import CachedLaunch
from .layer_norm_stats import DEFAULT_VARIANT, LANES, VEC, load_row_tile, n_iters_for, program_row, store_row_tile
from .ln_modulate import (_DT_CODE, _row_strides, ln_modulate_row, ln_modulate_tile, modulate_constexprs, round_to,
                          split_trailing)


@triton.jit
def gated_residual_row(res_row, x_row, g_row, gt_row, r_row, N, N_ITERS: tl.constexpr, LANES: tl.constexpr,
                       VEC: tl.constexpr, M_DT: tl.constexpr, HAS_GATE_TEMB: tl.constexpr):
    """One row of ``r = residual + (gate [+ gate_temb]) * x``, stored in r_row's dtype (the contract above)."""
    lane = tl.arange(0, LANES)
    col = tl.arange(0, VEC)
    for it in tl.static_range(N_ITERS):
        offs = (it * LANES + lane)[:, None] * VEC + col[None, :]
        mask = offs < N
        g = tl.load(g_row + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_GATE_TEMB:
            g = g + tl.load(gt_row + offs, mask=mask, other=0.0).to(tl.float32)
        xv = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        m = round_to(g * xv, M_DT)
        r = tl.load(res_row + offs, mask=mask, other=0.0).to(tl.float32) + m
        tl.store(r_row + offs, r.to(r_row.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["S", "q_plane", "q_lo", "q_hi"])
def _gated_residual_ln_modulate_kernel(
    RES, X, GATE, W, B, SCALE, SHIFT, R_OUT, OUT,
    N, S, eps,
    res_sb, res_ss, x_sb, x_ss, g_sb, g_ss, sc_sb, sc_ss, sh_sb, sh_ss,
    Q, q_plane, S0, S1, S2, S3, q_lo, q_hi,
    GATE_T, SCALE_T, SHIFT_T, gt_sb, gt_ss, sct_sb, sct_ss, sht_sb, sht_ss,
    M_DT: tl.constexpr,
    N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_SHIFT: tl.constexpr,
    LN_DT: tl.constexpr, T_DT: tl.constexpr, U_DT: tl.constexpr, V_DT: tl.constexpr,
    PUSH_MEAN_FMA: tl.constexpr, PUSH_M2_FMA: tl.constexpr, COMB_MEAN: tl.constexpr,
    COMB_M2_FMA: tl.constexpr, AFFINE_FMA: tl.constexpr, UNIFORM: tl.constexpr,
    N_Q: tl.constexpr, STORE_OUT: tl.constexpr, OUT_DT: tl.constexpr, Q_MODE: tl.constexpr, NAN_SIGN: tl.constexpr,
    HAS_GATE_TEMB: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_SCALE_TEMB: tl.constexpr, HAS_SHIFT_TEMB: tl.constexpr,
    CACHE_HINTS: tl.constexpr,
):
    row, bi, si = program_row(S)
    res_row = RES + bi * res_sb + si * res_ss
    x_row = X + bi * x_sb + si * x_ss
    g_row = GATE + bi * g_sb + si * g_ss
    gt_row = GATE_T + bi * gt_sb + si * gt_ss
    r_row = R_OUT + row * N
    sc_row = SCALE + bi * sc_sb + si * sc_ss
    sh_row = SHIFT + bi * sh_sb + si * sh_ss
    sct_row = SCALE_T + bi * sct_sb + si * sct_ss
    sht_row = SHIFT_T + bi * sht_sb + si * sht_ss
    q_row = Q + row * N
    if UNIFORM:
        s0, s1, s2, s3 = load_scales(S0, S1, S2, S3, N_Q)
        # r is computed in registers in the LayerNorm's lane layout: stored once, never read back.
        # CACHE_HINTS (as ln_modulate's LaunchVariant.cache_hints): 1 evict-first loads of x and residual, read
        # once (the gate, often one row shared by every token, keeps the default policy), 2 streaming stores of
        # r and the output
        EF: tl.constexpr = (CACHE_HINTS & 1) != 0
        g = load_row_tile(g_row, 1, N_ITERS, LANES, VEC).to(tl.float32)
        if HAS_GATE_TEMB:
            g = g + load_row_tile(gt_row, 1, N_ITERS, LANES, VEC).to(tl.float32)
        xv = load_row_tile(x_row, 1, N_ITERS, LANES, VEC, EF).to(tl.float32)
        m = round_to(g * xv, M_DT)
        r = (load_row_tile(res_row, 1, N_ITERS, LANES, VEC, EF).to(tl.float32) + m).to(R_OUT.dtype.element_ty)
        store_row_tile(r_row, r, N_ITERS, LANES, VEC, (CACHE_HINTS & 2) != 0)
        ln_modulate_tile(r, W, B, sc_row, sh_row, OUT + row * N, N, eps, N_ITERS, LANES, VEC, HAS_W, HAS_B,
                         HAS_SHIFT, LN_DT, T_DT, U_DT, V_DT, PUSH_MEAN_FMA, PUSH_M2_FMA, COMB_MEAN, COMB_M2_FMA,
                         AFFINE_FMA, q_row, q_plane, s0, s1, s2, s3, q_lo, q_hi, N_Q, STORE_OUT, OUT_DT, Q_MODE,
                         NAN_SIGN, sct_row, sht_row, HAS_SCALE, HAS_SCALE_TEMB, HAS_SHIFT_TEMB,
                         CACHE_HINTS=CACHE_HINTS & 2)
    else:
        gated_residual_row(res_row, x_row, g_row, gt_row, r_row, N, N_ITERS, LANES, VEC, M_DT, HAS_GATE_TEMB)
        tl.debug_barrier()  # the whole row of r is in memory before any thread reads it back
        ln_modulate_row(r_row, 1, W, B, sc_row, sh_row, OUT + row * N,
                        N, eps, N_ITERS, LANES, VEC, HAS_W, HAS_B, HAS_SHIFT, LN_DT, T_DT, U_DT, V_DT,
                        PUSH_MEAN_FMA, PUSH_M2_FMA, COMB_MEAN, COMB_M2_FMA, AFFINE_FMA, UNIFORM,
                        q_row, q_plane, S0, S1, S2, S3, q_lo, q_hi, N_Q, STORE_OUT, OUT_DT, Q_MODE, NAN_SIGN,
                        sct_row, sht_row, HAS_SCALE, HAS_SCALE_TEMB, HAS_SHIFT_TEMB)


# The gated kernel's cache hints when not told: none. Unlike LN + modulate's, they did not help on the H200:
# FLUX [1,4608,3072] steady 30.5 µs without, 32.5 / 32.1 / 30.9 µs with evict-first loads / streaming stores /
# both (results/h200-2026-11-30k/run1/bench_norm.json; the kernel is at 1.02x an SM copy of its bytes).
DEFAULT_CACHE_HINTS = 0


def plan_gated_residual_ln_modulate(residual, x, gate, weight, bias, eps, scale, shift, out_dtype, gate_temb=None,
                                    scale_temb=None, shift_temb=None, r_dtype=None, ln_dtype=None,
                                    variant=DEFAULT_VARIANT, affine_fma: bool = True,
                                    quant: tuple[int, int, bool] | None = None, nan_sign: bool | None = None,
                                    cache_hints: int | None = None):
    """A launch for inputs of this layout (they must satisfy ``can_use_gated_residual_ln_modulate``).

    ``cache_hints`` (default ``DEFAULT_CACHE_HINTS``; rows of D % 512 == 0 only, others ignore them): 1
    evict-first loads of x and residual, 2 streaming stores of r and the output, 3 both. Same bits either way.

    ``quant``: ``(n, q_mode, keep_out)`` for ``diffusion_fuse::gated_residual_ln_modulate_quant``
    (its launch then takes that op's arguments and returns its Tensor[]), None otherwise.
    """
    D = x.shape[-1]
    S = x.shape[1] if x.dim() == 3 else 1
    m_dt, r_dt = residual_dtypes(residual.dtype, x.dtype, sum_dtype(gate, gate_temb), r_dtype)
    ln_dt, t_dt, u_dt, v_dt, final = result_dtypes(
        r_dt, sum_dtype(scale, scale_temb), sum_dtype(shift, shift_temb), ln_dtype, out_dtype)
    shape, device = x.shape, x.device
    strides = [s for t in (residual, x, gate, scale, shift) for s in _row_strides(t, x)]
    temb_strides = [s for t in (gate_temb, scale_temb, shift_temb) for s in _row_strides(t, x)]
    epi = QuantEpilogue(quant, shape, _DT_CODE[final], device, nan_sign)
    const = dict(M_DT=_DT_CODE[m_dt],
                 **modulate_constexprs(D, weight, bias, shift, ln_dt, t_dt, u_dt, v_dt, variant, affine_fma),
                 **epi.constexprs, HAS_GATE_TEMB=gate_temb is not None, HAS_SCALE=scale is not None,
                 HAS_SCALE_TEMB=scale_temb is not None, HAS_SHIFT_TEMB=shift_temb is not None,
                 CACHE_HINTS=DEFAULT_CACHE_HINTS if cache_hints is None else cache_hints)
    if const["CACHE_HINTS"] not in (0, 1, 2, 3):
        raise ValueError(f"cache_hints={cache_hints}: 0, 1 (evict-first loads), 2 (streaming stores) or 3")
    kernel = CachedLaunch(_gated_residual_ln_modulate_kernel, (x.numel() // D,), const, num_warps=LANES // 32)

    def launch(residual, x, gate, weight, bias, eps, scale, shift, out_dtype, *rest):
        quant_args, temb = split_trailing(rest, quant, 3)  # then r_dtype, ln_dtype: in the plan
        r = torch.empty(shape, dtype=r_dt, device=device)
        out = torch.empty(shape, dtype=final, device=device) if epi.keep_out else r
        q_args, q = epi.args(x, *quant_args)
        kernel(residual, x, gate, *(t if t is not None else x for t in (weight, bias, scale, shift)), r, out, D, S,
               eps, *strides, *q_args, *(t if t is not None else x for t in temb), *temb_strides)
        return (r, out) if q is None else epi.outputs([r], out, q)

    return launch


@triton.jit(do_not_specialize=["S"])
def _gated_residual_kernel(RES, X, GATE, GATE_T, R_OUT, N, S, res_sb, res_ss, x_sb, x_ss, g_sb, g_ss, gt_sb, gt_ss,
                           M_DT: tl.constexpr, N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
                           HAS_GATE_TEMB: tl.constexpr):
    row, bi, si = program_row(S)
    gated_residual_row(RES + bi * res_sb + si * res_ss, X + bi * x_sb + si * x_ss, GATE + bi * g_sb + si * g_ss,
                       GATE_T + bi * gt_sb + si * gt_ss, R_OUT + row * N, N, N_ITERS, LANES, VEC, M_DT, HAS_GATE_TEMB)


def plan_gated_residual(residual, x, gate, gate_temb=None, r_dtype=None):
    """A launch for inputs of this layout (they must satisfy ``can_use_gated_residual``)."""
    D = x.shape[-1]
    S = x.shape[1] if x.dim() == 3 else 1
    m_dt, r_dt = residual_dtypes(residual.dtype, x.dtype, sum_dtype(gate, gate_temb), r_dtype)
    shape, device = x.shape, x.device
    strides = [s for t in (residual, x, gate, gate_temb) for s in _row_strides(t, x)]
    const = dict(M_DT=_DT_CODE[m_dt], N_ITERS=n_iters_for(D), LANES=LANES, VEC=VEC,
                 HAS_GATE_TEMB=gate_temb is not None)
    kernel = CachedLaunch(_gated_residual_kernel, (x.numel() // D,), const, num_warps=LANES // 32)

    def launch(residual, x, gate, gate_temb=None, r_dtype=None):
        r = torch.empty(shape, dtype=r_dt, device=device)
        kernel(residual, x, gate, gate_temb if gate_temb is not None else gate, r, D, S, *strides)
        return r

    return launch


def gated_residual_triton(*args):
    """Plan and launch once (tests, benchmarks)."""
    return plan_gated_residual(*args)(*args)


def gated_residual_ln_modulate_triton(*args, **kwargs):
    """Plan and launch once (tests, benchmarks); the op caches plans per layout instead."""
    return plan_gated_residual_ln_modulate(*args, **kwargs)(*args)


