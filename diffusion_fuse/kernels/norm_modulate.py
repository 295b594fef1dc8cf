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
a scale (HAS_SCALE=False: a LayerNorm read by no modulate, gated_residual_norm_modulate only), ``out =
round_out(y)``.

Inputs: x [M, D] or [B, S, D] with any strides (eager LayerNorm copies a non-contiguous input
to a fresh, aligned buffer and normalizes the same values; a unit stride along D, the usual
case, is specialized by Triton),
D % 4 == 0 (the guard in lowering/norm_modulate.py routes everything else to the
reference); scale/shift anything that broadcasts to x with unit stride along D ([B,1,D],
[B,S,D], strided per-token slices of [B,S,6,D]).
Verified shapes: see tests/gpu/test_norm_modulate_gpu.py and BENCHMARKS.md.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from .fp8_quant import QuantEpilogue, load_scales, store_quants
from .launch import CachedLaunch
from .layer_norm_stats import (
    DEFAULT_VARIANT,
    LANES,
    VEC,
    is_uniform,
    layer_norm_apply_affine,
    load_row_group_tile,
    load_row_tile,
    n_iters_for,
    program_row,
    row_tile_trip,
    row_values_per_lane,
    welford_row_stats,
    welford_tile_stats,
)

_DT_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


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
def ln_modulate_row(
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
    HAS_SHIFT_TEMB: tl.constexpr = False, ONE_EXCHANGE: tl.constexpr = False, CACHE_HINTS: tl.constexpr = 0,
):
    """One row: eager's LayerNorm statistics, then normalize, modulate and store (the contract above).

    Quant epilogue (kernels/fp8_quant.py), when N_Q > 0: the output, rounded to its dtype (OUT_DT),
    is also quantized with each of the N_Q scales S0.. and stored at ``q_row + i * q_plane``; the
    output itself is stored only if STORE_OUT. sct_row/sht_row: rows of scale's/shift's second addends,
    read when HAS_SCALE_TEMB/HAS_SHIFT_TEMB (Wan's timestep table); HAS_SCALE=False: no modulate.

    A row of N == N_ITERS * 512 (UNIFORM) is read once into registers (``ln_modulate_tile``);
    other rows are read twice (statistics, then output; the second read mostly hits L2).
    """
    s0, s1, s2, s3 = load_scales(S0, S1, S2, S3, N_Q)
    if UNIFORM:
        ln_modulate_tile(load_row_tile(x_row, x_sd, N_ITERS, LANES, VEC, (CACHE_HINTS & 1) != 0), W, B, sc_row, sh_row, out_row, N, eps,
                         N_ITERS, LANES, VEC, HAS_W, HAS_B, HAS_SHIFT, LN_DT, T_DT, U_DT, V_DT,
                         PUSH_MEAN_FMA, PUSH_M2_FMA, COMB_MEAN, COMB_M2_FMA, AFFINE_FMA,
                         q_row, q_plane, s0, s1, s2, s3, q_lo, q_hi, N_Q, STORE_OUT, OUT_DT, Q_MODE, NAN_SIGN,
                         sct_row, sht_row, HAS_SCALE, HAS_SCALE_TEMB, HAS_SHIFT_TEMB, ONE_EXCHANGE=ONE_EXCHANGE,
                         CACHE_HINTS=CACHE_HINTS)
    else:
        mean, rstd = welford_row_stats(x_row, N, x_sd, eps, N_ITERS, LANES, VEC,
                                       PUSH_MEAN_FMA, PUSH_M2_FMA, COMB_MEAN, COMB_M2_FMA, UNIFORM)
        lane = tl.arange(0, LANES)
        col = tl.arange(0, VEC)
        for it in tl.static_range(N_ITERS):  # unrolled: the trips' loads are independent, keep them in flight
            offs = (it * LANES + lane)[:, None] * VEC + col[None, :]
            mask = offs < N
            x = tl.load(x_row + offs * x_sd, mask=mask, other=0.0).to(tl.float32)
            modulate_store(x, mean, rstd, offs, mask, W, B, sc_row, sh_row, out_row, HAS_W, HAS_B, HAS_SHIFT,
                           LN_DT, T_DT, U_DT, V_DT, AFFINE_FMA, q_row, q_plane, s0, s1, s2, s3, q_lo, q_hi,
                           N_Q, STORE_OUT, OUT_DT, Q_MODE, NAN_SIGN, sct_row, sht_row, HAS_SCALE, HAS_SCALE_TEMB,
                           HAS_SHIFT_TEMB)


