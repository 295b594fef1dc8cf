"""Triton kernel for ``diffusion_fuse::norm_modulate``: LayerNorm + AdaLN modulate in one pass.

Numerics contract (lossless tier): per row, mean/rstd are eager's
``vectorized_layer_norm_kernel`` values (kernels/layer_norm_stats.py); then every op of the
replaced ATen chain is computed in fp32 and rounded to its eager result dtype, in eager's
order, with no FMA contraction (launched with ``launch.EAGER_NUMERICS``)::

    y = round_ln(LN(x))          # bf16 model: bf16;  Wan FP32LayerNorm: fp32
    t = round_t(scale + 1)       # scale's dtype
    u = round_u(y * t)           # promote(ln, scale)
    v = round_v(u + shift)       # promote(u, shift)
    out = round_out(v)           # final cast (Wan: bf16)

With a second addend (Wan's chunked ``scale_shift_table + temb.float()``, patterns/table_slice.py),
``scale`` is ``scale + scale_temb`` and ``shift`` is ``shift + shift_temb``: one fp32 add of the two
values widened to fp32, as eager's add computes the slice (the guard takes fp32 sums only). Without
a scale (HAS_SCALE=False: a LayerNorm read by no modulate, gated_residual_norm_modulate's norm2 and
family layer_norm), ``out = round_out(y)``: eager's ``native_layer_norm`` output (affine included),
then its output cast, each rounded as eager rounds it.

Inputs: x [M, D] or [B, S, D] with any strides (and [B, H, S, D] without a modulate: X_HEADS). Eager
LayerNorm copies a non-contiguous input to a fresh, aligned buffer and normalizes the same values; a unit stride
along D, the usual case, is specialized by Triton. D % 4 == 0 (the guard in lowering/norm_modulate.py routes
everything else to the reference); scale/shift anything that broadcasts to x with unit stride along D ([B,1,D],
[B,S,D], strided per-token slices of [B,S,6,D]), or None.
Verified shapes: tests/gpu/test_norm_modulate_gpu.py, tests/gpu/test_layer_norm_gpu.py (no modulate) and
tests/gpu/test_table_slice_gpu.py (the second addends).

Rows of at most 128 elements without a modulate (family layer_norm: QK norms over a head) run
``_short_rows_kernel``: SHORT_ROWS rows a program as [rows, 32, 4] tiles, where a program a row would leave 96
of its 128 lanes empty (eager's own block does; kernels/layer_norm_stats.py ``short_rows_stats`` keeps its order).
"""

from __future__ import annotations

import torch

from .fp8_quant import QuantEpilogue, load_scales, store_quants
from .launch import CachedLaunch
from .layer_norm_stats import (
    DEFAULT_VARIANT,
    LANES,
    SHORT_ROW,
    VEC,
    is_uniform,
    layer_norm_apply_affine,
    load_row_tile,
    n_iters_for,
    program_row,
    row_tile_trip,
    short_rows_stats,
    welford_tile_stats,
)
from .optional_triton import tl, triton

DT_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # the kernels' dtype codes (``round_to``)


def sum_dtype(t: torch.Tensor | None, addend: torch.Tensor | None) -> torch.dtype | None:
    """dtype of ``t [+ addend]``."""
    if t is None:
        return None
    return t.dtype if addend is None else torch.promote_types(t.dtype, addend.dtype)


def result_dtypes(x_dtype, scale_dtype, shift_dtype, ln_dtype, out_dtype):
    """dtypes of (ln, 1+scale, ln*(1+scale), +shift, final) as eager's type promotion gives them.

    ``scale_dtype=None``: no modulate (every dtype after the LayerNorm is the LayerNorm's).
    """
    ln_dt = ln_dtype or x_dtype
    t_dt = scale_dtype or ln_dt
    u_dt = torch.promote_types(ln_dt, t_dt)
    v_dt = torch.promote_types(u_dt, shift_dtype) if shift_dtype is not None and scale_dtype is not None else u_dt
    return ln_dt, t_dt, u_dt, v_dt, out_dtype or v_dt


@triton.jit
def round_to(x, CODE: tl.constexpr):
    """Round fp32 ``x`` to the dtype coded by CODE (0 fp32, 1 bf16, 2 fp16), back in fp32."""
    if CODE == 1:
        return x.to(tl.bfloat16).to(tl.float32)
    elif CODE == 2:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


