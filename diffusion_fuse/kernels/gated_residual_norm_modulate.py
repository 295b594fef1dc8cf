"""Triton kernel for ``diffusion_fuse::gated_residual_norm_modulate``: gated residual, LayerNorm and modulate.

Numerics contract (lossless tier): per element, in fp32 and rounded as eager rounds each op::

    g = gate [+ gate_temb]          # second addend: one fp32 add (Wan's table + temb.float())
    m = round_m(g * x)              # promote(gate, x)
    r = round_r(residual + m)       # promote(residual, m), or r_dtype (Wan's .type_as): stored, the next residual

then, on the rounded ``r`` (widened to fp32 when ln_dtype is fp32: Wan's FP32LayerNorm), exactly
``kernels/norm_modulate.py``'s row (eager's LayerNorm statistics, normalize, modulate or not). ``r``
rounded to its dtype once from the fp32 sum is what eager's add and then ``_to_copy`` give. ``r`` is
computed in registers in the LayerNorm's lane layout (masked past the row when D % 512 != 0), stored
once and normalized from registers; the normalized tensor is never written. The kernel takes no cache
hints (unlike norm_modulate's: they make it no faster).
kernels/gated_residual.py is the first part alone; with ``GATED=False`` this kernel is the second part alone,
normalizing an ``r`` that kernel's tile kernel wrote (a D-major residual: lowering/gated_residual_norm_modulate.py).

Inputs: residual and x [M, D] or [B, S, D] of one shape with unit stride along D (any row
strides), D % 4 == 0; gate/scale/shift and their second addends broadcast to x with unit stride
along D ([B,1,D], [B,S,D], per-token views of Wan's [B,S,6,D] temb).
Verified shapes: see tests/gpu/test_gated_residual_norm_modulate_gpu.py and tests/gpu/test_table_slice_gpu.py.
"""

from __future__ import annotations

import torch

from .fp8_quant import QuantEpilogue, load_scales
from .gated_residual import residual_dtypes, residual_plus_gated
from .launch import CachedLaunch
from .layer_norm_stats import LANES, load_row_tile, program_row, store_row_tile
from .norm_modulate import (
    DT_CODE,
    batch_token_strides,
    modulate_constexprs,
    norm_modulate_tile,
    result_dtypes,
    sum_dtype,
)
from .optional_triton import tl, triton


