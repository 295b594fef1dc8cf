"""Triton kernel for ``diffusion_fuse::rms_norm`` and ``diffusion_fuse::rms_norm_chain``.

What eager computes (``aten._fused_rms_norm``, torch 2.11, CUDA)
================================================================

``torch.nn.RMSNorm`` / ``F.rms_norm`` → ``rms_norm_symint`` (``aten/src/ATen/native/layer_norm.cpp``)
calls ``at::_fused_rms_norm`` when the weight (if any) has the input's dtype and the input is
neither channels-last nor complex; otherwise it runs ``rms_norm_composite`` (the pow → mean →
rsqrt chain, which the ``rms_norm_chain`` family sees). ``_fused_rms_norm_cuda``
(``aten/src/ATen/native/cuda/layer_norm_kernel.cu``; torch 2.11's libtorch_cuda.so holds its
``vectorized_layer_norm_kernel<T, T, true>`` instantiations) reuses LayerNorm's kernels with
``template <..., bool rms_norm>``:

* ``X = input.expect_contiguous()``, ``Y`` a fresh contiguous tensor, ``rstd`` fp32 ``[M]``;
  ``eps = static_cast<float>(eps.value_or(FLT_EPSILON))``.
* The vectorized kernel runs when T is float/Half/BFloat16, ``N <= 2**24``, ``N % 4 == 0`` and
  X, Y and gamma are aligned to ``4 * sizeof(T)``; else ``RowwiseMomentsCUDAKernel`` (generic
  Welford, ``rsqrt(m2 + m1*m1 + eps)``) — not replicated, the guard sends those inputs to the
  reference path. One block of (32, 4) threads per row, as for LayerNorm
  (kernels/layer_norm_stats.py).
* Per thread ``t`` (vectors ``t, t+128, ...`` of 4 elements, in order), ``cuWelfordOnlineSum<rms>``:
  ``sigma2 = sigma2 + val * val`` — nvcc contracts it to ``fma(val, val, sigma2)`` (PUSH_FMA,
  the default; the GPU test checks the alternative too).
* ``cuWelfordCombine<rms>``: ``sigma2 = dataB.sigma2 + dataA.sigma2`` over the same shfl_down
  tree (offsets 16..1 in each warp) and cross-warp tree (warp y takes y+2, then y+1) as LayerNorm.
  A plain fp32 add is commutative, so only the pairing matters, not the operand order.
* ``var = sigma2 / float(N)`` (div.rn), ``rstd = rsqrtf(var + eps)`` (MUFU.RSQ, as LayerNorm).
* Output, in float, rounded once to T on store: ``gamma * (rstd * x)`` or ``rstd * x``.

Numerics contract
=================
``rms_norm`` (lossless): for x of a dtype in {fp32, fp16, bf16}, D % 4 == 0, D <= 16384, a
weight of x's dtype (or none), eager's vectorized-kernel inputs (the guard in
lowering/rms_norm.py), the kernel returns eager's bits: the sum of squares in exactly the order
above, then each op of the replaced chain in fp32, rounded to its eager result dtype::

    y = round_T(rn(w * rn(x * rstd)))        # _fused_rms_norm's output (no w: round_T(x * rstd))
    t = round_t(scale + 1); u = round_u(y * t); v = round_v(u + shift); out = round_out(v)   # optional

``rms_norm_rope`` (lossless): ``rms_norm``'s output y (rounded to x's dtype, no modulate), then diffusers'
``apply_rotary_emb`` (use_real, pairs along D) as eager runs it, each op rounded as there::

    rot = (-y[..., 1::2], y[..., 0::2]) interleaved      # neg (a sign flip: -0 for +0) and stack: exact
    out = round_T(rn(rn(y * cos) + rn(rot * sin)))        # fp32 cos/sin broadcast over rows, unit stride along D

Launched with ``launch.EAGER_NUMERICS`` (no FMA contraction, libdevice without its FTZ reflect: ``rsqrt`` is
``rsqrt.approx.f32``, as eager's ``rsqrtf``); the only FMA is the PUSH_FMA push. Verified shapes:
tests/gpu/test_rms_norm_gpu.py.

``rms_norm_chain`` (tier high, not exact): the same sum of squares, ``h = x * rstd`` in fp32,
then the tail of the matched chain with each op rounded to its eager dtype::

    h = round_c1(h); h = round_w(h * w); h = round_b(h + b); h = round_c2(h); then the modulate

Eager computes the mean with ATen's generic reduce kernel (``pow`` rounded to fp32, a
launch-config-dependent summation order, ``sum * (1/N)``), which is not replicated: the result
differs from eager by a few ulps of the normalized value; the verifier checks it within
``rtol``/``atol``.

Layout: x is addressed as rows over up to three leading dims, each with its own stride, and a
stride along D (lowering/rms_norm.py merges the leading dims); scale/shift broadcast to x with
unit stride along D. Small rows: eager's rows of D <= 512 occupy the first ``D/4`` lanes only and
the lanes past them add +0.0 at every tree level, so a group of 128 lanes packs ``128 / LPR`` rows
(``LPR = next_pow2(D/4)`` lanes each) and runs the tree levels below LPR: the same sums, bit
for bit, with all 128 threads busy. Rows of D <= 512 run ``SMALL_D_ROW_GROUPS`` such groups per
program, each thread a lane of every group, all their loads issued before the first shuffle (one
group's bytes per thread are too few to cover DRAM latency).

Lane epilogue (rows of D = 32, 64, 128 with unit stride along D, the QK norms of FLUX, FLUX.2 and Wan):
each lane keeps the 4-element vector it loaded in registers, the tree's levels run as butterflies
(``shfl.sync.bfly``: lane l adds the same pair as shfl_down's lane l mod offset, and an fp32 add is
commutative, so every lane ends with lane 0's sum), and the lane normalizes, applies the tail and RoPE
(pairs lie inside its vector) and stores its own elements: x is read once, and nothing goes through shared
memory. The row path below reads x a second time in a [ROWS, BLOCK] tile. The shuffles assume lane f is thread
f % 128, a layout Triton chooses: each plan reads its build's shuffle layouts on first use
(``lane_layout_problem``) and runs the row path where they differ (logged; ``LANE_EPILOGUE_REJECTED``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..log import get_logger
from . import triton_interpret
from .launch import CachedLaunch
from .layer_norm_stats import LANES, USE_SHUFFLES, VEC, WARP, _as_f32, _shfl_down, is_uniform
from .norm_modulate import DT_CODE, result_dtypes, round_to
from .optional_triton import tl, triton

if triton_interpret():  # the interpreter runs no inline PTX: the sign flip (equal to neg.f32 but on NaN payloads)
    @triton.jit
    def neg_f32(x):
        return (x.to(tl.int32, bitcast=True) ^ -2147483648).to(tl.float32, bitcast=True)
else:
    @triton.jit
    def neg_f32(x):
        # -x as C++ negates a float (PTX neg.f32, what eager's neg kernel runs). Triton's unary minus is
        # 0 - x: +0 for +0 where eager gives -0 (kernels/pointwise_ops.py neg_code, the same choice).
        return tl.inline_asm_elementwise("neg.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)


_log = get_logger("kernels")


@dataclasses.dataclass(frozen=True)
class Tail:
    """The ops after ``h = x * rstd`` (fp32), by the dtype each rounds to (None: the op is absent).

    ``c1``/``c2``: casts before/after the weight and bias; ``w``/``b``/``t``/``u``/``v``: result
    dtypes of ``* weight``, ``+ bias``, ``scale + 1``, ``* (scale + 1)``, ``+ shift``.
    """

    c1: torch.dtype | None = None
    w: torch.dtype | None = None
    b: torch.dtype | None = None
    c2: torch.dtype | None = None
    t: torch.dtype | None = None
    u: torch.dtype | None = None
    v: torch.dtype | None = None


def _modulate_tail(y_dtype, scale, shift, out_dtype, **tail):
    if scale is None:
        return Tail(**tail), y_dtype
    _, t_dt, u_dt, v_dt, final = result_dtypes(y_dtype, scale.dtype, None if shift is None else shift.dtype, None,
                                               out_dtype)
    return Tail(**tail, t=t_dt, u=u_dt, v=v_dt if shift is not None else None), final


def rms_norm_tail(x_dtype, weight, scale, shift, out_dtype):
    """(Tail, output dtype) of ``rms_norm``: round_T(w * (x * rstd)), then the modulate."""
    return _modulate_tail(x_dtype, scale, shift, out_dtype, w=torch.float32 if weight is not None else None,
                          c2=x_dtype)


def rms_norm_chain_tail(cast1, weight, bias, cast2, scale, shift, out_dtype):
    """(Tail, output dtype) of ``rms_norm_chain`` under eager's type promotion."""
    h = cast1 or torch.float32
    w_dt = None if weight is None else torch.promote_types(h, weight.dtype)
    h = w_dt or h
    b_dt = None if bias is None else torch.promote_types(h, bias.dtype)
    h = cast2 or b_dt or h
    return _modulate_tail(h, scale, shift, out_dtype, c1=cast1, w=w_dt, b=b_dt, c2=cast2)