@triton.jit
def ln_modulate_tile(
    tile, W, B, sc_row, sh_row, out_row, N, eps,
    N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_SHIFT: tl.constexpr,
    LN_DT: tl.constexpr, T_DT: tl.constexpr, U_DT: tl.constexpr, V_DT: tl.constexpr,
    PUSH_MEAN_FMA: tl.constexpr, PUSH_M2_FMA: tl.constexpr, COMB_MEAN: tl.constexpr,
    COMB_M2_FMA: tl.constexpr, AFFINE_FMA: tl.constexpr,
    q_row=None, q_plane=0, s0=1.0, s1=1.0, s2=1.0, s3=1.0, q_lo=0.0, q_hi=0.0,
    N_Q: tl.constexpr = 0, STORE_OUT: tl.constexpr = True, OUT_DT: tl.constexpr = 0, Q_MODE: tl.constexpr = 0,
    NAN_SIGN: tl.constexpr = True,
    sct_row=None, sht_row=None, HAS_SCALE: tl.constexpr = True, HAS_SCALE_TEMB: tl.constexpr = False,
    HAS_SHIFT_TEMB: tl.constexpr = False, ROWS: tl.constexpr = 1, ONE_EXCHANGE: tl.constexpr = False,
    CACHE_HINTS: tl.constexpr = 0,
):
    """``ln_modulate_row`` of a UNIFORM row held in registers (``load_row_tile`` layout).

    ROWS > 1: a row group (``load_row_group_tile`` tile; the row pointers sc_row, sh_row, out_row,
    q_row, sct_row, sht_row are then [ROWS * LANES, 1] tensors, each lane's row): every lane
    computes what it computes with one program per row, with its row's mean and rstd."""
    mean, rstd = welford_tile_stats(tile, N, eps, N_ITERS, LANES, VEC, PUSH_MEAN_FMA, PUSH_M2_FMA, COMB_MEAN,
                                    COMB_M2_FMA, ROWS=ROWS, ONE_EXCHANGE=ONE_EXCHANGE)
    if ROWS == 1:
        lane = tl.arange(0, LANES)
    else:
        lane = tl.arange(0, ROWS * LANES) % LANES
        mean = row_values_per_lane(mean, LANES)[:, None]
        rstd = row_values_per_lane(rstd, LANES)[:, None]
    col = tl.arange(0, VEC)
    for it in tl.static_range(N_ITERS):
        offs = (it * LANES + lane)[:, None] * VEC + col[None, :]
        x = row_tile_trip(tile, it, ROWS * LANES, VEC).to(tl.float32)
        modulate_store(x, mean, rstd, offs, offs < N, W, B, sc_row, sh_row, out_row, HAS_W, HAS_B, HAS_SHIFT,
                       LN_DT, T_DT, U_DT, V_DT, AFFINE_FMA, q_row, q_plane, s0, s1, s2, s3, q_lo, q_hi,
                       N_Q, STORE_OUT, OUT_DT, Q_MODE, NAN_SIGN, sct_row, sht_row, HAS_SCALE, HAS_SCALE_TEMB,
                       HAS_SHIFT_TEMB, STREAM_STORE=(CACHE_HINTS & 2) != 0)


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
        # STREAM_STORE: written once, read by the next kernel: st.global.cs (LaunchVariant.cache_hints)
        CM: tl.constexpr = ".cs" if STREAM_STORE else ""
        tl.store(out_row + offs, v.to(out_row.dtype.element_ty), mask=mask, cache_modifier=CM)
    if N_Q > 0:
        store_quants(q_row, q_plane, offs, mask, round_to(v, OUT_DT), s0, s1, s2, s3, q_lo, q_hi, N_Q, Q_MODE,
                     NAN_SIGN)