@triton.jit(do_not_specialize=["S", "q_plane", "q_lo", "q_hi"])
def _gated_residual_norm_modulate_kernel(
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
    GATED: tl.constexpr,
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
    s0, s1, s2, s3 = load_scales(S0, S1, S2, S3, N_Q)
    if GATED:
        # r is computed in registers in the LayerNorm's lane layout: stored once, never read back.
        g = load_row_tile(g_row, 1, N_ITERS, LANES, VEC, N=N, UNIFORM=UNIFORM).to(tl.float32)
        if HAS_GATE_TEMB:
            g = g + load_row_tile(gt_row, 1, N_ITERS, LANES, VEC, N=N, UNIFORM=UNIFORM).to(tl.float32)
        r = residual_plus_gated(g, load_row_tile(x_row, 1, N_ITERS, LANES, VEC, N=N, UNIFORM=UNIFORM),
                                load_row_tile(res_row, 1, N_ITERS, LANES, VEC, N=N, UNIFORM=UNIFORM), M_DT)
        r = r.to(R_OUT.dtype.element_ty)
        store_row_tile(r_row, r, N_ITERS, LANES, VEC, N=N, UNIFORM=UNIFORM)
    else:  # RES holds r already (the tile kernel's row-major copy): normalize it
        r = load_row_tile(res_row, 1, N_ITERS, LANES, VEC, N=N, UNIFORM=UNIFORM)
    norm_modulate_tile(
        tile=r, W=W, B=B, sc_row=sc_row, sh_row=sh_row, out_row=OUT + row * N, N=N, eps=eps,
        N_ITERS=N_ITERS, LANES=LANES, VEC=VEC, HAS_W=HAS_W, HAS_B=HAS_B, HAS_SHIFT=HAS_SHIFT,
        LN_DT=LN_DT, T_DT=T_DT, U_DT=U_DT, V_DT=V_DT,
        PUSH_MEAN_FMA=PUSH_MEAN_FMA, PUSH_M2_FMA=PUSH_M2_FMA, COMB_MEAN=COMB_MEAN, COMB_M2_FMA=COMB_M2_FMA,
        AFFINE_FMA=AFFINE_FMA, UNIFORM=UNIFORM,
        q_row=q_row, q_plane=q_plane, s0=s0, s1=s1, s2=s2, s3=s3, q_lo=q_lo, q_hi=q_hi,
        N_Q=N_Q, STORE_OUT=STORE_OUT, OUT_DT=OUT_DT, Q_MODE=Q_MODE, NAN_SIGN=NAN_SIGN,
        sct_row=sct_row, sht_row=sht_row, HAS_SCALE=HAS_SCALE, HAS_SCALE_TEMB=HAS_SCALE_TEMB,
        HAS_SHIFT_TEMB=HAS_SHIFT_TEMB)


def plan_gated_residual_norm_modulate(a, quant: tuple[int, str, bool] | None = None, gated: bool = True):
    """A launch for inputs of this layout: ``a`` holds the op's arguments by name
    (lowering/gated_residual_norm_modulate.py; its guard accepted them), and so does the launch's argument.

    ``quant``: ``(n, q_mode, keep_out)`` for ``diffusion_fuse::gated_residual_norm_modulate_quant``
    (the launch then reads that op's quantizer arguments too and returns its Tensor[]), None otherwise.
    ``gated=False``: ``a.residual`` is ``r`` itself, row-major (kernels/gated_residual.py's tile kernel wrote it);
    the kernel normalizes it and writes no ``r`` (the launch returns ``a.residual`` in its place).
    """
    x = a.x
    D = x.shape[-1]
    S = x.shape[1] if x.dim() == 3 else 1
    m_dt, r_dt = residual_dtypes(a.residual.dtype, x.dtype, sum_dtype(a.gate, a.gate_temb), a.r_dtype)
    ln_dt, t_dt, u_dt, v_dt, final = result_dtypes(
        r_dt, sum_dtype(a.scale, a.scale_temb), sum_dtype(a.shift, a.shift_temb), a.ln_dtype, a.out_dtype)
    shape, device = x.shape, x.device
    strides = [s for t in (a.residual, x, a.gate, a.scale, a.shift) for s in batch_token_strides(t, x)]
    temb_strides = [s for t in (a.gate_temb, a.scale_temb, a.shift_temb) for s in batch_token_strides(t, x)]
    epi = QuantEpilogue(quant, shape, DT_CODE[final], device)
    const = dict(M_DT=DT_CODE[m_dt], **modulate_constexprs(D, a.weight, a.bias, a.shift, ln_dt, t_dt, u_dt, v_dt),
                 **epi.constexprs, HAS_GATE_TEMB=a.gate_temb is not None, HAS_SCALE=a.scale is not None,
                 HAS_SCALE_TEMB=a.scale_temb is not None, HAS_SHIFT_TEMB=a.shift_temb is not None, GATED=gated)
    kernel = CachedLaunch(_gated_residual_norm_modulate_kernel, (x.numel() // D,), const, num_warps=LANES // 32)

    def launch(a):
        x = a.x
        r = torch.empty(shape, dtype=r_dt, device=device) if gated else a.residual
        out = torch.empty(shape, dtype=final, device=device) if epi.keep_out else r
        q_args, q = epi.args(x, a) if quant else epi.args(x)
        kernel(a.residual, x, a.gate, *(t if t is not None else x for t in (a.weight, a.bias, a.scale, a.shift)), r,
               out, D, S, a.eps, *strides, *q_args,
               *(t if t is not None else x for t in (a.gate_temb, a.scale_temb, a.shift_temb)), *temb_strides)
        return (r, out) if q is None else epi.outputs([r], out, q)

    return launch