MAX_ROWS_PER_PROGRAM = 16  # LPR >= 8 lanes: small rows of D <= 32 share a program 16 at a time
# Row groups per program for rows of one trip (D <= 512): each thread holds a lane of every group, so its loads
# of all groups are in flight before the first reduction. One group of a [*, 128] QK row is 8 bytes per thread,
# too little to cover DRAM latency (benchmarks/bench_rms_norm.py times 1, 2, 4 and 8).
SMALL_D_ROW_GROUPS = 4


@triton.jit
def _sum_level(s, OUTER: tl.constexpr, HALF: tl.constexpr):
    # One shfl_down(HALF) level on a flat [OUTER*2*HALF] state, by relayout: in each block of
    # 2*HALF lanes, lane j < HALF takes s[j] + s[j + HALF] (the interpreter's path).
    lo, hi = tl.split(tl.permute(tl.reshape(s, [OUTER, 2, HALF]), [0, 2, 1]))
    return tl.reshape(lo + hi, [OUTER * HALF])


@triton.jit
def _shfl_sum(s, HALF: tl.constexpr):
    # The same level as warp shuffles: lane l takes s[l] + s[l + HALF] (what shfl_down gives).
    return s + _shfl_down(s, HALF)


@triton.jit
def _lane_group_leaders(v, GROUPS: tl.constexpr, G: tl.constexpr):
    # [GROUPS*G] -> [GROUPS]: the first lane of each group, bit for bit (integer sum with zeros).
    first = tl.arange(0, G)[None, :] == 0
    bits = tl.reshape(v.to(tl.int32, bitcast=True), [GROUPS, G])
    return tl.sum(tl.where(first, bits, 0), axis=1).to(tl.float32, bitcast=True)


@triton.jit
def _shfl_bfly_sum(s, HALF: tl.constexpr):
    # One level as a butterfly: lane l takes s[l] + s[l ^ HALF]. For l < HALF that is shfl_down's pair
    # (l, l + HALF); lane l + HALF adds the same two values the other way round, and an fp32 add is
    # commutative, so after the last level every lane of the row holds what shfl_down leaves in its lane 0.
    bits = tl.inline_asm_elementwise(
        "shfl.sync.bfly.b32 $0, $1, $2, 0x1f, -1;", "=r,r,r",
        [s.to(tl.int32, bitcast=True), tl.full(s.shape, HALF, tl.int32)],
        dtype=tl.int32, is_pure=True, pack=1)
    return s + bits.to(tl.float32, bitcast=True)


