"""``x.float().pow(2).mean(-1, keepdim=True)`` in one pass, summed in the order of ATen's reduce kernel.

diffusers' ``RMSNorm`` (LTX's and Lumina's block norms, QK norms; SANA's) computes its variance as
``hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)``: eager writes the fp32 squares (a
[rows, D] fp32 tensor), then ``reduce_kernel<512, 1>`` reads them back and writes the means. These kernels
read x once and write the means: at Qwen-Image's QK norms (4608 tokens x 24 heads of 128 per q or k, 1024²)
the squares alone would be 57 MB written and read again, 240 times a forward. Where the norm's tail reads the
mean on rows a generated pointwise kernel can hold (QK norms), that kernel sums them itself with ``row_sums``.

Numerics contract (what the result must equal bitwise, for the rows ``can_use_mean_square`` accepts):
ATen's ``mean_kernel_cuda`` launches ``gpu_reduce_kernel`` with ``MeanOps`` (``reduce``/``combine``: ``a + b``
in fp32; ``project``: ``a * factor``, ``factor = float(outputs) / numel``) over the contiguous last dim of the
squares (a fresh fp32 tensor: rows start 16-byte aligned when D % 4 == 0). ``ReduceConfig`` for a reduced dim of
D elements and at least 16 rows gives one row to ``LPR`` lanes of a warp (``block_width``: the largest power of two
<= D, or <= D / 4 when it vectorizes the input, at most 32) and 16 rows of 32 lanes a block, as long as
``values_per_thread`` (D / 32) stays under 256 (D < 8192, ``MAX_D``). Lane t's part of a row, then the warp:

- **strided lanes** (no vectorized input): lane t reads elements t, t + LPR, ... (at most 4 of them when D <= 128,
  ``vt0 = 4`` accumulators of one element each, combined in order ``((a0 + a1) + a2) + a3``, which is the
  sequential sum: unused accumulators hold 0, which adds exactly);
- **vector lanes** (ATen vectorizes the input, 4 fp32 a load, when D % 4 == 0 and D >= 128): lane t reads
  the vectors t, t + LPR, ... (elements 4 (t + LPR k) + i), accumulator i takes element i of each vector in order,
  and the four are combined in order ``((a0 + a1) + a2) + a3``; at D = 128 every accumulator holds one element
  and this is the 4 elements summed in order;
- the LPR lanes by ``warp_shfl_down``, offsets descending (LPR/2, ..., 2, 1: torch since its warp reductions
  were made to match Triton's) or ascending (1, 2, ..., 16: earlier releases).

At D = 128 the sequential strided form is not eager's (measured, below); the D = 128 candidates (``LANE_FORMS``)
also include the accumulators combined as a tree ``(a0 + a1) + (a2 + a3)`` or by halves ``(a0 + a2) + (a1 + a3)``
(what a 64- or 128-lane block's shared-memory step gives).

Rows: x's leading dims, merged where they step evenly, as up to 3 strided dims (``rows_of``; a transposed
[B, H, S, D] view of a [B, S, H, D] projection, SD3.5's QK norms, is three), read in place. Eager's ``pow`` writes
the squares of any layout to a dense tensor and its reduce kernel sums each row in the order above whatever the
rows' order (``ReduceConfig`` reads the row count and D, not the strides; tests/gpu/test_mean_square_gpu.py checks
transposed and strided rows bitwise); the mean is contiguous [..., 1] either way.

Each square is ``x * x`` in fp32 of the exactly converted input, as eager's ``pow(x, 2)`` computes it; there
are no other roundings. Which form and warp order eager uses is found per device and D on first use
(``eager_order``: every candidate of ``candidates(D)`` against eager's mean of one wide-range [64, D] fp32
draw); the guard refuses a D for which none matches, and the verifier still checks every site.

Measured (H200, torch 2.11, ``tests/gpu/test_mean_square_gpu.py`` prints the differing rows per candidate):
strided lanes with descending offsets are eager's bits at D = 32 and 64 (bf16, fp16 and fp32 inputs over six
decades, 4097 and 4800 rows: no row differs; ascending: ~40% differ). At D = 128 **vectorized lanes with
descending offsets** are (no row differs at Qwen-Image's image and text q shapes, all three dtypes); every other
form differs in ~42% of rows. Fewer than 16 rows change the block shape (and the order): the reference path runs
them. On an H100 (same torch; ``tests/gpu/test_mean_square_gpu.py`` at D = 48, 96, 160, 1152, 2048, 2304, 2432,
5120, and a probe of torch emulations over 16 to 4608 rows): strided lanes are eager's below 128 (down to D = 8),
vector lanes from 128 through 6144 in multiples of 4; at 8192 and above no form is, nor at D % 4 != 0 above 128
(ATen sums a misaligned row's head apart). Every D is still decided on first use on the device itself.

Rows are walked in x's memory order (``memory_rows``): the sums do not depend on which program takes a row, and
SD3's [B, H, S, D] view of a [B, S, H, D] projection then streams through memory instead of jumping H * D elements
from row to row (the means are stored through the output's strides).

Three kernels. ``mean_square_kernel`` takes the D = 32, 64, 128 forms the lane kernels do not run: a program's 16
rows as a [16, 32] lane tensor, the warp tree as reshapes (Triton lays them out through shared memory). Eager's
descending forms run on lane kernels, with each thread holding a lane of several rows so that their loads are in
flight together (as the QK RMSNorm does) and the tree as warp shuffles on a state whose lane f is thread f % 128
(tests/kernels/test_mean_square_kernel.py checks that in the sm_90 build):

- ``mean_square_lanes_kernel``: vector lanes, one 4-element load a lane and iteration into four fp32 accumulators;
- ``mean_square_strided_lanes_kernel``: strided lanes; lane t loads elements t, t + LPR one at a time (a load that
  Triton vectorized would put several lanes in one thread).

The sums are the same bits as the generic kernel's (the tests check every kernel against one numpy model); the
lane kernels run eager's forms because they are faster (``benchmarks/bench_rms_norm.py`` times the op).

``row_sums`` is the same order as a function of a [R, D] tile that a kernel already holds: the generated pointwise
kernels (kernels/pointwise.py) sum an RMSNorm's variance inside the norm's tail with it, where a program's lanes
hold whole rows (D a power of two up to 1024; ``row_sum_form``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import triton_interpret
from .launch import CachedLaunch
from .layer_norm_stats import USE_SHUFFLES
from .optional_triton import tl, triton
from .rms_norm import _row_offsets, _row_tree, row_dims
from .rows import row_layout

LANES = 32  # a warp
ROWS = 16  # rows per program of mean_square_kernel (ATen's block: 16 rows of one warp each)
HEAD_DIMS = (32, 64, 128)  # the row sizes of mean_square_kernel's other forms (CANDIDATES)
MIN_D = 32  # rows shorter than a warp occur in tiny test models only; their squares stay eager's
MAX_D = 8188  # from 8192 ATen counts 256 values a lane (D / 32) and splits a row across warps: another order
MIN_ROWS = 16  # below this ATen's block is wider than a warp (another order)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# How lane t sums its part of a row (module docstring): its elements t + LPR i combined in order, as a tree, by
# halves; or its vectors t + LPR k, one accumulator per vector element, combined in order
SEQUENTIAL, TREE, HALVES, VECTOR = 0, 1, 2, 3
LANE_FORMS = {SEQUENTIAL: "sequential", TREE: "tree", HALVES: "halves", VECTOR: "vector"}
# (lane form, descending warp offsets): the orders eager_order tries at D = 32, 64, 128, the first the default where
# no GPU can be asked (Triton's interpreter), measured at D = 32, 64 (sequential) and 128 (vector), module docstring
CANDIDATES = {32: ((SEQUENTIAL, True), (SEQUENTIAL, False)), 64: ((SEQUENTIAL, True), (SEQUENTIAL, False)),
              128: ((VECTOR, True), (TREE, True), (HALVES, True), (SEQUENTIAL, True),
                    (TREE, False), (HALVES, False), (VECTOR, False), (SEQUENTIAL, False))}
LANE_GROUPS = 4  # lane kernels: rows of a 4-warp group per thread, loaded before the first shuffle
# vector lanes over rows of more than 4 vectors a lane: one row group a program, every vector unrolled up to
# MAX_UNROLLED a lane, else chunks of UNROLL in a loop
MAX_UNROLLED, UNROLL = 16, 8
_orders: dict[tuple, tuple[int, bool] | None] = {}


def _last_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def lanes_per_row(form: int, d: int) -> int:
    """ATen's ``block_width`` for rows of ``d``: the largest power of two <= d (<= d / 4 for vector lanes), at
    most a warp."""
    return min(_last_pow2(d // 4 if form == VECTOR else d), LANES)


def candidates(d: int) -> tuple[tuple[int, bool], ...]:
    """The (lane form, descending) orders ``eager_order`` tries for rows of ``d``, the likeliest first: the
    measured table at 32, 64 and 128; elsewhere strided lanes while a lane holds at most 4 elements, vector lanes
    for D % 4 == 0 (ATen vectorizes such rows from some size on: the device says which), descending offsets only
    (every torch this package supports)."""
    if d in CANDIDATES:
        return CANDIDATES[d]
    if d < MIN_D or d > MAX_D:
        return ()
    vector = ((VECTOR, True),) if d % 4 == 0 else ()
    return ((SEQUENTIAL, True), *vector) if d <= 4 * LANES else vector


ROW_SIZES = f"the kernel takes rows of {MIN_D} to 128 elements, or up to {MAX_D} in multiples of 4"


@triton.jit
def _halve(s, W: tl.constexpr, R: tl.constexpr, DESC: tl.constexpr):
    """One ``warp_shfl_down`` step, kept for the lanes lane 0 reads: [R, 2W] → [R, W]."""
    if DESC:  # offset W: lane i takes lane i + W
        a, b = tl.split(tl.permute(tl.reshape(s, [R, 2, W]), (0, 2, 1)))
    else:  # ascending: lane 2j takes lane 2j + 1 (the survivors are the even lanes, compacted)
        a, b = tl.split(tl.reshape(s, [R, W, 2]))
    return a + b


@triton.jit
def mean_square_kernel(X, OUT, n_rows, N, L1, L2, x_s0, x_s1, x_s2, o_s0, o_s1, o_s2, factor, PER: tl.constexpr,
                       R: tl.constexpr, FORM: tl.constexpr, DESC: tl.constexpr, ROW_DIMS: tl.constexpr,
                       X_FLAT: tl.constexpr):
    rows = tl.program_id(0) * R + tl.arange(0, R)
    rmask = rows < n_rows
    lane = tl.arange(0, 32)
    # lane t's i-th element: t + 32 i, or PER t + i (vectorized lanes)
    row_off = _row_offsets(rows, L1, L2, x_s0, x_s1, x_s2, 1 if X_FLAT else ROW_DIMS)
    base = X + row_off[:, None] + lane[None, :] * (PER if FORM == 3 else 1)
    m = rmask[:, None]
    v = tl.load(base, mask=m, other=0).to(tl.float32)
    s = v * v
    if FORM == 1 or FORM == 2:  # PER == 4: the accumulators as a tree or by halves
        a1 = tl.load(base + 32, mask=m, other=0).to(tl.float32)
        a2 = tl.load(base + 64, mask=m, other=0).to(tl.float32)
        a3 = tl.load(base + 96, mask=m, other=0).to(tl.float32)
        if FORM == 1:
            s = (s + a1 * a1) + (a2 * a2 + a3 * a3)
        else:
            s = (s + a2 * a2) + (a1 * a1 + a3 * a3)
    else:
        for i in tl.static_range(1, PER):  # lane t's accumulators, combined in order
            v = tl.load(base + (i if FORM == 3 else 32 * i), mask=m, other=0).to(tl.float32)
            s = s + v * v
    s = _halve(s, 16, R, DESC)
    s = _halve(s, 8, R, DESC)
    s = _halve(s, 4, R, DESC)
    s = _halve(s, 2, R, DESC)
    s = _halve(s, 1, R, DESC)
    tl.store(OUT + _row_offsets(rows, L1, L2, o_s0, o_s1, o_s2, ROW_DIMS), tl.reshape(s, [R]) * factor, mask=rmask)


@triton.jit
def _push_vectors(a, x_lanes, ok, lane, it, N, LPR: tl.constexpr, UNIFORM: tl.constexpr):
    # one iteration of vector lanes: lane t's vector t + LPR * it, element i squared into accumulator i
    v = it * LPR + lane
    c = v[:, None] * 4 + tl.arange(0, 4)[None, :]
    # a vector is whole or absent (D % 4 == 0): masked per vector, so the load stays one vector wide
    m = ok[:, None] if UNIFORM else (ok & (v < N // 4))[:, None]
    xv = tl.load(x_lanes[:, None] + c, mask=m, other=0.0).to(tl.float32)
    return a + xv * xv


@triton.jit
def mean_square_lanes_kernel(X, OUT, n_rows, N, L1, L2, x_s0, x_s1, x_s2, o_s0, o_s1, o_s2, factor,
                             ROWS: tl.constexpr, LPR: tl.constexpr, N_ITERS: tl.constexpr, UNIFORM: tl.constexpr,
                             SHUFFLE: tl.constexpr, ROW_DIMS: tl.constexpr, X_FLAT: tl.constexpr,
                             MAX_UNROLLED: tl.constexpr, UNROLL: tl.constexpr):
    # Vector lanes, descending offsets (module docstring): lane f = r * LPR + t is lane t of row r, its four
    # accumulators a [.., 4] fp32, combined in order after the last vector
    L: tl.constexpr = ROWS * LPR
    first = tl.program_id(0) * ROWS
    f = tl.arange(0, L)
    lane_row = first + f // LPR
    lane = f % LPR if ROWS > 1 else f
    x_lanes = X + _row_offsets(lane_row, L1, L2, x_s0, x_s1, x_s2, 1 if X_FLAT else ROW_DIMS)
    ok = lane_row < n_rows
    a = tl.zeros([L, 4], tl.float32)
    # every load of a row unrolled (in flight before the first add), or chunks of UNROLL: a loop that waits on
    # each vector is latency-bound (a row of 2048 ran at 2.2x the floor)
    if N_ITERS <= MAX_UNROLLED:
        for it in tl.static_range(N_ITERS):
            a = _push_vectors(a, x_lanes, ok, lane, it, N, LPR, UNIFORM)
    else:
        for c in tl.range(tl.cdiv(N_ITERS, UNROLL)):
            for j in tl.static_range(UNROLL):  # vectors past the row are masked (UNIFORM is off)
                a = _push_vectors(a, x_lanes, ok, lane, c * UNROLL + j, N, LPR, UNIFORM)
    # [L, 4] -> accumulators 0..3 without arithmetic: (p, q) = column 2p + q
    even, odd = tl.split(tl.reshape(a, [L, 2, 2]))
    a0, a2 = tl.split(even)
    a1, a3 = tl.split(odd)
    s = _row_tree(((a0 + a1) + a2) + a3, ROWS, LPR, SHUFFLE)
    r = first + tl.arange(0, ROWS)
    tl.store(OUT + _row_offsets(r, L1, L2, o_s0, o_s1, o_s2, ROW_DIMS), s * factor, mask=r < n_rows)


@triton.jit
def mean_square_strided_lanes_kernel(X, OUT, n_rows, N, L1, L2, x_s0, x_s1, x_s2, o_s0, o_s1, o_s2, factor,
                                     ROWS: tl.constexpr, PER: tl.constexpr, UNIFORM: tl.constexpr,
                                     SHUFFLE: tl.constexpr, ROW_DIMS: tl.constexpr, X_FLAT: tl.constexpr):
    # Strided lanes, descending offsets, 32 < D <= 32 PER (module docstring): lane f = r * 32 + t of the flat state
    # holds row r's elements t, t + 32, ..., squared and added in order; then shfl_down 16 .. 1 inside the row's warp
    first = tl.program_id(0) * ROWS
    f = tl.arange(0, ROWS * 32)
    lane_row = first + f // 32
    t = tl.max_contiguous(f % 32, 1)
    # one element per lane and load: contiguity 1, so the loads keep lane f in thread f % 128 (no vector spans lanes)
    ptr = X + _row_offsets(lane_row, L1, L2, x_s0, x_s1, x_s2, 1 if X_FLAT else ROW_DIMS) + t
    ok = lane_row < n_rows
    v = tl.load(ptr, mask=ok if UNIFORM else ok & (t < N), other=0).to(tl.float32)
    s = v * v
    for i in tl.static_range(1, PER):
        v = tl.load(ptr + 32 * i, mask=ok if UNIFORM else ok & (t + 32 * i < N), other=0).to(tl.float32)
        s = s + v * v
    s = _row_tree(s, ROWS, 32, SHUFFLE)
    r = first + tl.arange(0, ROWS)
    tl.store(OUT + _row_offsets(r, L1, L2, o_s0, o_s1, o_s2, ROW_DIMS), s * factor, mask=r < n_rows)


@triton.jit
def _pick(a, j, R: tl.constexpr, P: tl.constexpr, W: tl.constexpr):
    """``a[:, j, :]`` of an [R, P, W] tile: a sum of one value and zeros, exact (the values are squares or sums
    of squares, never -0)."""
    return tl.sum(tl.where(tl.arange(0, P)[None, :, None] == j, a, 0.0), axis=1)


@triton.jit
def _in_order(a, R: tl.constexpr, P: tl.constexpr, W: tl.constexpr):
    """[R, P, W] -> [R, W]: ``a[:, 0] + a[:, 1] + ... + a[:, P - 1]`` added left to right (two: one add, in
    any order)."""
    if P == 1:
        s = tl.reshape(a, [R, W])
    elif P == 2:
        s = tl.sum(a, axis=1)
    else:
        s = _pick(a, 0, R, P, W)
        for j in tl.static_range(1, P):
            s = s + _pick(a, j, R, P, W)
    return s


@triton.jit
def row_sums(v, R: tl.constexpr, D: tl.constexpr, FORM: tl.constexpr, DESC: tl.constexpr, LPR: tl.constexpr):
    """[R, D] fp32 -> [R] row sums in one of eager's orders (FORM, DESC, LPR lanes a row: ``row_sum_form``), the
    same bits as this module's kernels give for the sums of these values. For kernels whose lanes already hold
    whole rows (kernels/pointwise.py's row means): every add of the lanes' sums and of the warp tree is a sum of
    two (a reshape's axis of size 2: one add, which no summation order changes), so the bits do not depend on how
    Triton lays the tile out."""
    if FORM == 3:  # vector lanes: lane t's vectors t + LPR k, element i of each into accumulator i
        K: tl.constexpr = D // (4 * LPR)
        acc = _in_order(tl.reshape(v, [R, K, LPR * 4]), R, K, LPR * 4)
        even, odd = tl.split(tl.reshape(acc, [R * LPR, 2, 2]))  # (accumulators 0, 2) and (1, 3) of each lane
        a0, a2 = tl.split(even)
        a1, a3 = tl.split(odd)
        s = tl.reshape(((a0 + a1) + a2) + a3, [R, LPR])
    else:  # strided lanes: lane t's elements t + 32 i
        tl.static_assert(LPR == 32, "strided lanes: a warp a row")
        P: tl.constexpr = D // 32
        a = tl.reshape(v, [R, P, 32])
        if FORM == 0:
            s = _in_order(a, R, P, 32)
        else:
            tl.static_assert(P == 4, "tree and halves: 4 elements a lane")
            e0 = _pick(a, 0, R, P, 32)
            e1 = _pick(a, 1, R, P, 32)
            e2 = _pick(a, 2, R, P, 32)
            e3 = _pick(a, 3, R, P, 32)
            s = (e0 + e1) + (e2 + e3) if FORM == 1 else (e0 + e2) + (e1 + e3)
    # the warp tree: offset W adds lane t + W to lane t (descending), or lane 2j + 1 to lane 2j (ascending)
    if LPR >= 32:
        s = tl.sum(tl.reshape(s, [R, 2, 16]), axis=1) if DESC else tl.sum(tl.reshape(s, [R, 16, 2]), axis=2)
    if LPR >= 16:
        s = tl.sum(tl.reshape(s, [R, 2, 8]), axis=1) if DESC else tl.sum(tl.reshape(s, [R, 8, 2]), axis=2)
    if LPR >= 8:
        s = tl.sum(tl.reshape(s, [R, 2, 4]), axis=1) if DESC else tl.sum(tl.reshape(s, [R, 4, 2]), axis=2)
    if LPR >= 4:
        s = tl.sum(tl.reshape(s, [R, 2, 2]), axis=1) if DESC else tl.sum(tl.reshape(s, [R, 2, 2]), axis=2)
    if LPR >= 2:
        s = tl.sum(s, axis=1)
    else:
        s = tl.reshape(s, [R])
    return s


def row_sum_form(device: torch.device, d: int) -> tuple[int, bool, int] | None:
    """(lane form, descending warp offsets, lanes a row) of eager's mean over rows of ``d`` on ``device``, for
    ``row_sums``; None where ``row_sums`` takes no such rows (``d`` a power of two from 32 to 1024), eager's order
    is none this module knows, or it is not known yet inside a CUDA graph capture (finding it runs kernels)."""
    if d < MIN_D or d > 1024 or d & (d - 1):
        return None
    if device.type == "cuda" and (device, d) not in _orders and torch.cuda.is_current_stream_capturing():
        return None
    order = eager_order(device, d)
    if order is None:
        return None
    form, desc = order
    if form in (TREE, HALVES) and d != 4 * LANES:
        return None
    return form, desc, lanes_per_row(form, d)


def rows_of(x: torch.Tensor) -> tuple[tuple[int, int, int], tuple[int, int, int]] | None:
    """x's rows (every dim but the last) as at most 3 strided dims, ``(sizes, strides)`` (``row_layout``: dims
    merged where they step evenly, padded in front), as ``_row_offsets`` walks them; None if more remain."""
    layout = row_layout(tuple(x.shape), tuple(x.stride())) if x.dim() else None
    return None if layout is None else (layout[0], layout[1][0])


def memory_rows(x: torch.Tensor) -> tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, int, int], bool]:
    """The rows as the kernels walk them: x's row dims (``rows_of``) in x's memory order, with x's strides and the
    means' (the contiguous [..., 1] output's, in x's order of rows), and whether x's rows then lie evenly strided
    (one offset a row, no division a lane). A [B, S, H, D] projection viewed as [B, H, S, D] is read as it lies in
    memory, [B, S, H]: consecutive programs read adjacent bytes, where the view's order jumps a token's H * D
    elements from row to row (the means' stores jump instead: one value a row)."""
    sizes, xs = rows_of(x)
    out = (sizes[1] * sizes[2], sizes[2], 1)
    order = sorted(range(3), key=lambda i: (sizes[i] > 1, -xs[i]))  # size-1 dims in front, then by stride
    sizes, xs, out = (tuple(v[i] for i in order) for v in (sizes, xs, out))
    layout = row_layout((*sizes, 1), (*xs, 1), (*out, 1))
    sizes, (xs, out) = layout
    flat = all(n == 1 or st == xs[2] * math.prod(sizes[j + 1:]) for j, (n, st) in enumerate(zip(sizes, xs)))
    return sizes, xs, out, flat


def eager_order(device: torch.device, d: int) -> tuple[int, bool] | None:
    """(lane form, descending warp offsets) of eager's mean over rows of ``d`` on ``device``: the first of
    ``candidates(d)`` that gives eager's bits on one wide-range [64, d] draw, where the forms differ; None when
    none does. Cached per device and d; the interpreter (CPU) takes the first candidate."""
    if not candidates(d):
        return None
    if device.type != "cuda":
        return candidates(d)[0]
    key = (device, d)
    if key not in _orders:
        g = torch.Generator(device=device).manual_seed(0)
        amp = torch.logspace(-3, 3, d, device=device)[torch.randperm(d, device=device, generator=g)]
        x = torch.randn(64, d, device=device, generator=g) * amp
        want = x.pow(2).mean(-1, keepdim=True).view(torch.int32)
        found = [c for c in candidates(d) if torch.equal(plan_mean_square(x, c)(x).view(torch.int32), want)]
        _orders[key] = found[0] if found else None
    return _orders[key]


def can_use_mean_square(x: torch.Tensor) -> tuple[bool, str]:
    """Whether the kernel gives eager's bits for ``x`` (the contract above); else the reason."""
    if x.device.type != "cuda" and not (x.device.type == "cpu" and triton_interpret()):
        return False, f"device is {x.device.type}"
    if x.dtype not in DTYPES:
        return False, f"dtype {x.dtype} (kernel takes {[str(d) for d in DTYPES]})"
    if x.dim() == 0 or not candidates(x.shape[-1]):
        return False, f"last dim {tuple(x.shape)[-1:]} ({ROW_SIZES})"
    if x.stride(-1) != 1:
        return False, "last dim not contiguous (eager's reduction then walks another order)"
    if rows_of(x) is None:
        return False, "rows span more than 3 strided dims (the kernel addresses rows through 3)"
    n_rows = x.numel() // x.shape[-1]
    if n_rows < MIN_ROWS:
        return False, f"{n_rows} rows (kernel takes >= {MIN_ROWS}: fewer change ATen's block shape)"
    if x.numel() >= 2**31:
        return False, "too many elements for ATen's 32-bit reduction index"
    if eager_order(x.device, x.shape[-1]) is None:
        return False, f"eager's reduce order over {x.shape[-1]} elements on {x.device} is none the kernel knows"
    return True, ""


def mean_factor(rows: int, d: int) -> float:
    """``float(num_output_elements) / numel`` as ATen computes it (float division of float-converted counts)."""
    return float(np.float32(rows) / np.float32(rows * d))


def vector_lanes_constexprs(d: int, row_dims: int, x_flat: bool) -> dict:
    """``mean_square_lanes_kernel``'s constexprs for rows of ``d`` (D % 4 == 0): ATen's lanes a row, the vectors a
    lane, and rows a program (a 4-warp group each while a lane holds at most 4 vectors, else one row group)."""
    lpr = lanes_per_row(VECTOR, d)
    iters = triton.cdiv(d, 4 * lpr)
    uniform = d == 4 * lpr * iters and (iters <= MAX_UNROLLED or iters % UNROLL == 0)
    return {"ROWS": (LANE_GROUPS if iters <= 4 else 1) * 128 // lpr, "LPR": lpr, "N_ITERS": iters,
            "UNIFORM": uniform, "SHUFFLE": USE_SHUFFLES, "ROW_DIMS": row_dims, "X_FLAT": x_flat,
            "MAX_UNROLLED": MAX_UNROLLED, "UNROLL": UNROLL}


def plan_mean_square(x: torch.Tensor, order: tuple[int, bool] | None = None):
    """launch(x) -> the fp32 means [..., 1], for x's layout (checked by ``can_use_mean_square``); ``order``:
    (lane form, descending warp offsets), None for eager's on x's device (``eager_order``)."""
    d = x.shape[-1]
    form, desc = eager_order(x.device, d) if order is None else order
    (L0, L1, L2), x_strides, out_strides, x_flat = memory_rows(x)
    rows, dims = L0 * L1 * L2, row_dims(L0, L1)
    if form == VECTOR and desc and d % 4 == 0:
        const = vector_lanes_constexprs(d, dims, x_flat)
        kernel = CachedLaunch(mean_square_lanes_kernel, (triton.cdiv(rows, const["ROWS"]),), const, num_warps=4)
    elif form == SEQUENTIAL and desc and LANES <= d <= 4 * LANES:
        n, per = LANE_GROUPS * 128 // LANES, triton.cdiv(d, LANES)
        kernel = CachedLaunch(mean_square_strided_lanes_kernel, (triton.cdiv(rows, n),),
                              {"ROWS": n, "PER": per, "UNIFORM": d == LANES * per, "SHUFFLE": USE_SHUFFLES,
                               "ROW_DIMS": dims, "X_FLAT": x_flat}, num_warps=4)
    elif d in HEAD_DIMS and (form in (SEQUENTIAL, VECTOR) or d == 128):
        kernel = CachedLaunch(mean_square_kernel, (triton.cdiv(rows, ROWS),),
                              {"PER": d // LANES, "R": ROWS, "FORM": form, "DESC": desc, "ROW_DIMS": dims,
                               "X_FLAT": x_flat})
    else:
        raise ValueError(f"no kernel sums rows of {d} as {LANE_FORMS[form]} lanes, {'de' if desc else 'a'}scending")
    factor = mean_factor(rows, d)
    out_shape = (*x.shape[:-1], 1)

    def launch(x):
        out = torch.empty(out_shape, dtype=torch.float32, device=x.device)
        kernel(x, out, rows, d, L1, L2, *x_strides, *out_strides, factor)
        return out

    return launch