@triton.jit
def norm_modulate_row(
    x_row, x_sd, W, B, sc_row, sh_row, out_row, N, eps,
    N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_SHIFT: tl.constexpr,
    LN_DT: tl.constexpr, T_DT: tl.constexpr, U_DT: tl.constexpr, V_DT: tl.constexpr,
    PUSH_MEAN_FMA: tl.constexpr, PUSH_M2_FMA: tl.constexpr, COMB_MEAN: tl.constexpr,
    COMB_M2_FMA: tl.constexpr, AFFINE_FMA: tl.constexpr, UNIFORM: tl.constexpr,
    q_row=None, q_plane=0, S0=None, S1=None, S2=None, S3=None, q_lo=0.0, q_hi=0.0,
    N_Q: tl.constexpr = 0, STORE_OUT: tl.constexpr = True, OUT_DT: tl.constexpr = 0, Q_MODE: tl.constexpr = 0,
    NAN_SIGN: tl.constexpr = True,
    sct_row=None, sht_row=None, HAS_SCALE: tl.constexpr = True, HAS_SCALE_TEMB: tl.constexpr = False,
    HAS_SHIFT_TEMB: tl.constexpr = False, CACHE_HINTS: tl.constexpr = False,
):
    """One row: eager's LayerNorm statistics, then normalize, modulate and store (the contract above).

    Quant epilogue (kernels/fp8_quant.py), when N_Q > 0: the output, rounded to its dtype (OUT_DT),
    is also quantized with each of the N_Q scales S0.. and stored at ``q_row + i * q_plane``; the
    output itself is stored only if STORE_OUT. sct_row/sht_row: rows of scale's/shift's second addends,
    read when HAS_SCALE_TEMB/HAS_SHIFT_TEMB (Wan's timestep table); HAS_SCALE=False: no modulate.

    The row is read once into registers (``load_row_tile``; ``norm_modulate_tile``), the statistics and the
    output computed from there. UNIFORM (N == N_ITERS * 512): every lane has a vector on every trip, no masks.
    CACHE_HINTS: the row is loaded with an L2 evict-first policy and the output stored with streaming stores
    (both are read or written once).
    """
    s0, s1, s2, s3 = load_scales(S0, S1, S2, S3, N_Q)
    tile = load_row_tile(x_row, x_sd, N_ITERS=N_ITERS, LANES=LANES, VEC=VEC, EVICT_FIRST=CACHE_HINTS, N=N,
                         UNIFORM=UNIFORM)
    norm_modulate_tile(
        tile=tile, W=W, B=B, sc_row=sc_row, sh_row=sh_row, out_row=out_row, N=N, eps=eps,
        N_ITERS=N_ITERS, LANES=LANES, VEC=VEC, HAS_W=HAS_W, HAS_B=HAS_B, HAS_SHIFT=HAS_SHIFT,
        LN_DT=LN_DT, T_DT=T_DT, U_DT=U_DT, V_DT=V_DT,
        PUSH_MEAN_FMA=PUSH_MEAN_FMA, PUSH_M2_FMA=PUSH_M2_FMA, COMB_MEAN=COMB_MEAN, COMB_M2_FMA=COMB_M2_FMA,
        AFFINE_FMA=AFFINE_FMA, UNIFORM=UNIFORM,
        q_row=q_row, q_plane=q_plane, s0=s0, s1=s1, s2=s2, s3=s3, q_lo=q_lo, q_hi=q_hi,
        N_Q=N_Q, STORE_OUT=STORE_OUT, OUT_DT=OUT_DT, Q_MODE=Q_MODE, NAN_SIGN=NAN_SIGN,
        sct_row=sct_row, sht_row=sht_row, HAS_SCALE=HAS_SCALE, HAS_SCALE_TEMB=HAS_SCALE_TEMB,
        HAS_SHIFT_TEMB=HAS_SHIFT_TEMB, STREAM_STORE=CACHE_HINTS)