@triton.jit
def _warp_levels(s, LPR: tl.constexpr, BFLY: tl.constexpr):
    # the shfl_down levels LPR/2 .. 1 inside each row's LPR lanes: as shfl_down (lane 0 of a row ends with its
    # sum) or as butterflies (every lane does, _shfl_bfly_sum)
    if LPR >= 32:
        s = _shfl_bfly_sum(s, 16) if BFLY else _shfl_sum(s, 16)
    if LPR >= 16:
        s = _shfl_bfly_sum(s, 8) if BFLY else _shfl_sum(s, 8)
    if LPR >= 8:
        s = _shfl_bfly_sum(s, 4) if BFLY else _shfl_sum(s, 4)
    if LPR >= 4:
        s = _shfl_bfly_sum(s, 2) if BFLY else _shfl_sum(s, 2)
    if LPR >= 2:
        s = _shfl_bfly_sum(s, 1) if BFLY else _shfl_sum(s, 1)
    return s


@triton.jit
def _row_tree(s, ROWS: tl.constexpr, LPR: tl.constexpr, SHUFFLE: tl.constexpr):
    # [ROWS * LPR] lane sums -> [ROWS]: the shfl_down levels LPR/2 .. 1 inside each row's lanes, lane 0's result
    if SHUFFLE:
        return _lane_group_leaders(_warp_levels(s, LPR, False), ROWS, LPR)
    else:  # the interpreter: the same levels as reshapes
        if LPR >= 32:
            s = _sum_level(s, ROWS, 16)
        if LPR >= 16:
            s = _sum_level(s, ROWS, 8)
        if LPR >= 8:
            s = _sum_level(s, ROWS, 4)
        if LPR >= 4:
            s = _sum_level(s, ROWS, 2)
        if LPR >= 2:
            s = _sum_level(s, ROWS, 1)
        return s


@triton.jit
def rms_lane_row_sums(xv, ROWS: tl.constexpr, LPR: tl.constexpr, PUSH_FMA: tl.constexpr,
                      SHUFFLE: tl.constexpr = USE_SHUFFLES):
    """[ROWS*LPR] fp32: every lane holds its row's sum of squares, in eager's order (rows of one trip, a row
    inside one warp: LPR <= 32). ``xv`` is [ROWS*LPR, 4] fp32, lane f = r * LPR + l holding columns 4l..4l+3
    of row r. The lanes push their four squares in order, then the shfl_down levels below LPR as butterflies
    (``_shfl_bfly_sum``), so the sum reaches every lane of its row with no relayout (the lane epilogue)."""
    L: tl.constexpr = ROWS * LPR
    tl.static_assert(LPR <= 32, "a row inside one warp")
    even, odd = tl.split(tl.reshape(xv, [L, 2, 2]))
    c0, c2 = tl.split(even)
    c1, c3 = tl.split(odd)
    s = tl.zeros([L], tl.float32)
    if PUSH_FMA:
        s = tl.fma(c3, c3, tl.fma(c2, c2, tl.fma(c1, c1, tl.fma(c0, c0, s))))
    else:
        s = s + c0 * c0
        s = s + c1 * c1
        s = s + c2 * c2
        s = s + c3 * c3
    if SHUFFLE:
        return _warp_levels(s, LPR, True)
    else:  # the interpreter: the same levels by relayout down to one value a row, then broadcast to its lanes
        s = _row_tree(s, ROWS, LPR, False)
        return tl.reshape(tl.broadcast_to(s[:, None], [ROWS, LPR]), [L])


@triton.jit
def rms_row_sum_squares(
    x_lanes, lane_ok, N, stride_d,
    N_ITERS: tl.constexpr, ROWS: tl.constexpr, LPR: tl.constexpr, VEC: tl.constexpr,
    PUSH_FMA: tl.constexpr, UNIFORM: tl.constexpr, SHUFFLE: tl.constexpr = USE_SHUFFLES,
):
    """[ROWS] fp32 sums of squares in eager's order; flat lane f = r * LPR + l is lane l of row r.

    ``x_lanes`` ([ROWS*LPR] pointers, or the row's pointer when ROWS == 1) is the start of each
    lane's row, ``lane_ok`` whether that row exists. Lane l pushes the elements of vectors l,
    l+LPR, ... in order; then the intra-warp shfl_down levels below LPR and the cross-warp levels
    of the (32, 4) block. Masked elements load as 0.0 and leave the sums unchanged
    (fma(0, 0, s) == s). Lane f is thread f (1-D blocked layout, as in
    kernels/layer_norm_stats.py), which the shuffles rely on.
    """
    W_LANES: tl.constexpr = LPR if LPR < 32 else 32  # lanes of a row inside one warp
    NWR: tl.constexpr = LPR // W_LANES  # warps per row
    L: tl.constexpr = ROWS * LPR
    # 4 warps: lane f is thread f % 128, in register f // 128 (row groups: each thread holds a lane of every group,
    # all loaded before the first shuffle; tests/kernels/test_rms_norm_kernel.py checks that layout in the sm_90 build)
    tl.static_assert(L % (4 * 32) == 0, "one program is 4 warps, lane f in thread f % 128")
    tl.static_assert(VEC == 4, "the column split below is written for vec_size 4")
    lane = tl.arange(0, L) % LPR if ROWS > 1 else tl.arange(0, L)  # (no % when it is the identity: vector loads)
    col = tl.arange(0, VEC)
    s = tl.zeros([L], tl.float32)
    for it in tl.static_range(N_ITERS):
        c = (it * LPR + lane)[:, None] * VEC + col[None, :]  # [L, VEC] column of each element
        if ROWS == 1:  # one program per row: x_lanes is the row's pointer
            ptrs = x_lanes + c * stride_d
            if UNIFORM:  # every column exists
                xv = tl.load(ptrs)
            else:
                xv = tl.load(ptrs, mask=c < N, other=0.0)
        else:
            ptrs = x_lanes[:, None] + c * stride_d
            if UNIFORM:
                xv = tl.load(ptrs, mask=lane_ok[:, None], other=0.0)
            else:
                xv = tl.load(ptrs, mask=lane_ok[:, None] & (c < N), other=0.0)
        # [L, 4] -> columns 0..3 without arithmetic: (a, b) = col 2a+b.
        even, odd = tl.split(tl.reshape(xv.to(tl.float32), [L, 2, 2]))
        c0, c2 = tl.split(even)
        c1, c3 = tl.split(odd)
        if PUSH_FMA:
            s = tl.fma(c3, c3, tl.fma(c2, c2, tl.fma(c1, c1, tl.fma(c0, c0, s))))
        else:
            s = s + c0 * c0
            s = s + c1 * c1
            s = s + c2 * c2
            s = s + c3 * c3
    # intra-warp shfl_down levels that stay inside a row: lane l < off takes (l, l+off)
    s = _row_tree(s, ROWS * NWR, W_LANES, SHUFFLE)
    # cross-warp through shared memory: warp y < off takes (y, y+off)
    if NWR >= 4:
        s = _sum_level(s, ROWS, 2)
    if NWR >= 2:
        s = _sum_level(s, ROWS, 1)
    return s