@triton.jit(do_not_specialize=["S", "q_plane", "q_lo", "q_hi"])
def _ln_modulate_kernel(
    X, W, B, SCALE, SHIFT, OUT,
    N, S, eps,
    x_sb, x_ss, x_sd, sc_sb, sc_ss, sh_sb, sh_ss,
    Q, q_plane, S0, S1, S2, S3, q_lo, q_hi,
    SCALE_T, SHIFT_T, sct_sb, sct_ss, sht_sb, sht_ss,
    N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_SHIFT: tl.constexpr,
    LN_DT: tl.constexpr, T_DT: tl.constexpr, U_DT: tl.constexpr, V_DT: tl.constexpr,
    PUSH_MEAN_FMA: tl.constexpr, PUSH_M2_FMA: tl.constexpr, COMB_MEAN: tl.constexpr,
    COMB_M2_FMA: tl.constexpr, AFFINE_FMA: tl.constexpr, UNIFORM: tl.constexpr,
    N_Q: tl.constexpr, STORE_OUT: tl.constexpr, OUT_DT: tl.constexpr, Q_MODE: tl.constexpr, NAN_SIGN: tl.constexpr,
    HAS_SCALE_TEMB: tl.constexpr, HAS_SHIFT_TEMB: tl.constexpr, ONE_EXCHANGE: tl.constexpr,
    CACHE_HINTS: tl.constexpr,
):
    row, bi, si = program_row(S)
    ln_modulate_row(X + bi * x_sb + si * x_ss, x_sd, W, B, SCALE + bi * sc_sb + si * sc_ss, SHIFT + bi * sh_sb + si * sh_ss,
                    OUT + row * N, N, eps, N_ITERS, LANES, VEC, HAS_W, HAS_B, HAS_SHIFT, LN_DT, T_DT, U_DT, V_DT,
                    PUSH_MEAN_FMA, PUSH_M2_FMA, COMB_MEAN, COMB_M2_FMA, AFFINE_FMA, UNIFORM,
                    Q + row * N, q_plane, S0, S1, S2, S3, q_lo, q_hi, N_Q, STORE_OUT, OUT_DT, Q_MODE, NAN_SIGN,
                    SCALE_T + bi * sct_sb + si * sct_ss, SHIFT_T + bi * sht_sb + si * sht_ss, True, HAS_SCALE_TEMB,
                    HAS_SHIFT_TEMB, ONE_EXCHANGE, CACHE_HINTS)