@triton.jit
def norm_modulate_tile(
    tile, W, B, sc_row, sh_row, out_row, N, eps,
    N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_SHIFT: tl.constexpr,
    LN_DT: tl.constexpr, T_DT: tl.constexpr, U_DT: tl.constexpr, V_DT: tl.constexpr,
    PUSH_MEAN_FMA: tl.constexpr, PUSH_M2_FMA: tl.constexpr, COMB_MEAN: tl.constexpr,
    COMB_M2_FMA: tl.constexpr, AFFINE_FMA: tl.constexpr, UNIFORM: tl.constexpr,
    q_row=None, q_plane=0, s0=1.0, s1=1.0, s2=1.0, s3=1.0, q_lo=0.0, q_hi=0.0,
    N_Q: tl.constexpr = 0, STORE_OUT: tl.constexpr = True, OUT_DT: tl.constexpr = 0, Q_MODE: tl.constexpr = 0,
    NAN_SIGN: tl.constexpr = True,
    sct_row=None, sht_row=None, HAS_SCALE: tl.constexpr = True, HAS_SCALE_TEMB: tl.constexpr = False,
    HAS_SHIFT_TEMB: tl.constexpr = False, STREAM_STORE: tl.constexpr = False,
):
    """``norm_modulate_row`` of a row held in registers (``load_row_tile`` layout)."""
    mean, rstd = welford_tile_stats(
        tile=tile, N=N, eps=eps, N_ITERS=N_ITERS, LANES=LANES, VEC=VEC, PUSH_MEAN_FMA=PUSH_MEAN_FMA,
        PUSH_M2_FMA=PUSH_M2_FMA, COMB_MEAN=COMB_MEAN, COMB_M2_FMA=COMB_M2_FMA, UNIFORM=UNIFORM)
    lane = tl.arange(0, LANES)
    col = tl.arange(0, VEC)
    for it in tl.static_range(N_ITERS):
        offs = (it * LANES + lane)[:, None] * VEC + col[None, :]
        x = row_tile_trip(tile, it, LANES, VEC).to(tl.float32)
        modulate_store(
            x=x, mean=mean, rstd=rstd, offs=offs, mask=offs < N, W=W, B=B, sc_row=sc_row, sh_row=sh_row,
            out_row=out_row,
            HAS_W=HAS_W, HAS_B=HAS_B, HAS_SHIFT=HAS_SHIFT, LN_DT=LN_DT, T_DT=T_DT, U_DT=U_DT, V_DT=V_DT,
            AFFINE_FMA=AFFINE_FMA,
            q_row=q_row, q_plane=q_plane, s0=s0, s1=s1, s2=s2, s3=s3, q_lo=q_lo, q_hi=q_hi,
            N_Q=N_Q, STORE_OUT=STORE_OUT, OUT_DT=OUT_DT, Q_MODE=Q_MODE, NAN_SIGN=NAN_SIGN,
            sct_row=sct_row, sht_row=sht_row, HAS_SCALE=HAS_SCALE, HAS_SCALE_TEMB=HAS_SCALE_TEMB,
            HAS_SHIFT_TEMB=HAS_SHIFT_TEMB, STREAM_STORE=STREAM_STORE)