@triton.jit
def _row_offsets(r, L1, L2, s0, s1, s2, ROW_DIMS: tl.constexpr):
    # element offset of row r of a tensor whose rows are [L0, L1, L2] with strides (s0, s1, s2)
    # (kernels/rows.row_layout pads missing dims in front: one dim of rows is L2). Integer division
    # is slow on the GPU (an int64 one is a long routine, per lane): rows of one dim (the common case)
    # take none, two dims one; the row index is int32 unless M needs more, quotients widen only for
    # the stride products.
    if ROW_DIMS == 1:
        return r.to(tl.int64) * s2
    if ROW_DIMS == 2:
        return (r // L2).to(tl.int64) * s1 + (r % L2).to(tl.int64) * s2
    return ((r // (L1 * L2)).to(tl.int64) * s0 + ((r // L2) % L1).to(tl.int64) * s1
            + (r % L2).to(tl.int64) * s2)


@triton.jit
def _rms_lane_epilogue(X, W, B, SCALE, SHIFT, OUT, RSTD, x_lanes, lane_row, lane_ok, first, N, L1, L2, eps,
                       sc_s0, sc_s1, sc_s2, sh_s0, sh_s1, sh_s2, o_s0, o_s1, o_s2,
                       ROWS: tl.constexpr, LPR: tl.constexpr, VEC: tl.constexpr, PUSH_FMA: tl.constexpr,
                       STORE_RSTD: tl.constexpr, ROW_DIMS: tl.constexpr, C1_DT: tl.constexpr, HAS_W: tl.constexpr,
                       W_DT: tl.constexpr, HAS_B: tl.constexpr, B_DT: tl.constexpr, C2_DT: tl.constexpr,
                       HAS_SCALE: tl.constexpr, T_DT: tl.constexpr, U_DT: tl.constexpr, HAS_SHIFT: tl.constexpr,
                       V_DT: tl.constexpr, ROPE: tl.constexpr, SHARED_TRIG: tl.constexpr, N_POW2: tl.constexpr,
                       OD: tl.constexpr):
    # Rows of one trip whose every column exists (D == 4 * LPR), unit stride along D: lane f holds columns
    # 4l..4l+3 of its row as one vector, keeps them in registers through the sum (rms_lane_row_sums: the sum
    # reaches every lane of the row) and applies the tail, RoPE included, to them. The same ops as the row
    # path below, on the same values: only where each element lives differs.
    L: tl.constexpr = ROWS * LPR
    lane = tl.arange(0, L) % LPR
    c = lane[:, None] * VEC + tl.arange(0, VEC)[None, :]  # [L, VEC] column of each element
    lmask = lane_ok[:, None]
    xv = tl.load(x_lanes[:, None] + c, mask=lmask, other=0.0).to(tl.float32)
    if ROPE:  # cos/sin do not depend on the sums: their loads overlap x's and the reduction
        if SHARED_TRIG:  # the program's rows are heads of one token: its first row's cos/sin row
            cos = tl.load(SCALE + _row_offsets(first, L1, L2, sc_s0, sc_s1, sc_s2, ROW_DIMS) + c)
            sin = tl.load(SHIFT + _row_offsets(first, L1, L2, sh_s0, sh_s1, sh_s2, ROW_DIMS) + c)
        else:
            cos = tl.load(SCALE + _row_offsets(lane_row, L1, L2, sc_s0, sc_s1, sc_s2, ROW_DIMS)[:, None] + c,
                          mask=lmask, other=0.0)
            sin = tl.load(SHIFT + _row_offsets(lane_row, L1, L2, sh_s0, sh_s1, sh_s2, ROW_DIMS)[:, None] + c,
                          mask=lmask, other=0.0)
    sumsq = rms_lane_row_sums(xv, ROWS, LPR, PUSH_FMA)
    if N_POW2 > 0:
        var = sumsq * (1.0 / N_POW2)
    else:
        var = tl.math.div_rn(sumsq, tl.cast(N, tl.float32))
    rstd = tl.math.rsqrt(var + eps)
    if STORE_RSTD:
        tl.store(RSTD + lane_row, rstd, mask=lane_ok & (lane == 0))
    y = round_to(xv * rstd[:, None], C1_DT)
    if HAS_W:
        y = round_to(y * tl.load(W + c).to(tl.float32), W_DT)
    if HAS_B:
        y = round_to(y + tl.load(B + c).to(tl.float32), B_DT)
    y = round_to(y, C2_DT)
    if HAS_SCALE:
        sc = tl.load(SCALE + _row_offsets(lane_row, L1, L2, sc_s0, sc_s1, sc_s2, ROW_DIMS)[:, None] + c,
                     mask=lmask, other=0.0).to(tl.float32)
        y = round_to(y * round_to(sc + 1.0, T_DT), U_DT)
    if HAS_SHIFT:
        sh = tl.load(SHIFT + _row_offsets(lane_row, L1, L2, sh_s0, sh_s1, sh_s2, ROW_DIMS)[:, None] + c,
                     mask=lmask, other=0.0).to(tl.float32)
        y = round_to(y + sh, V_DT)
    if ROPE:  # pairs (2k, 2k+1) lie inside a lane's four columns: the rotation stays in registers
        even, odd = tl.split(tl.reshape(y, [L, VEC // 2, 2]))
        rot = tl.reshape(tl.join(neg_f32(odd), even), [L, VEC])
        y = y * cos + rot * sin
    o_lanes = OUT + _row_offsets(lane_row, L1, L2, o_s0, o_s1, o_s2, OD)
    tl.store(o_lanes[:, None] + c, y.to(OUT.dtype.element_ty), mask=lmask)


@triton.jit(do_not_specialize=["M", "L1", "L2"])  # strides specialize (% 16, == 1): vector loads and stores
def _rms_norm_kernel(
    X, W, B, SCALE, SHIFT, OUT, RSTD,
    M, N, L1, L2, eps,
    x_s0, x_s1, x_s2, x_sd, sc_s0, sc_s1, sc_s2, sh_s0, sh_s1, sh_s2, o_s0, o_s1, o_s2, o_sd,
    N_ITERS: tl.constexpr, ROWS: tl.constexpr, LPR: tl.constexpr, VEC: tl.constexpr,
    PUSH_FMA: tl.constexpr, UNIFORM: tl.constexpr, STORE_RSTD: tl.constexpr,
    ROW_DIMS: tl.constexpr, WIDE_ROWS: tl.constexpr,
    C1_DT: tl.constexpr, HAS_W: tl.constexpr, W_DT: tl.constexpr, HAS_B: tl.constexpr, B_DT: tl.constexpr,
    C2_DT: tl.constexpr, HAS_SCALE: tl.constexpr, T_DT: tl.constexpr, U_DT: tl.constexpr,
    HAS_SHIFT: tl.constexpr, V_DT: tl.constexpr, ROPE: tl.constexpr = False, SHARED_TRIG: tl.constexpr = False,
    L2_CONST: tl.constexpr = 0, N_POW2: tl.constexpr = 0, X_FLAT: tl.constexpr = False,
    O_FLAT: tl.constexpr = False, LANE_EPI: tl.constexpr = False,
):
    if L2_CONST > 0:  # rows over several dims: the innermost (heads) is a constant, its divisions a multiply
        L2 = L2_CONST
    # X_FLAT / O_FLAT: x's / out's rows are evenly strided (row r at r * s2) even where scale/shift or cos/sin
    # need the rows' dims (RoPE tables broadcast over heads)
    XD: tl.constexpr = 1 if X_FLAT else ROW_DIMS
    OD: tl.constexpr = 1 if O_FLAT else ROW_DIMS
    if WIDE_ROWS:  # M >= 2**31 - 2**8: row indices in int64
        first = tl.program_id(0).to(tl.int64) * ROWS
    else:
        first = tl.program_id(0) * ROWS
    if ROWS == 1:
        x_lanes = X + _row_offsets(first, L1, L2, x_s0, x_s1, x_s2, XD)  # one row: a scalar pointer
        lane_ok = first < M
    else:
        lane_row = first + tl.arange(0, ROWS * LPR) // LPR
        x_lanes = X + _row_offsets(lane_row, L1, L2, x_s0, x_s1, x_s2, XD)
        lane_ok = lane_row < M
    if LANE_EPI:  # the whole row in the lanes that loaded it (lane_epilogue_ok): no second read of x, no relayout
        _rms_lane_epilogue(
            X=X, W=W, B=B, SCALE=SCALE, SHIFT=SHIFT, OUT=OUT, RSTD=RSTD, x_lanes=x_lanes, lane_row=lane_row,
            lane_ok=lane_ok, first=first, N=N, L1=L1, L2=L2, eps=eps,
            sc_s0=sc_s0, sc_s1=sc_s1, sc_s2=sc_s2, sh_s0=sh_s0, sh_s1=sh_s1, sh_s2=sh_s2, o_s0=o_s0, o_s1=o_s1,
            o_s2=o_s2,
            ROWS=ROWS, LPR=LPR, VEC=VEC, PUSH_FMA=PUSH_FMA, STORE_RSTD=STORE_RSTD, ROW_DIMS=ROW_DIMS, C1_DT=C1_DT,
            HAS_W=HAS_W, W_DT=W_DT, HAS_B=HAS_B, B_DT=B_DT, C2_DT=C2_DT, HAS_SCALE=HAS_SCALE, T_DT=T_DT, U_DT=U_DT,
            HAS_SHIFT=HAS_SHIFT, V_DT=V_DT, ROPE=ROPE, SHARED_TRIG=SHARED_TRIG, N_POW2=N_POW2, OD=OD)
        return
    r = first + tl.arange(0, ROWS)
    row_ok = r < M
    BLOCK: tl.constexpr = LPR * VEC
    cols = tl.arange(0, BLOCK)
    sc_off = _row_offsets(r, L1, L2, sc_s0, sc_s1, sc_s2, ROW_DIMS)[:, None]
    sh_off = _row_offsets(r, L1, L2, sh_s0, sh_s1, sh_s2, ROW_DIMS)[:, None]
    if ROPE and N_ITERS == 1:  # cos/sin do not depend on the sums: their loads overlap x's and the reduction
        if SHARED_TRIG:  # the program's rows are heads of one token: one cos/sin row, read once, broadcast
            one = (cols < N)[None, :]
            cos_pre = tl.load(SCALE + _row_offsets(first, L1, L2, sc_s0, sc_s1, sc_s2, ROW_DIMS) + cols[None, :],
                              mask=one, other=0.0)
            sin_pre = tl.load(SHIFT + _row_offsets(first, L1, L2, sh_s0, sh_s1, sh_s2, ROW_DIMS) + cols[None, :],
                              mask=one, other=0.0)
        else:
            pre_mask = row_ok[:, None] & (cols < N)[None, :]
            cos_pre = tl.load(SCALE + sc_off + cols[None, :], mask=pre_mask, other=0.0)
            sin_pre = tl.load(SHIFT + sh_off + cols[None, :], mask=pre_mask, other=0.0)
    sumsq = rms_row_sum_squares(x_lanes=x_lanes, lane_ok=lane_ok, N=N, stride_d=x_sd, N_ITERS=N_ITERS, ROWS=ROWS,
                                LPR=LPR, VEC=VEC, PUSH_FMA=PUSH_FMA, UNIFORM=UNIFORM)
    if N_POW2 > 0:  # x / 2**k and x * 2**-k are the same real number, rounded once: the same bits
        var = sumsq * (1.0 / N_POW2)
    else:
        var = tl.math.div_rn(sumsq, tl.cast(N, tl.float32))
    rstd = tl.math.rsqrt(var + eps)
    if STORE_RSTD:
        tl.store(RSTD + r, rstd, mask=row_ok)
    x_rows = X + _row_offsets(r, L1, L2, x_s0, x_s1, x_s2, XD)
    o_off = _row_offsets(r, L1, L2, o_s0, o_s1, o_s2, OD)[:, None]
    for it in range(N_ITERS):
        c = it * BLOCK + cols
        mask = row_ok[:, None] & (c < N)[None, :]
        x = tl.load(x_rows[:, None] + (c * x_sd)[None, :], mask=mask, other=0.0).to(tl.float32)
        y = round_to(x * rstd[:, None], C1_DT)
        if HAS_W:
            y = round_to(y * tl.load(W + c, mask=c < N, other=0.0).to(tl.float32)[None, :], W_DT)
        if HAS_B:
            y = round_to(y + tl.load(B + c, mask=c < N, other=0.0).to(tl.float32)[None, :], B_DT)
        y = round_to(y, C2_DT)
        if HAS_SCALE:
            t = round_to(tl.load(SCALE + sc_off + c[None, :], mask=mask, other=0.0).to(tl.float32) + 1.0, T_DT)
            y = round_to(y * t, U_DT)
        if HAS_SHIFT:
            y = round_to(y + tl.load(SHIFT + sh_off + c[None, :], mask=mask, other=0.0).to(tl.float32), V_DT)
        if ROPE:  # SCALE/SHIFT are cos/sin (fp32): y.float() * cos + rotate(y).float() * sin, three fp32 ops
            if N_ITERS == 1:
                cos, sin = cos_pre, sin_pre
            else:
                cos = tl.load(SCALE + sc_off + c[None, :], mask=mask, other=0.0)
                sin = tl.load(SHIFT + sh_off + c[None, :], mask=mask, other=0.0)
            # rotate pairs (2k, 2k+1) -> (-y[2k+1], y[2k]) in registers (BLOCK is even, pairs never straddle it)
            even, odd = tl.split(tl.reshape(y, [ROWS, BLOCK // 2, 2]))
            rot = tl.reshape(tl.join(neg_f32(odd), even), [ROWS, BLOCK])
            y = y * cos + rot * sin  # enable_fp_fusion=False: two roundings of the products, one of the sum
        tl.store(OUT + o_off + (c * o_sd)[None, :], y.to(OUT.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------
# Launch plans
# ----------------------------------------------------------------------------------------


def tail_constexprs(tail: Tail) -> dict:
    """The kernel's constexprs for the ops after ``x * rstd`` (``Tail``)."""

    def code(dt):
        return DT_CODE[dt] if dt is not None else 0  # fp32: no rounding

    return dict(C1_DT=code(tail.c1), HAS_W=tail.w is not None, W_DT=code(tail.w), HAS_B=tail.b is not None,
                B_DT=code(tail.b), C2_DT=code(tail.c2), HAS_SCALE=tail.t is not None, T_DT=code(tail.t),
                U_DT=code(tail.u), HAS_SHIFT=tail.v is not None, V_DT=code(tail.v))


def lanes_per_row(D: int) -> int:
    """Lanes a row of D elements needs (a power of two <= 128); 128 when D > 512."""
    need = triton.cdiv(D, VEC)
    return LANES if need >= LANES else max(LANES // MAX_ROWS_PER_PROGRAM, triton.next_power_of_2(need))


def row_groups(D: int) -> int:
    """Row groups per program: ``SMALL_D_ROW_GROUPS`` for rows of one trip (D <= 512), else 1."""
    return SMALL_D_ROW_GROUPS if triton.cdiv(D, VEC) <= LANES else 1


def shared_trig_groups(D: int, rows) -> int | None:
    """Row groups per program with which every program's rows share one cos/sin row (RoPE over heads: the
    tables broadcast along the last row dim, whose length the program's rows divide), or None. The most groups
    up to ``SMALL_D_ROW_GROUPS`` that allow it; rows of one trip only (D <= 512)."""
    (_, _, L2), (_, scs, shs, _) = rows
    lpr = lanes_per_row(D)
    if triton.cdiv(D, VEC) > LANES or scs[2] != 0 or shs[2] != 0:
        return None
    g = SMALL_D_ROW_GROUPS
    while g >= 1 and L2 % (g * LANES // lpr):
        g //= 2
    return g if g >= 1 else None


def stats_constexprs(D: int, push_fma: bool = True, groups: int | None = None) -> dict:
    """``groups`` row groups of ``128 / LPR`` rows per program (default ``row_groups(D)``); the sums are the
    same for any: each row keeps its lanes and tree."""
    lpr = lanes_per_row(D)
    n_iters = max(1, triton.cdiv(triton.cdiv(D, VEC), lpr))
    groups = row_groups(D) if groups is None else groups
    if groups < 1 or groups & (groups - 1):
        raise ValueError(f"groups must be a power of two >= 1, got {groups}")
    return dict(N_ITERS=n_iters, ROWS=groups * LANES // lpr, LPR=lpr, VEC=VEC, PUSH_FMA=push_fma,
                UNIFORM=is_uniform(D, n_iters, lpr, VEC))


def evenly_strided(sizes, strides) -> bool:
    """Whether row r of rows [L0, L1, L2] with these strides lies at r * strides[2], as ``_row_offsets``
    addresses it with one dim (for rows over one dim it does already)."""
    (L0, L1, L2), (s0, s1, s2) = sizes, strides
    return (L1 == 1 or s1 == L2 * s2) and (L0 == 1 or s0 == L1 * L2 * s2)


def addressing_constexprs(D: int, rows, rope: bool) -> dict:
    """How the kernel addresses rows without divisions it can avoid (``rows`` as ``plan_rms_norm`` takes it)."""
    (L0, L1, L2), (xs, scs, shs, os_) = rows
    dims = row_dims(L0, L1)
    return dict(
        # RoPE over [..., tokens, heads, D]: the innermost row dim is one the cos/sin tables do not vary along,
        # the heads (FLUX's 24; fixed per model, one compile). As a constant, each row's division by it is a
        # multiply-high instead of an int32 division routine per lane (six per thread). Any other innermost
        # dim may be the tokens ([B, S, D] rows, [B, H, S, D] with tables along S), which change with the
        # resolution: it stays an argument.
        L2_CONST=L2 if dims >= 2 and rope and scs[2] == 0 and shs[2] == 0 else 0,
        N_POW2=D if D & (D - 1) == 0 else 0,  # var = sum * 2**-k, no division routine
        X_FLAT=dims > 1 and evenly_strided((L0, L1, L2), xs),
        O_FLAT=dims > 1 and evenly_strided((L0, L1, L2), os_),
    )


def row_dims(L0: int, L1: int) -> int:
    """How many of the row dims [L0, L1, L2] ``_row_offsets`` must divide out (row_layout pads in front)."""
    return 3 - (L0 == 1) - (L0 == L1 == 1)


def _expanded_strides(t: torch.Tensor | None, shape) -> tuple[int, ...] | None:
    return None if t is None else t.expand(shape).stride()


def lane_epilogue_ok(const: dict, x_stride_d: int, out_stride_d: int) -> bool:
    """Whether the lane epilogue (``_rms_lane_epilogue``) can take these launch constants: rows of one trip
    with every column present (D = 4 * LPR: 32, 64 or 128), a row inside one warp, several rows a program,
    unit stride along D for x and the output (one 4-element vector a lane)."""
    return (const["N_ITERS"] == 1 and const["UNIFORM"] and const["ROWS"] > 1 and const["LPR"] <= 32
            and x_stride_d == 1 and out_stride_d == 1)


def lane_layout_problem(compiled, rows_per_thread: int) -> str | None:
    """None when every warp shuffle of the compiled kernel works on a [n] state whose element f is thread
    f % 128 (register f // 128), the order the sums rely on; else what Triton chose instead. Triton treats an
    inline-asm shuffle as elementwise and may give it another layout where its consumers prefer one: the lane
    epilogue is then not taken."""
    import re

    ttgir = compiled.asm.get("ttgir", "")
    defs = dict(line.split(" = ", 1) for line in ttgir.splitlines() if line.startswith("#") and " = " in line)

    def resolve(layout: str) -> str:  # aliases (#blocked, #linear1) spelled out
        return re.sub(r"#\w+", lambda m: resolve(defs[m.group(0)]) if m.group(0) in defs else m.group(0), layout)

    got = set()
    for line in ttgir.splitlines():
        if "shfl.sync" in line:
            m = re.search(r"-> tensor<\d+xi32, (.+?)> loc\(", line)
            got.add(resolve(m.group(1)) if m else line.strip()[:120])
    if not got:
        return "no warp shuffles found in the compiled kernel"
    regs = ", ".join(f"[{128 << b}]" for b in range(rows_per_thread.bit_length() - 1))
    # the same map three ways: a linear layout; one element a thread over 4 warps, wrapping into registers;
    # dim 0 of a [n, k] tile held one row a thread (the lane epilogue's sums of its [n, 4] x)
    want = {f"#ttg.linear<{{register = [{regs}], lane = [[1], [2], [4], [8], [16]], warp = [[32], [64]], block = []}}>",
            "#ttg.blocked<{sizePerThread = [1], threadsPerWarp = [32], warpsPerCTA = [4], order = [0]}>"}
    row_slice = re.compile(r"#ttg\.slice<\{dim = 1, parent = #ttg\.blocked<\{sizePerThread = \[1, \d+\], "
                           r"threadsPerWarp = \[32, 1\], warpsPerCTA = \[4, 1\], order = \[1, 0\]\}>\}>")
    bad = sorted(g for g in got if g not in want and not row_slice.fullmatch(g))
    return None if not bad else f"shuffle layouts {bad}"


class _LaneOrRows:
    """The lane-epilogue launch, checked on its first call: Triton compiles it for the call's arguments
    (``warmup``, no launch) and the shuffles' layout is read from the build (``lane_layout_problem``). A build
    that fails the check, or a check that raises, switches this plan to the row-layout launch for good, logged
    once; both launches compute the same bits, so nothing is lost but the speed."""

    def __init__(self, lane: CachedLaunch, rows: CachedLaunch, rows_per_thread: int) -> None:
        self.lane, self.rows, self.rows_per_thread = lane, rows, rows_per_thread
        self.active: CachedLaunch | None = None

    def __call__(self, *args) -> None:
        if self.active is None:
            choice = self._choose(args)
            if choice is None:
                return  # the build was deferred (a dry run collecting compiles launches nothing): choose next call
            self.active = choice
        self.active(*args)

    def _choose(self, args) -> CachedLaunch | None:
        if triton_interpret():
            return self.lane
        try:
            lane = self.lane
            compiled = lane.kernel.warmup(*args, grid=lane.grid, **lane.constexprs, **lane.options)
            if compiled is None:  # Triton's jit_cache_hook skipped the build (lowering/precompile.py's dry run)
                return None
            problem = lane_layout_problem(compiled, self.rows_per_thread)
        except Exception as e:  # noqa: BLE001 - the row launch is always there
            problem = f"{type(e).__name__}: {e}"
        if problem is None:
            return self.lane
        _log.warning("rms_norm: lane epilogue not taken for this layout (%s); the row epilogue runs", problem)
        LANE_EPILOGUE_REJECTED.append(problem)
        return self.rows


LANE_EPILOGUE_REJECTED: list[str] = []  # why a plan's lane epilogue was not taken (tests, reports)


def plan_rms_norm(x, out_shape, out_strides, out_dtype, weight, bias, eps, scale, shift, tail: Tail,
                  rows, push_fma: bool = True, store_rstd: bool = False, rope: bool = False,
                  groups: int | None = None, lane_epilogue: bool = True):
    """A launch for inputs of this layout (the guards in lowering/rms_norm.py accepted them).

    ``rows`` is ``(sizes[3], strides[3] of x, scale, shift, out)`` from ``kernels.rows.row_layout``.
    ``rope``: scale and shift are RoPE's cos and sin (fp32), applied to the rounded output (``rms_norm_rope``).
    ``groups``: row groups per program (``stats_constexprs``); by default, with ``rope``, the most with which each
    program's rows share one cos/sin row, read once per program (``shared_trig_groups``: heads of one token),
    else ``row_groups(D)``. With any ``groups``, a program whose rows share one cos/sin row reads it once.
    ``lane_epilogue``: normalize in the lanes that loaded x (``_rms_lane_epilogue``) where ``lane_epilogue_ok``
    allows it (and the build's shuffle layouts do, ``_LaneOrRows``); False: the row epilogue (same bits).
    Returns ``launch(x, weight, bias, scale, shift, out=None) -> (out, rstd or None)``; ``out`` (optional) is
    written in place and must have ``out_shape`` and ``out_strides``.
    """
    D = x.shape[-1]
    M = x.numel() // D
    (L0, L1, L2), (xs, scs, shs, os_) = rows
    shared = shared_trig_groups(D, rows) if rope else None
    if groups is None and shared is not None:
        groups = shared
    const = dict(**stats_constexprs(D, push_fma, groups), STORE_RSTD=store_rstd, ROW_DIMS=row_dims(L0, L1),
                 WIDE_ROWS=M >= 2**31 - 2**8, **tail_constexprs(tail), ROPE=rope)
    const.update(addressing_constexprs(D, rows, rope))
    # every program's rows lie in one run of L2 rows (L2 % ROWS == 0, so M % ROWS == 0: no partial program)
    const["SHARED_TRIG"] = shared is not None and const["N_ITERS"] == 1 and L2 % const["ROWS"] == 0
    grid = (triton.cdiv(M, const["ROWS"]),)
    kernel = CachedLaunch(_rms_norm_kernel, grid, {**const, "LANE_EPI": False}, num_warps=LANES // WARP)
    if lane_epilogue and lane_epilogue_ok(const, x.stride(-1), out_strides[-1]):
        lanes = CachedLaunch(_rms_norm_kernel, grid, {**const, "LANE_EPI": True}, num_warps=LANES // WARP)
        kernel = _LaneOrRows(lanes, kernel, const["ROWS"] * const["LPR"] // LANES)
    device = x.device
    eps32 = _as_f32(eps)
    args = (M, D, L1, L2, eps32, *xs, x.stride(-1), *scs, *shs, *os_, out_strides[-1])

    def launch(x, weight, bias, scale, shift, out=None):
        # out: a view to write into, of the planned shape and strides (rms_norm_cat_rope's two halves)
        if out is None:
            out = torch.empty_strided(out_shape, out_strides, dtype=out_dtype, device=device)
        rstd = torch.empty(M if store_rstd else 0, dtype=torch.float32, device=device)
        if M:
            kernel(x, weight if weight is not None else x, bias if bias is not None else x,
                   scale if scale is not None else x, shift if shift is not None else x, out, rstd, *args)
        return out, (rstd if store_rstd else None)

    return launch


def rms_norm_exact(x2d: torch.Tensor, weight: torch.Tensor | None = None, eps: float | None = 1e-6, *,
                   push_fma: bool = True, groups: int | None = None,
                   lane_epilogue: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton replica of ``torch.ops.aten._fused_rms_norm(x2d, [N], weight, eps)`` on CUDA: (y, rstd [M]).

    For tests and benchmarks; the op (lowering/rms_norm.py) caches plans per layout instead.
    """
    if x2d.dim() != 2:
        raise ValueError("x2d must be 2-D")
    M, D = x2d.shape
    if eps is None:
        eps = float(torch.finfo(torch.float32).eps)
    tail = Tail(w=torch.float32 if weight is not None else None, c2=x2d.dtype)
    rows = ((1, 1, M), ((0, 0, x2d.stride(0)), (0, 0, 0), (0, 0, 0), (0, 0, D)))
    launch = plan_rms_norm(x2d, (M, D), (D, 1), x2d.dtype, weight, None, eps, None, None, tail, rows,
                           push_fma=push_fma, store_rstd=True, groups=groups, lane_epilogue=lane_epilogue)
    return launch(x2d, weight, None, None, None)


# ----------------------------------------------------------------------------------------
# CPU model of eager's order (numpy float32: every op rounded once, as the GPU rounds it)
# ----------------------------------------------------------------------------------------


def emulate_rms_sum_squares(x2d: torch.Tensor, push_fma: bool = False) -> np.ndarray:
    """Per-row fp32 sums of squares in ``vectorized_layer_norm_kernel<T, float, true>``'s order.

    With push_fma=False every operation is one IEEE fp32 op, so this is bit-exact for that
    variant (and equals what Triton's interpreter computes, whose ``tl.fma`` is a mul then an
    add). push_fma=True rounds fma via float64 (exact product, then the sum rounded twice; rare
    double rounding): a logic model, not a reference.
    """
    x = x2d.detach().to("cpu", torch.float32).numpy()
    m, n = x.shape
    nvec = -(-n // VEC)
    iters = max(1, -(-nvec // LANES))
    xv = np.zeros((m, iters * LANES * VEC), np.float32)
    xv[:, :n] = x
    xv = xv.reshape(m, iters, LANES, VEC)
    s = np.zeros((m, LANES), np.float32)
    for it in range(iters):
        for k in range(VEC):
            v = xv[:, it, :, k]
            if push_fma:
                s = (v.astype(np.float64) * v.astype(np.float64) + s.astype(np.float64)).astype(np.float32)
            else:
                s = s + v * v
    s = s.reshape(m, LANES // WARP, WARP)
    half = WARP // 2
    while half >= 1:  # shfl_down tree inside each warp
        s = s[..., :half] + s[..., half:2 * half]
        half //= 2
    s = s.reshape(m, LANES // WARP)
    half = s.shape[1] // 2
    while half >= 1:  # cross-warp tree
        s = s[:, :half] + s[:, half:2 * half]
        half //= 2
    return s[:, 0]