@triton.jit(do_not_specialize=["S", "M", "q_plane", "q_lo", "q_hi"])
def _ln_modulate_rows_kernel(
    X, W, B, SCALE, SHIFT, OUT,
    N, S, M, eps,
    x_sb, x_ss, x_sd, sc_sb, sc_ss, sh_sb, sh_ss,
    Q, q_plane, S0, S1, S2, S3, q_lo, q_hi,
    SCALE_T, SHIFT_T, sct_sb, sct_ss, sht_sb, sht_ss,
    N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_SHIFT: tl.constexpr,
    LN_DT: tl.constexpr, T_DT: tl.constexpr, U_DT: tl.constexpr, V_DT: tl.constexpr,
    PUSH_MEAN_FMA: tl.constexpr, PUSH_M2_FMA: tl.constexpr, COMB_MEAN: tl.constexpr,
    COMB_M2_FMA: tl.constexpr, AFFINE_FMA: tl.constexpr, UNIFORM: tl.constexpr, ROWS: tl.constexpr,
    N_Q: tl.constexpr, STORE_OUT: tl.constexpr, OUT_DT: tl.constexpr, Q_MODE: tl.constexpr, NAN_SIGN: tl.constexpr,
    HAS_SCALE_TEMB: tl.constexpr, HAS_SHIFT_TEMB: tl.constexpr, ONE_EXCHANGE: tl.constexpr,
):
    # UNIFORM rows only. Program p takes rows p, p + P, ..., p + (ROWS-1) P (P programs) and loads
    # the next row's tile before reducing the current one, so DRAM reads stay in flight through
    # the combine tree (with one row per program, each waits on memory, then on its reduction).
    # Rows past the end are clamped to the last row: at most ROWS - 1 programs recompute it and
    # store the same bits again.
    tl.static_assert(UNIFORM, "whole rows are held in registers")
    nprog = tl.num_programs(0)
    row = tl.program_id(0)  # int32 row indices, int64 offsets (program_row says why)
    s0, s1, s2, s3 = load_scales(S0, S1, S2, S3, N_Q)
    tile = load_row_tile(X + (row // S).to(tl.int64) * x_sb + (row % S).to(tl.int64) * x_ss, x_sd, N_ITERS, LANES,
                         VEC)
    for _ in range(ROWS):
        nxt = tl.minimum(row + nprog, M - 1)
        tile_next = load_row_tile(X + (nxt // S).to(tl.int64) * x_sb + (nxt % S).to(tl.int64) * x_ss, x_sd,
                                  N_ITERS, LANES, VEC)
        bi = (row // S).to(tl.int64)
        si = (row % S).to(tl.int64)
        row64 = row.to(tl.int64)
        ln_modulate_tile(tile, W, B, SCALE + bi * sc_sb + si * sc_ss, SHIFT + bi * sh_sb + si * sh_ss, OUT + row64 * N,
                         N, eps, N_ITERS, LANES, VEC, HAS_W, HAS_B, HAS_SHIFT, LN_DT, T_DT, U_DT, V_DT,
                         PUSH_MEAN_FMA, PUSH_M2_FMA, COMB_MEAN, COMB_M2_FMA, AFFINE_FMA,
                         Q + row64 * N, q_plane, s0, s1, s2, s3, q_lo, q_hi, N_Q, STORE_OUT, OUT_DT, Q_MODE,
                         NAN_SIGN, SCALE_T + bi * sct_sb + si * sct_ss, SHIFT_T + bi * sht_sb + si * sht_ss, True,
                         HAS_SCALE_TEMB, HAS_SHIFT_TEMB, ONE_EXCHANGE=ONE_EXCHANGE)
        tile = tile_next
        row = nxt


@triton.jit(do_not_specialize=["S", "M", "q_plane", "q_lo", "q_hi"])
def _ln_modulate_row_group_kernel(
    X, W, B, SCALE, SHIFT, OUT,
    N, S, M, eps,
    x_sb, x_ss, x_sd, sc_sb, sc_ss, sh_sb, sh_ss,
    Q, q_plane, S0, S1, S2, S3, q_lo, q_hi,
    SCALE_T, SHIFT_T, sct_sb, sct_ss, sht_sb, sht_ss,
    N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_SHIFT: tl.constexpr,
    LN_DT: tl.constexpr, T_DT: tl.constexpr, U_DT: tl.constexpr, V_DT: tl.constexpr,
    PUSH_MEAN_FMA: tl.constexpr, PUSH_M2_FMA: tl.constexpr, COMB_MEAN: tl.constexpr,
    COMB_M2_FMA: tl.constexpr, AFFINE_FMA: tl.constexpr, UNIFORM: tl.constexpr, ROWS: tl.constexpr,
    N_Q: tl.constexpr, STORE_OUT: tl.constexpr, OUT_DT: tl.constexpr, Q_MODE: tl.constexpr, NAN_SIGN: tl.constexpr,
    HAS_SCALE_TEMB: tl.constexpr, HAS_SHIFT_TEMB: tl.constexpr, ONE_EXCHANGE: tl.constexpr,
):
    # UNIFORM rows only. A row group: program p takes rows ROWS*p .. ROWS*p + ROWS - 1 with 4 warps
    # per row (launched with num_warps = 4 * ROWS): warps 4r .. 4r+3 hold row r in the lanes, trips
    # and tree of the one-row kernel, so every row's bits are the one-row kernel's. A program has
    # ROWS rows of loads in flight at the registers per thread of one row (NOTES.md, idea 1).
    # Rows past the end (odd M) are clamped to the last row: its lanes recompute it and store the
    # same bits again.
    tl.static_assert(UNIFORM, "whole rows are held in registers")
    GL: tl.constexpr = ROWS * LANES
    # each lane's row; int32 row indices, int64 offsets (program_row says why)
    row = tl.minimum(tl.program_id(0) * ROWS + tl.arange(0, GL) // LANES, M - 1)
    bi = (row // S).to(tl.int64)
    si = (row % S).to(tl.int64)
    row64 = row.to(tl.int64)
    s0, s1, s2, s3 = load_scales(S0, S1, S2, S3, N_Q)
    tile = load_row_group_tile(X + bi * x_sb + si * x_ss, x_sd, N_ITERS, LANES, VEC)
    bi = bi[:, None]
    si = si[:, None]
    row64 = row64[:, None]
    ln_modulate_tile(tile, W, B, SCALE + bi * sc_sb + si * sc_ss, SHIFT + bi * sh_sb + si * sh_ss, OUT + row64 * N,
                     N, eps, N_ITERS, LANES, VEC, HAS_W, HAS_B, HAS_SHIFT, LN_DT, T_DT, U_DT, V_DT,
                     PUSH_MEAN_FMA, PUSH_M2_FMA, COMB_MEAN, COMB_M2_FMA, AFFINE_FMA,
                     Q + row64 * N, q_plane, s0, s1, s2, s3, q_lo, q_hi, N_Q, STORE_OUT, OUT_DT, Q_MODE,
                     NAN_SIGN, SCALE_T + bi * sct_sb + si * sct_ss, SHIFT_T + bi * sht_sb + si * sht_ss, True,
                     HAS_SCALE_TEMB, HAS_SHIFT_TEMB, ROWS, ONE_EXCHANGE)


ROWS_PER_PROGRAM = 1  # >1: programs that prefetch the next row; measured slower on H200 (NOTES.md)


@dataclasses.dataclass(frozen=True)
class LaunchVariant:
    """How the LayerNorm rows map onto programs and registers. Every variant computes the same operations
    in the same order (the same bits); they differ in speed only (NOTES.md, "ideas not tried yet").

    row_group: rows one program takes side by side, 4 warps each (``_ln_modulate_row_group_kernel``):
        more bytes in flight per program at the registers per thread of one row.
    one_exchange: the cross-warp combine levels read the warps' states from shared memory once, mean
        and m2 packed in one int64 (one barrier; separately they take three).
    max_registers: a register cap per thread (Triton's ``maxnreg``) for more programs per SM; a cap
        below the kernel's need spills to local memory (tests/kernels/test_compile_sm90.py reports).
    cache_hints: 1 evict-first loads of the row, 2 streaming (``.cs``) stores of the output, 3 both.
    row_group, one_exchange and cache_hints apply where D % 512 == 0 (rows held in registers); other D run
    the one-row kernel (with max_registers) without hints.
    """

    row_group: int = 1
    one_exchange: bool = False
    max_registers: int | None = None
    cache_hints: int = 0

    def __post_init__(self):
        if self.row_group not in (1, 2, 4):  # 4 rows: 16 warps, 512 threads
            raise ValueError(f"row_group={self.row_group}: 1, 2 or 4")
        if self.cache_hints not in (0, 1, 2, 3):
            raise ValueError(f"cache_hints={self.cache_hints}: 0, 1 (evict-first loads), 2 (streaming stores) or 3")
        if self.cache_hints and self.row_group > 1:
            raise ValueError("cache_hints apply to the one-row kernel only (row_group=1)")

    @property
    def label(self) -> str:
        parts = [f"{self.row_group} rows/{4 * self.row_group} warps" if self.row_group > 1 else "1 row/4 warps"]
        parts += ["1 exchange"] if self.one_exchange else []
        parts += [f"maxnreg {self.max_registers}"] if self.max_registers else []
        parts += [{1: "evict-first loads", 2: "streaming stores", 3: "evict-first loads, streaming stores"}[
            self.cache_hints]] if self.cache_hints else []
        return ", ".join(parts)

    def options(self) -> dict:
        """Triton launch options beyond num_warps and launch.EAGER_NUMERICS (none for the default)."""
        return {} if self.max_registers is None else {"maxnreg": self.max_registers}


LAUNCH_VARIANT = LaunchVariant()  # no hints: what NOTES.md measured (v4); the GPU decides on the others
# Rows normalized in their own 16-bit dtype (FLUX, SD3.5, Qwen-Image, ...) take both cache hints: evict-first
# row loads and streaming stores, together (not either alone), moved FLUX [1,4608,3072] from 18.3-18.5 to
# 17.1 µs steady (results/h200-2026-11-30j/run1/bench_norm.json). Wan's fp32-LN rows measured 1% slower
# with them, so they keep none.
HALF_LN_VARIANT = LaunchVariant(cache_hints=3)


def default_launch_variant(ln_dt: torch.dtype) -> LaunchVariant:
    """What ``plan_norm_modulate`` launches when not told: by the dtype the row is normalized in."""
    return HALF_LN_VARIANT if ln_dt in (torch.bfloat16, torch.float16) else LAUNCH_VARIANT
# Candidates the GPU test and benchmarks/bench_norm.py compare (FLUX/Wan2.2 D=3072 bf16 need 48 registers
# today, 40 without spilling: 12 programs per SM instead of 10; Wan2.1 D=5120 fp32-LN 71, 56: 9 instead of 7).
LAUNCH_CANDIDATES = {
    "default": LAUNCH_VARIANT,  # no hints (the op's own choice is default_launch_variant)
    "group2": LaunchVariant(row_group=2),
    "exchange1": LaunchVariant(one_exchange=True),
    "group2_exchange1": LaunchVariant(row_group=2, one_exchange=True),
    "exchange1_maxreg40": LaunchVariant(one_exchange=True, max_registers=40),
    "group2_exchange1_maxreg40": LaunchVariant(row_group=2, one_exchange=True, max_registers=40),
    "exchange1_maxreg56": LaunchVariant(one_exchange=True, max_registers=56),
    "evict_first": LaunchVariant(cache_hints=1),
    "stream_store": LaunchVariant(cache_hints=2),
    "evict_first_stream_store": LaunchVariant(cache_hints=3),
}


def _row_strides(t: torch.Tensor | None, x: torch.Tensor) -> tuple[int, int]:
    if t is None:
        return 0, 0
    e = t.expand(x.shape)
    return (e.stride(0), e.stride(1)) if x.dim() == 3 else (e.stride(0), 0)


def modulate_constexprs(D, weight, bias, shift, ln_dt, t_dt, u_dt, v_dt, variant, affine_fma) -> dict:
    """The constexprs of ``ln_modulate_row`` for one layout (the leading ones; the trailing HAS_* flags of
    the second addends are the caller's)."""
    n_iters = n_iters_for(D)
    return dict(
        N_ITERS=n_iters, LANES=LANES, VEC=VEC,
        HAS_W=weight is not None, HAS_B=bias is not None, HAS_SHIFT=shift is not None,
        LN_DT=_DT_CODE[ln_dt], T_DT=_DT_CODE[t_dt], U_DT=_DT_CODE[u_dt], V_DT=_DT_CODE[v_dt],
        **variant.constexprs(), AFFINE_FMA=affine_fma, UNIFORM=is_uniform(D, n_iters),
    )


def plan_norm_modulate(a, variant=DEFAULT_VARIANT, affine_fma: bool = True, rows_per_program: int | None = None,
                       quant: tuple[int, str, bool] | None = None, nan_sign: bool | None = None,
                       launch_variant: LaunchVariant | None = None):
    """A launch for inputs of this layout: ``a`` holds the op's arguments by name (lowering/norm_modulate.py;
    ``can_use_norm_modulate`` accepted them), and so does the launch's argument.

    ``quant``: ``(n, q_mode, keep_out)`` for ``diffusion_fuse::norm_modulate_quant`` (the launch then reads that
    op's quantizer arguments too and returns its Tensor[]), None for ``norm_modulate``.
    ``rows_per_program`` (default ROWS_PER_PROGRAM; D % 512 == 0 only): rows one 4-warp program takes one
    after the other. ``launch_variant`` (default ``default_launch_variant``): see ``LaunchVariant``. Every choice of
    both gives the same bits.
    """
    x, scale, shift, scale_temb, shift_temb = a.x, a.scale, a.shift, a.scale_temb, a.shift_temb
    D = x.shape[-1]
    S = x.shape[1] if x.dim() == 3 else 1
    ln_dt, t_dt, u_dt, v_dt, final = result_dtypes(
        x.dtype, sum_dtype(scale, scale_temb), sum_dtype(shift, shift_temb), a.ln_dtype, a.out_dtype)
    shape, device = x.shape, x.device
    strides = (*_row_strides(x, x), x.stride(-1), *_row_strides(scale, x), *_row_strides(shift, x))
    temb_strides = (*_row_strides(scale_temb, x), *_row_strides(shift_temb, x))
    epi = QuantEpilogue(quant, shape, _DT_CODE[final], device, nan_sign)
    if launch_variant is not None:
        lv = launch_variant
    else:  # the hints need the one-row kernel
        lv = default_launch_variant(ln_dt) if (rows_per_program or ROWS_PER_PROGRAM) == 1 else LAUNCH_VARIANT
    const = {**modulate_constexprs(D, a.weight, a.bias, shift, ln_dt, t_dt, u_dt, v_dt, variant, affine_fma),
             **epi.constexprs, "HAS_SCALE_TEMB": scale_temb is not None, "HAS_SHIFT_TEMB": shift_temb is not None,
             "ONE_EXCHANGE": lv.one_exchange}
    rows = x.numel() // D
    per_program = ROWS_PER_PROGRAM if rows_per_program is None else rows_per_program
    if (lv.row_group > 1 or lv.cache_hints) and per_program > 1:
        raise ValueError("a row group or cache hints and rows_per_program > 1 do not combine")
    options = lv.options()
    if lv.row_group > 1 and const["UNIFORM"] and rows > 0:
        kernel = CachedLaunch(_ln_modulate_row_group_kernel, (triton.cdiv(rows, lv.row_group),),
                              dict(const, ROWS=lv.row_group), num_warps=lv.row_group * LANES // 32, **options)
        sizes = (D, S, rows)
    elif per_program > 1 and const["UNIFORM"] and rows > 0:
        kernel = CachedLaunch(_ln_modulate_rows_kernel, (triton.cdiv(rows, per_program),),
                              dict(const, ROWS=per_program), num_warps=LANES // 32, **options)
        sizes = (D, S, rows)
    else:
        kernel = CachedLaunch(_ln_modulate_kernel, (rows,), dict(const, CACHE_HINTS=lv.cache_hints),
                              num_warps=LANES // 32, **options)
        sizes = (D, S)

    def launch(a):
        x, scale = a.x, a.scale
        out = torch.empty(shape, dtype=final, device=device) if epi.keep_out else x
        q_args, q = epi.args(x, a) if quant else epi.args(x)
        kernel(x, a.weight if a.weight is not None else x, a.bias if a.bias is not None else x, scale,
               a.shift if a.shift is not None else scale, out, *sizes, a.eps, *strides, *q_args,
               a.scale_temb if a.scale_temb is not None else scale, a.shift_temb if a.shift_temb is not None else scale,
               *temb_strides)
        return out if q is None else epi.outputs([], out, q)

    return launch