@triton.jit
def modulate_store(x, mean, rstd, offs, mask, W, B, sc_row, sh_row, out_row,
                   HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_SHIFT: tl.constexpr,
                   LN_DT: tl.constexpr, T_DT: tl.constexpr, U_DT: tl.constexpr, V_DT: tl.constexpr,
                   AFFINE_FMA: tl.constexpr,
                   q_row=None, q_plane=0, s0=1.0, s1=1.0, s2=1.0, s3=1.0, q_lo=0.0, q_hi=0.0,
                   N_Q: tl.constexpr = 0, STORE_OUT: tl.constexpr = True, OUT_DT: tl.constexpr = 0,
                   Q_MODE: tl.constexpr = 0, NAN_SIGN: tl.constexpr = True,
                   sct_row=None, sht_row=None, HAS_SCALE: tl.constexpr = True, HAS_SCALE_TEMB: tl.constexpr = False,
                   HAS_SHIFT_TEMB: tl.constexpr = False, STREAM_STORE: tl.constexpr = False):
    """Normalize fp32 ``x`` (one trip's [LANES, VEC]), modulate, round as eager does, and store
    (the output if STORE_OUT; its N_Q quantized copies, kernels/fp8_quant.py)."""
    w = x
    b = x
    if HAS_W:
        w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    v = round_to(layer_norm_apply_affine(x, mean, rstd, w, b, HAS_W, HAS_B, AFFINE_FMA), LN_DT)
    if HAS_SCALE:
        sc = tl.load(sc_row + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_SCALE_TEMB:
            sc = sc + tl.load(sct_row + offs, mask=mask, other=0.0).to(tl.float32)
        v = round_to(v * round_to(sc + 1.0, T_DT), U_DT)
        if HAS_SHIFT:
            sh = tl.load(sh_row + offs, mask=mask, other=0.0).to(tl.float32)
            if HAS_SHIFT_TEMB:
                sh = sh + tl.load(sht_row + offs, mask=mask, other=0.0).to(tl.float32)
            v = round_to(v + sh, V_DT)
    if STORE_OUT:
        # STREAM_STORE: written once, read by the next kernel: st.global.cs
        CM: tl.constexpr = ".cs" if STREAM_STORE else ""
        tl.store(out_row + offs, v.to(out_row.dtype.element_ty), mask=mask, cache_modifier=CM)
    if N_Q > 0:
        store_quants(q_row=q_row, q_plane=q_plane, offs=offs, mask=mask, v=round_to(v, OUT_DT), s0=s0, s1=s1, s2=s2,
                     s3=s3, q_lo=q_lo, q_hi=q_hi, N_Q=N_Q, Q_MODE=Q_MODE, NAN_SIGN=NAN_SIGN)


@triton.jit(do_not_specialize=["S", "q_plane", "q_lo", "q_hi"])
def _norm_modulate_kernel(
    X, W, B, SCALE, SHIFT, OUT,
    N, S, H, eps,
    x_sb, x_ss, x_sd, x_sh, sc_sb, sc_ss, sh_sb, sh_ss,
    Q, q_plane, S0, S1, S2, S3, q_lo, q_hi,
    SCALE_T, SHIFT_T, sct_sb, sct_ss, sht_sb, sht_ss,
    N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_SHIFT: tl.constexpr,
    LN_DT: tl.constexpr, T_DT: tl.constexpr, U_DT: tl.constexpr, V_DT: tl.constexpr,
    PUSH_MEAN_FMA: tl.constexpr, PUSH_M2_FMA: tl.constexpr, COMB_MEAN: tl.constexpr,
    COMB_M2_FMA: tl.constexpr, AFFINE_FMA: tl.constexpr, UNIFORM: tl.constexpr,
    N_Q: tl.constexpr, STORE_OUT: tl.constexpr, OUT_DT: tl.constexpr, Q_MODE: tl.constexpr, NAN_SIGN: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_SCALE_TEMB: tl.constexpr, HAS_SHIFT_TEMB: tl.constexpr, CACHE_HINTS: tl.constexpr,
    X_HEADS: tl.constexpr = False,
):
    row, bi, si = program_row(S)
    if X_HEADS:  # x's rows are [B, H, S] (no modulate reads bi then): batch and head in int32, as program_row
        bh = tl.program_id(0) // S
        x_row = X + (bh // H).to(tl.int64) * x_sb + (bh % H).to(tl.int64) * x_sh + si * x_ss
    else:
        x_row = X + bi * x_sb + si * x_ss
    norm_modulate_row(
        x_row=x_row, x_sd=x_sd, W=W, B=B, sc_row=SCALE + bi * sc_sb + si * sc_ss,
        sh_row=SHIFT + bi * sh_sb + si * sh_ss, out_row=OUT + row * N, N=N, eps=eps,
        N_ITERS=N_ITERS, LANES=LANES, VEC=VEC, HAS_W=HAS_W, HAS_B=HAS_B, HAS_SHIFT=HAS_SHIFT,
        LN_DT=LN_DT, T_DT=T_DT, U_DT=U_DT, V_DT=V_DT,
        PUSH_MEAN_FMA=PUSH_MEAN_FMA, PUSH_M2_FMA=PUSH_M2_FMA, COMB_MEAN=COMB_MEAN, COMB_M2_FMA=COMB_M2_FMA,
        AFFINE_FMA=AFFINE_FMA, UNIFORM=UNIFORM,
        q_row=Q + row * N, q_plane=q_plane, S0=S0, S1=S1, S2=S2, S3=S3, q_lo=q_lo, q_hi=q_hi,
        N_Q=N_Q, STORE_OUT=STORE_OUT, OUT_DT=OUT_DT, Q_MODE=Q_MODE, NAN_SIGN=NAN_SIGN,
        sct_row=SCALE_T + bi * sct_sb + si * sct_ss, sht_row=SHIFT_T + bi * sht_sb + si * sht_ss, HAS_SCALE=HAS_SCALE,
        HAS_SCALE_TEMB=HAS_SCALE_TEMB, HAS_SHIFT_TEMB=HAS_SHIFT_TEMB, CACHE_HINTS=CACHE_HINTS)


@triton.jit(do_not_specialize=["S", "H"])
def _short_rows_kernel(X, W, B, OUT, M, N, S, H, eps, x_sb, x_ss, x_sd, x_sh,
                       R: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, LN_DT: tl.constexpr,
                       PUSH_MEAN_FMA: tl.constexpr, PUSH_M2_FMA: tl.constexpr, COMB_MEAN: tl.constexpr,
                       COMB_M2_FMA: tl.constexpr, AFFINE_FMA: tl.constexpr, X_HEADS: tl.constexpr):
    """R rows of N <= SHORT_ROW elements: statistics, normalize, affine, one rounding to LN_DT, stored in OUT's
    dtype (``modulate_store`` without a modulate). Rows are [B, S] (or [B, H, S] with X_HEADS) of x's strides; the
    output is contiguous."""
    rows = tl.program_id(0) * R + tl.arange(0, R)  # int32: divisions stay short (program_row)
    si = (rows % S).to(tl.int64)
    if X_HEADS:
        bh = rows // S
        base = (bh // H).to(tl.int64) * x_sb + (bh % H).to(tl.int64) * x_sh + si * x_ss
    else:
        base = (rows // S).to(tl.int64) * x_sb + si * x_ss
    col = tl.arange(0, 32)[:, None] * 4 + tl.arange(0, 4)[None, :]  # [WARP, VEC]: short_rows_stats' tile
    mask = (rows < M)[:, None, None] & (col < N)[None, :, :]
    x = tl.load(X + base[:, None, None] + (col * x_sd)[None, :, :], mask=mask, other=0.0).to(tl.float32)
    mean, rstd = short_rows_stats(x, N, eps, R, PUSH_MEAN_FMA, PUSH_M2_FMA, COMB_MEAN, COMB_M2_FMA)
    w = x
    b = x
    if HAS_W:
        w = tl.load(W + col, mask=col < N, other=0.0).to(tl.float32)[None, :, :]
    if HAS_B:
        b = tl.load(B + col, mask=col < N, other=0.0).to(tl.float32)[None, :, :]
    y = layer_norm_apply_affine(x, mean[:, None, None], rstd[:, None, None], w, b, HAS_W, HAS_B, AFFINE_FMA)
    out = OUT + rows.to(tl.int64)[:, None, None] * N + col[None, :, :]
    tl.store(out, round_to(y, LN_DT).to(OUT.dtype.element_ty), mask=mask)


SHORT_ROWS = 16  # rows a program of _short_rows_kernel


def plan_short_rows(a):
    """A launch of ``_short_rows_kernel`` for family layer_norm's arguments (``a``: x as [M, D], [B, S, D] or
    [B, H, S, D] rows, D <= SHORT_ROW, no modulate), or None where that kernel does not apply."""
    x = a.x
    D = x.shape[-1]
    if D > SHORT_ROW or a.scale is not None or a.shift is not None:
        return None
    heads = x.dim() == 4
    ln_dt, _, _, _, final = result_dtypes(x.dtype, None, None, a.ln_dtype, a.out_dtype)
    M, S = x.numel() // D, x.shape[-2] if x.dim() >= 3 else 1
    x_strides = (x.stride(0), x.stride(2), x.stride(-1), x.stride(1)) if heads else \
        (*batch_token_strides(x, x), x.stride(-1), 0)
    const = dict(R=SHORT_ROWS, HAS_W=a.weight is not None, HAS_B=a.bias is not None, LN_DT=DT_CODE[ln_dt],
                 **DEFAULT_VARIANT.constexprs(), AFFINE_FMA=True, X_HEADS=heads)
    kernel = CachedLaunch(_short_rows_kernel, (-(-M // SHORT_ROWS),), const, num_warps=4)
    shape, device = x.shape, x.device

    def launch(a):
        x = a.x
        out = torch.empty(shape, dtype=final, device=device)
        kernel(x, a.weight if a.weight is not None else x, a.bias if a.bias is not None else x, out, M, D, S,
               x.shape[1] if heads else 1, a.eps, *x_strides)
        return out

    return launch


def use_cache_hints(ln_dt: torch.dtype) -> bool:
    """Whether the kernel loads the row evict-first and streams the output (``norm_modulate_row``'s CACHE_HINTS):
    for rows normalized in 16 bits, where the two together are faster (neither is alone); rows normalized in fp32
    (Wan's FP32LayerNorm) are no faster with them."""
    return ln_dt in (torch.bfloat16, torch.float16)


def batch_token_strides(t: torch.Tensor | None, x: torch.Tensor) -> tuple[int, int]:
    """(batch, token) strides of ``t`` broadcast to x's rows ([M, D]: (row, 0)); (0, 0) for None."""
    if t is None:
        return 0, 0
    e = t.expand(x.shape)
    return (e.stride(0), e.stride(1)) if x.dim() == 3 else (e.stride(0), 0)


def modulate_constexprs(D, weight, bias, shift, ln_dt, t_dt, u_dt, v_dt) -> dict:
    """The constexprs of ``norm_modulate_row`` for one layout (the leading ones; the trailing HAS_* flags of
    the second addends are the caller's)."""
    n_iters = n_iters_for(D)
    return dict(
        N_ITERS=n_iters, LANES=LANES, VEC=VEC,
        HAS_W=weight is not None, HAS_B=bias is not None, HAS_SHIFT=shift is not None,
        LN_DT=DT_CODE[ln_dt], T_DT=DT_CODE[t_dt], U_DT=DT_CODE[u_dt], V_DT=DT_CODE[v_dt],
        **DEFAULT_VARIANT.constexprs(), AFFINE_FMA=True, UNIFORM=is_uniform(D, n_iters),
    )


def plan_norm_modulate(a, quant: tuple[int, str, bool] | None = None):
    """A launch for inputs of this layout: ``a`` holds the op's arguments by name (lowering/norm_modulate.py;
    ``can_use_norm_modulate`` accepted them), and so does the launch's argument.

    ``quant``: ``(n, q_mode, keep_out)`` for ``diffusion_fuse::norm_modulate_quant`` (the launch then reads that
    op's quantizer arguments too and returns its Tensor[]), None for ``norm_modulate``.
    """
    x, scale, shift, scale_temb, shift_temb = a.x, a.scale, a.shift, a.scale_temb, a.shift_temb
    D = x.shape[-1]
    S = x.shape[-2] if x.dim() >= 3 else 1
    heads = x.dim() == 4  # rows [B, H, S] (family layer_norm: no modulate)
    if heads and (scale is not None or shift is not None):
        raise ValueError("rows of three dims take no modulate")
    ln_dt, t_dt, u_dt, v_dt, final = result_dtypes(
        x.dtype, sum_dtype(scale, scale_temb), sum_dtype(shift, shift_temb), a.ln_dtype, a.out_dtype)
    shape, device = x.shape, x.device
    x_strides = (x.stride(0), x.stride(2), x.stride(-1), x.stride(1)) if heads else \
        (*batch_token_strides(x, x), x.stride(-1), 0)
    strides = (*x_strides, *batch_token_strides(scale, x), *batch_token_strides(shift, x))
    temb_strides = (*batch_token_strides(scale_temb, x), *batch_token_strides(shift_temb, x))
    epi = QuantEpilogue(quant, shape, DT_CODE[final], device)
    const = {**modulate_constexprs(D, a.weight, a.bias, shift, ln_dt, t_dt, u_dt, v_dt), **epi.constexprs,
             "HAS_SCALE": scale is not None, "HAS_SCALE_TEMB": scale_temb is not None,
             "HAS_SHIFT_TEMB": shift_temb is not None,
             "CACHE_HINTS": use_cache_hints(ln_dt), "X_HEADS": heads}
    kernel = CachedLaunch(_norm_modulate_kernel, (x.numel() // D,), const, num_warps=LANES // 32)

    def launch(a):
        x = a.x
        scale = a.scale if a.scale is not None else x  # a placeholder pointer: HAS_SCALE=False reads no scale
        out = torch.empty(shape, dtype=final, device=device) if epi.keep_out else x
        q_args, q = epi.args(x, a) if quant else epi.args(x)
        kernel(x, a.weight if a.weight is not None else x, a.bias if a.bias is not None else x, scale,
               a.shift if a.shift is not None else scale, out, D, S, x.shape[1] if heads else 1, a.eps, *strides,
               *q_args,
               a.scale_temb if a.scale_temb is not None else scale, a.shift_temb if a.shift_temb is not None else scale,
               *temb_strides)
        return out if q is None else epi.outputs([], out, q)

    return launch
