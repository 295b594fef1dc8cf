"""Bit-exact replica of eager CUDA LayerNorm statistics (``vectorized_layer_norm_kernel``).

What eager computes (torch 2.11, CUDA, ``native_layer_norm``)
=============================================================

Source: ``aten/src/ATen/native/cuda/layer_norm_kernel.cu`` (line numbers below: PyTorch's main branch, whose
numerics code is the same line for line as v2.4's), ``aten/src/ATen/native/cuda/thread_constants.h`` (CUDA
``num_threads() = C10_WARP_SIZE * 4``), ``c10/cuda/CUDAMathCompat.h`` (``compat::rsqrt(float) = ::rsqrtf``),
``block_reduce.cuh`` (``kCUDABlockReduceNumThreads = 512``). ``tests/gpu/test_layer_norm_stats_gpu.py`` holds
the installed build to them.

Which kernel runs (``LayerNormKernelImplInternal``, L1083-1128):
  * The vectorized kernel is used when T is float, Half or BFloat16 (acc type float for all
    three), ``N <= 2**24``, ``N % 4 == 0``, and X, Y, gamma (if given) and beta (if given)
    are aligned to ``4 * sizeof(T)`` bytes (L1107-1116). X is ``input.expect_contiguous()``,
    so a contiguous input with an unaligned storage offset goes to the fallback; Y is a
    fresh ``empty_like`` and always aligned. ``M <= maxGridSize[0]`` is a hard TORCH_CHECK.
  * Otherwise: ``RowwiseMomentsCUDAKernel`` (generic ``WelfordOps`` + ``BlockReduce``,
    512 threads = ``kCUDABlockReduceNumThreads``) then ``LayerNormForwardCUDAKernel``
    (``y = (x - mean) * rstd * gamma + beta``). Not replicated here; ``eager_uses_vectorized_kernel``
    tells a caller when it would run.
  * mean / rstd outputs are float32 (``acc_type``) of shape [M] (viewed to stat_shape).
  * The fp32-input path (Wan ``FP32LayerNorm``) is the *same* kernel with ``T = float``.

Launch (``launch_vectorized_layer_norm_kernel``, L1022-1053):
  ``threads = dim3(warp_size, num_threads() / warp_size)`` = (32, 4) since ``num_threads()``
  is ``C10_WARP_SIZE * 4`` = 128 on CUDA (``thread_constants.h``); one block per row
  (``blocks = M``); shared memory ``threads.y * 3/2 * sizeof(float)`` = 24 bytes.

Per thread (``compute_stats``, L178-238): flat thread id ``t = threadIdx.x + 32*threadIdx.y``
owns the 4-element vectors ``i = t, t+128, ...`` (columns ``4i .. 4i+3``, ``vec_size = 4`` for
every dtype, L35) and pushes the 4 values in order into a float Welford state
``{mean, sigma2, count}`` (``cuWelfordOnlineSum``, L127-145)::

    delta     = val - mean
    new_count = count + 1.f
    new_mean  = mean + delta * (1.f/new_count)      // 1.f/x is rcp.rn (IEEE), not fast-math
    sigma2    = sigma2 + delta * (val - new_mean)

Warp reduction (L201-204): ``for offset = 16, 8, 4, 2, 1:
wd = cuWelfordCombine(wd, shfl_down(wd, offset))`` -- the *own* state is ``dataB``, the state
of lane ``l+offset`` is ``dataA``. ``cuWelfordCombine(dataB, dataA)`` (L147-176)::

    delta = dataB.mean - dataA.mean
    count = dataA.count + dataB.count
    if count > 0:
        coef = 1.f/count;  nA = dataA.count*coef;  nB = dataB.count*coef
        mean   = nA*dataA.mean + nB*dataB.mean
        sigma2 = dataA.sigma2 + dataB.sigma2 + delta*delta*dataA.count*nB
    else: mean = sigma2 = 0

Cross-warp (L207-227, blockDim.y = 4): ``for offset = 2, 1``: warp ``y < offset`` combines its
lane-0 state (as dataB) with warp ``y+offset``'s (dataA) through shared memory. Then
``var = sigma2 / float(N)`` (IEEE div.rn, L230) and, in the kernel body,
``rstd = c10::cuda::compat::rsqrt(var + eps)`` = ``::rsqrtf`` (L268; ``CUDAMathCompat.h``),
i.e. PTX ``rsqrt.approx.f32`` (MUFU.RSQ). ``eps`` is ``static_cast<float>(double eps)``.

Output (L271-310), all in float, rounded once to T on store::

    gamma & beta: gamma * (rstd * (x - mean)) + beta
    gamma only  : gamma * (rstd * (x - mean))
    beta only   : (rstd * (x - mean)) + beta
    neither     : rstd * (x - mean)

FMA contraction
===============
PyTorch builds CUDA without ``--use_fast_math`` but with nvcc's default ``--fmad=true``, so
each ``a*b + c`` above may become one FFMA. The expected contraction (LLVM/NVPTX fuse the
*first* fmul operand of an fadd) is the default variant; the alternatives are ``tl.constexpr``
flags so the GPU test can find the one that matches eager:

  PUSH_MEAN_FMA (default True)   new_mean = fma(delta, coef, mean)        | mean + rn(delta*coef)
  PUSH_M2_FMA   (default True)   sigma2 = fma(delta, val - new_mean, s2)  | s2 + rn(delta*(val-new_mean))
  COMB_MEAN     (default 0)      0: fma(nA, meanA, rn(nB*meanB))
                                 1: fma(nB, meanB, rn(nA*meanA))
                                 2: rn(nA*meanA) + rn(nB*meanB)
  COMB_M2_FMA   (default True)   sigma2 = fma(rn(rn(d*d)*cA), nB, rn(sA+sB)) | unfused
  AFFINE_FMA    (default True)   gamma&beta: fma(gamma, n, beta); beta only: fma(rstd, x-mean, beta)

Everything else is uncontracted: kernels using these helpers must be launched with
``enable_fp_fusion=False`` (``launch.EAGER_NUMERICS``) so Triton emits ``mul.rn``/``add.rn`` and only
our explicit ``tl.fma`` become FFMA. Divisions use ``tl.math.div_rn`` (IEEE, as nvcc's ``1.f/x`` and
``x/float(N)`` are), and ``tl.math.rsqrt`` lowers to ``rsqrt.approx.f32``, what ``rsqrtf`` is, because
``EAGER_NUMERICS`` builds libdevice without its FTZ reflect (with it, Triton's default, it is
``rsqrt.approx.ftz.f32``: a subnormal ``var + eps``, possible with ``eps = 0``, would give inf).

Contract of this module
=======================
``welford_row_stats`` returns the same fp32 (mean, rstd) bits as eager for one contiguous row
of ``N`` elements when ``N % 4 == 0`` and ``N <= 2**24``, with the default variant flags
(tests/gpu/test_layer_norm_stats_gpu.py finds them the only ones that match eager on every case).
``emulate_layer_norm_stats`` is a CPU logic model of the same order of operations; it is not
bit-exact (fma via float64 then one rounding to float32 can double-round; rsqrt via float64).

Performance: a valid lane's count before push ``k`` of trip ``it`` is exactly ``4*it + k``
(a lane that has a vector at trip ``it`` had one at every earlier trip), so the trips are
unrolled (``tl.static_range``) and ``1.f/count`` is the compile-time constant ``1/(4*it+k+1)``:
Python's double ``1/n`` rounded to fp32 equals the correctly rounded fp32 reciprocal
``rcp.rn`` gives for every n < 100,000 (checked exhaustively; rows here need n <= 4*32).
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import torch

from .launch import EAGER_NUMERICS
from .optional_triton import tl, triton

LANES = 128  # blockDim.x * blockDim.y = 32 * 4 on CUDA
VEC = 4  # vec_size, independent of dtype
WARP = 32
MAX_N = 1 << 24  # float count must stay exact
# The intra-warp levels of the combine tree as warp shuffles (PTX shfl.sync.down, what eager's
# WARP_SHFL_DOWN compiles to) instead of shared-memory relayouts. Triton's interpreter cannot
# run inline PTX, so it takes the relayout tree (same operations, same order, same bits).
USE_SHUFFLES = os.environ.get("TRITON_INTERPRET", "0") != "1"

COMB_MEAN_FMA_A = 0  # fma(nA, meanA, nB*meanB)
COMB_MEAN_FMA_B = 1  # fma(nB, meanB, nA*meanA)
COMB_MEAN_NO_FMA = 2  # nA*meanA + nB*meanB


@dataclasses.dataclass(frozen=True)
class WelfordVariant:
    """One hypothesis about how nvcc contracted the Welford arithmetic (see module doc)."""

    push_mean_fma: bool = True
    push_m2_fma: bool = True
    comb_mean: int = COMB_MEAN_FMA_A
    comb_m2_fma: bool = True

    def constexprs(self) -> dict[str, object]:
        return {
            "PUSH_MEAN_FMA": self.push_mean_fma,
            "PUSH_M2_FMA": self.push_m2_fma,
            "COMB_MEAN": self.comb_mean,
            "COMB_M2_FMA": self.comb_m2_fma,
        }

    @property
    def name(self) -> str:
        comb = {COMB_MEAN_FMA_A: "fmaA", COMB_MEAN_FMA_B: "fmaB", COMB_MEAN_NO_FMA: "mul+add"}[self.comb_mean]
        return (
            f"push_mean={'fma' if self.push_mean_fma else 'mul+add'} "
            f"push_m2={'fma' if self.push_m2_fma else 'mul+add'} "
            f"comb_mean={comb} comb_m2={'fma' if self.comb_m2_fma else 'mul+add'}"
        )


DEFAULT_VARIANT = WelfordVariant()
ALL_VARIANTS: tuple[WelfordVariant, ...] = tuple(
    WelfordVariant(a, b, c, d)
    for a, b, c, d in itertools.product(
        (True, False), (True, False), (COMB_MEAN_FMA_A, COMB_MEAN_FMA_B, COMB_MEAN_NO_FMA), (True, False)
    )
)


def is_uniform(n: int, n_iters: int, lanes: int = LANES, vec: int = VEC) -> bool:
    """Whether every lane gets a vector on every trip (the UNIFORM fast path applies)."""
    return n == n_iters * lanes * vec


def n_iters_for(n: int, lanes: int = LANES, vec: int = VEC) -> int:
    """Loop trips each lane makes over a row of n elements (the N_ITERS constexpr)."""
    return max(1, triton.cdiv(n // vec, lanes))


def eager_uses_vectorized_kernel(
    x: torch.Tensor, normalized_numel: int, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> bool:
    """Whether eager CUDA ``native_layer_norm`` takes ``vectorized_layer_norm_kernel`` for these inputs.

    Mirrors LayerNormKernelImplInternal: dtype, N bound, N % 4 and 16/8-byte alignment of the
    (contiguous) input, weight and bias. A non-contiguous x is copied by eager (aligned).
    """
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    n = normalized_numel
    if n > MAX_N or n % VEC != 0:
        return False
    align = VEC * x.element_size()
    for t in (x, weight, bias):
        if t is None:
            continue
        if t.dtype != x.dtype:
            return False
        if t.is_contiguous() and t.data_ptr() % align != 0:
            return False
    return True


# ----------------------------------------------------------------------------------------
# Triton device functions
# ----------------------------------------------------------------------------------------


@triton.jit
def _welford_push(mean, m2, cnt, v, valid, N_NEW: tl.constexpr, PUSH_MEAN_FMA: tl.constexpr,
                  PUSH_M2_FMA: tl.constexpr, UNIFORM: tl.constexpr = False):
    # cuWelfordOnlineSum; lanes with no vector this trip keep their state. N_NEW is the
    # count after this push on every lane that has data (see "Performance" above).
    delta = v - mean
    cnt_new = tl.full(cnt.shape, N_NEW, tl.float32)
    coef: tl.constexpr = 1.0 / N_NEW
    if PUSH_MEAN_FMA:
        mean_new = tl.fma(delta, coef, mean)
    else:
        mean_new = mean + delta * coef
    if PUSH_M2_FMA:
        m2_new = tl.fma(delta, v - mean_new, m2)
    else:
        m2_new = m2 + delta * (v - mean_new)
    if UNIFORM:
        return mean_new, m2_new, cnt_new
    return (tl.where(valid, mean_new, mean), tl.where(valid, m2_new, m2), tl.where(valid, cnt_new, cnt))


@triton.jit
def _combined_moments(mean_b, m2_b, mean_a, m2_a, cnt_a, n_a, n_b, COMB_MEAN: tl.constexpr,
                      COMB_M2_FMA: tl.constexpr):
    # The arithmetic of cuWelfordCombine once the weights n_a = cnt_a/cnt, n_b = cnt_b/cnt exist.
    delta = mean_b - mean_a
    if COMB_MEAN == 0:
        mean = tl.fma(n_a, mean_a, n_b * mean_b)
    elif COMB_MEAN == 1:
        mean = tl.fma(n_b, mean_b, n_a * mean_a)
    else:
        mean = n_a * mean_a + n_b * mean_b
    s = m2_a + m2_b
    t = delta * delta * cnt_a
    if COMB_M2_FMA:
        m2 = tl.fma(t, n_b, s)
    else:
        m2 = s + t * n_b
    return mean, m2


@triton.jit
def _welford_combine(
    mean_b, m2_b, cnt_b, mean_a, m2_a, cnt_a, COMB_MEAN: tl.constexpr, COMB_M2_FMA: tl.constexpr
):
    # cuWelfordCombine(dataB, dataA): B is the receiving (lower) lane, A the shuffled-in one.
    cnt = cnt_a + cnt_b
    coef = tl.math.div_rn(tl.full(cnt.shape, 1.0, tl.float32), cnt)
    mean, m2 = _combined_moments(mean_b=mean_b, m2_b=m2_b, mean_a=mean_a, m2_a=m2_a, cnt_a=cnt_a, n_a=cnt_a * coef,
                                 n_b=cnt_b * coef, COMB_MEAN=COMB_MEAN, COMB_M2_FMA=COMB_M2_FMA)
    nonempty = cnt > 0.0
    return tl.where(nonempty, mean, 0.0), tl.where(nonempty, m2, 0.0), cnt


@triton.jit
def _welford_combine_uniform(mean_b, m2_b, mean_a, m2_a, CNT: tl.constexpr, COMB_MEAN: tl.constexpr,
                             COMB_M2_FMA: tl.constexpr):
    # _welford_combine when both sides hold CNT elements (every lane had a vector on every
    # trip). The same fp32 operations on scalars: coef = rn(1/(2*CNT)), n = rn(CNT*coef).
    coef = tl.full([], 1.0 / (2 * CNT), tl.float32)
    cnt_a = tl.full([], CNT, tl.float32)
    n = cnt_a * coef
    return _combined_moments(mean_b=mean_b, m2_b=m2_b, mean_a=mean_a, m2_a=m2_a, cnt_a=cnt_a, n_a=n, n_b=n,
                             COMB_MEAN=COMB_MEAN, COMB_M2_FMA=COMB_M2_FMA)


@triton.jit
def _tree_step_uniform(mean, m2, OUTER: tl.constexpr, HALF: tl.constexpr, CNT: tl.constexpr,
                       COMB_MEAN: tl.constexpr, COMB_M2_FMA: tl.constexpr):
    mean_lo, mean_hi = tl.split(tl.permute(tl.reshape(mean, [OUTER, 2, HALF]), [0, 2, 1]))
    m2_lo, m2_hi = tl.split(tl.permute(tl.reshape(m2, [OUTER, 2, HALF]), [0, 2, 1]))
    mean, m2 = _welford_combine_uniform(mean_b=mean_lo, m2_b=m2_lo, mean_a=mean_hi, m2_a=m2_hi, CNT=CNT,
                                        COMB_MEAN=COMB_MEAN, COMB_M2_FMA=COMB_M2_FMA)
    return tl.reshape(mean, [OUTER * HALF]), tl.reshape(m2, [OUTER * HALF])


@triton.jit
def _tree_step(mean, m2, cnt, OUTER: tl.constexpr, HALF: tl.constexpr, COMB_MEAN: tl.constexpr,
               COMB_M2_FMA: tl.constexpr):
    # One shfl_down(HALF) level: flat state [OUTER*2*HALF]; slot j of each group of 2*HALF
    # combines with slot j+HALF. split() needs the pair on a trailing dim of size 2.
    mean_lo, mean_hi = tl.split(tl.permute(tl.reshape(mean, [OUTER, 2, HALF]), [0, 2, 1]))
    m2_lo, m2_hi = tl.split(tl.permute(tl.reshape(m2, [OUTER, 2, HALF]), [0, 2, 1]))
    cnt_lo, cnt_hi = tl.split(tl.permute(tl.reshape(cnt, [OUTER, 2, HALF]), [0, 2, 1]))
    mean, m2, cnt = _welford_combine(mean_b=mean_lo, m2_b=m2_lo, cnt_b=cnt_lo, mean_a=mean_hi, m2_a=m2_hi,
                                     cnt_a=cnt_hi, COMB_MEAN=COMB_MEAN, COMB_M2_FMA=COMB_M2_FMA)
    return (tl.reshape(mean, [OUTER * HALF]), tl.reshape(m2, [OUTER * HALF]), tl.reshape(cnt, [OUTER * HALF]))


@triton.jit
def _shfl_down(v, OFFSET: tl.constexpr):
    # __shfl_down_sync(0xffffffff, v, OFFSET, 32): lane l gets lane l+OFFSET of its warp (its own
    # value when l+OFFSET > 31). Lane i of a [LANES] tensor is thread i (1-D blocked layout,
    # LANES == 32 * num_warps); a wrong layout would change the bits, which the GPU tests and the
    # verifier would see.
    bits = tl.inline_asm_elementwise(
        "shfl.sync.down.b32 $0, $1, $2, 0x1f, -1;", "=r,r,r",
        [v.to(tl.int32, bitcast=True), tl.full(v.shape, OFFSET, tl.int32)],
        dtype=tl.int32, is_pure=True, pack=1)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _warp_leaders(v, NW: tl.constexpr):
    # [NW*32] -> [NW]: lane 0 of each warp, bit for bit (an integer sum with zeros is exact;
    # a float one would turn -0.0 into +0.0).
    lane = tl.arange(0, 32)[None, :]
    bits = tl.reshape(v.to(tl.int32, bitcast=True), [NW, 32])
    return tl.sum(tl.where(lane == 0, bits, 0), axis=1).to(tl.float32, bitcast=True)


@triton.jit
def _shfl_level_uniform(mean, m2, OFFSET: tl.constexpr, CNT: tl.constexpr, COMB_MEAN: tl.constexpr,
                        COMB_M2_FMA: tl.constexpr):
    # own state as dataB, lane l + OFFSET's as dataA (warp_shfl_down)
    return _welford_combine_uniform(mean_b=mean, m2_b=m2, mean_a=_shfl_down(mean, OFFSET), m2_a=_shfl_down(m2, OFFSET),
                                    CNT=CNT, COMB_MEAN=COMB_MEAN, COMB_M2_FMA=COMB_M2_FMA)


@triton.jit
def _shfl_level(mean, m2, cnt, OFFSET: tl.constexpr, COMB_MEAN: tl.constexpr, COMB_M2_FMA: tl.constexpr):
    return _welford_combine(mean_b=mean, m2_b=m2, cnt_b=cnt, mean_a=_shfl_down(mean, OFFSET),
                            m2_a=_shfl_down(m2, OFFSET), cnt_a=_shfl_down(cnt, OFFSET), COMB_MEAN=COMB_MEAN,
                            COMB_M2_FMA=COMB_M2_FMA)


@triton.jit
def _push_trip(mean, m2, cnt, xv, valid, IT: tl.constexpr, LANES: tl.constexpr, PUSH_MEAN_FMA: tl.constexpr,
               PUSH_M2_FMA: tl.constexpr, UNIFORM: tl.constexpr):
    # Push trip IT's vectors ([LANES, 4] fp32) column by column. [LANES, 4] -> columns 0..3
    # without arithmetic: (t, a, b) = col 2a+b.
    even, odd = tl.split(tl.reshape(xv, [LANES, 2, 2]))
    c0, c2 = tl.split(even)
    c1, c3 = tl.split(odd)
    mean, m2, cnt = _welford_push(mean=mean, m2=m2, cnt=cnt, v=c0, valid=valid, N_NEW=4 * IT + 1,
                                  PUSH_MEAN_FMA=PUSH_MEAN_FMA, PUSH_M2_FMA=PUSH_M2_FMA, UNIFORM=UNIFORM)
    mean, m2, cnt = _welford_push(mean=mean, m2=m2, cnt=cnt, v=c1, valid=valid, N_NEW=4 * IT + 2,
                                  PUSH_MEAN_FMA=PUSH_MEAN_FMA, PUSH_M2_FMA=PUSH_M2_FMA, UNIFORM=UNIFORM)
    mean, m2, cnt = _welford_push(mean=mean, m2=m2, cnt=cnt, v=c2, valid=valid, N_NEW=4 * IT + 3,
                                  PUSH_MEAN_FMA=PUSH_MEAN_FMA, PUSH_M2_FMA=PUSH_M2_FMA, UNIFORM=UNIFORM)
    mean, m2, cnt = _welford_push(mean=mean, m2=m2, cnt=cnt, v=c3, valid=valid, N_NEW=4 * IT + 4,
                                  PUSH_MEAN_FMA=PUSH_MEAN_FMA, PUSH_M2_FMA=PUSH_M2_FMA, UNIFORM=UNIFORM)
    return mean, m2, cnt


@triton.jit
def _combine_lanes(mean, m2, cnt, N_ITERS: tl.constexpr, LANES: tl.constexpr, COMB_MEAN: tl.constexpr,
                   COMB_M2_FMA: tl.constexpr, UNIFORM: tl.constexpr, SHUFFLE: tl.constexpr):
    # The combine tree over the LANES per-lane states: 5 shfl_down levels in each warp, then
    # across warps; returns the row's (mean, m2) as scalars.
    NW: tl.constexpr = LANES // 32
    if UNIFORM:
        # Counts are 4*N_ITERS per lane and double at every level: constants, no divisions.
        C: tl.constexpr = 4 * N_ITERS
        if SHUFFLE:
            mean, m2 = _shfl_level_uniform(mean, m2, 16, C, COMB_MEAN, COMB_M2_FMA)
            mean, m2 = _shfl_level_uniform(mean, m2, 8, 2 * C, COMB_MEAN, COMB_M2_FMA)
            mean, m2 = _shfl_level_uniform(mean, m2, 4, 4 * C, COMB_MEAN, COMB_M2_FMA)
            mean, m2 = _shfl_level_uniform(mean, m2, 2, 8 * C, COMB_MEAN, COMB_M2_FMA)
            mean, m2 = _shfl_level_uniform(mean, m2, 1, 16 * C, COMB_MEAN, COMB_M2_FMA)
            mean, m2 = _warp_leaders(mean, NW), _warp_leaders(m2, NW)
        else:
            mean, m2 = _tree_step_uniform(mean, m2, NW, 16, C, COMB_MEAN, COMB_M2_FMA)
            mean, m2 = _tree_step_uniform(mean, m2, NW, 8, 2 * C, COMB_MEAN, COMB_M2_FMA)
            mean, m2 = _tree_step_uniform(mean, m2, NW, 4, 4 * C, COMB_MEAN, COMB_M2_FMA)
            mean, m2 = _tree_step_uniform(mean, m2, NW, 2, 8 * C, COMB_MEAN, COMB_M2_FMA)
            mean, m2 = _tree_step_uniform(mean, m2, NW, 1, 16 * C, COMB_MEAN, COMB_M2_FMA)
        # inter-warp tree through shared memory: warp y < off takes (y, y+off)
        if NW >= 16:
            mean, m2 = _tree_step_uniform(mean, m2, 1, 8, 32 * C * NW // 16, COMB_MEAN, COMB_M2_FMA)
        if NW >= 8:
            mean, m2 = _tree_step_uniform(mean, m2, 1, 4, 32 * C * NW // 8, COMB_MEAN, COMB_M2_FMA)
        if NW >= 4:
            mean, m2 = _tree_step_uniform(mean, m2, 1, 2, 32 * C * NW // 4, COMB_MEAN, COMB_M2_FMA)
        if NW >= 2:
            mean, m2 = _tree_step_uniform(mean, m2, 1, 1, 32 * C * NW // 2, COMB_MEAN, COMB_M2_FMA)
    else:
        # intra-warp shfl_down tree: lane l < off takes (l, l+off)
        if SHUFFLE:
            mean, m2, cnt = _shfl_level(mean, m2, cnt, 16, COMB_MEAN, COMB_M2_FMA)
            mean, m2, cnt = _shfl_level(mean, m2, cnt, 8, COMB_MEAN, COMB_M2_FMA)
            mean, m2, cnt = _shfl_level(mean, m2, cnt, 4, COMB_MEAN, COMB_M2_FMA)
            mean, m2, cnt = _shfl_level(mean, m2, cnt, 2, COMB_MEAN, COMB_M2_FMA)
            mean, m2, cnt = _shfl_level(mean, m2, cnt, 1, COMB_MEAN, COMB_M2_FMA)
            mean, m2, cnt = _warp_leaders(mean, NW), _warp_leaders(m2, NW), _warp_leaders(cnt, NW)
        else:
            mean, m2, cnt = _tree_step(mean, m2, cnt, NW, 16, COMB_MEAN, COMB_M2_FMA)
            mean, m2, cnt = _tree_step(mean, m2, cnt, NW, 8, COMB_MEAN, COMB_M2_FMA)
            mean, m2, cnt = _tree_step(mean, m2, cnt, NW, 4, COMB_MEAN, COMB_M2_FMA)
            mean, m2, cnt = _tree_step(mean, m2, cnt, NW, 2, COMB_MEAN, COMB_M2_FMA)
            mean, m2, cnt = _tree_step(mean, m2, cnt, NW, 1, COMB_MEAN, COMB_M2_FMA)
        # inter-warp tree through shared memory: warp y < off takes (y, y+off)
        if NW >= 16:
            mean, m2, cnt = _tree_step(mean, m2, cnt, 1, 8, COMB_MEAN, COMB_M2_FMA)
        if NW >= 8:
            mean, m2, cnt = _tree_step(mean, m2, cnt, 1, 4, COMB_MEAN, COMB_M2_FMA)
        if NW >= 4:
            mean, m2, cnt = _tree_step(mean, m2, cnt, 1, 2, COMB_MEAN, COMB_M2_FMA)
        if NW >= 2:
            mean, m2, cnt = _tree_step(mean, m2, cnt, 1, 1, COMB_MEAN, COMB_M2_FMA)
    return tl.reshape(mean, []), tl.reshape(m2, [])


@triton.jit
def _half(t, BIT: tl.constexpr, L: tl.constexpr, V: tl.constexpr, HALF: tl.constexpr):
    # [L, V, 2*HALF] -> [L, V, HALF]: the lower or upper half of the last dim (register moves).
    lo, hi = tl.split(tl.permute(tl.reshape(t, [L, V, 2, HALF]), [0, 1, 3, 2]))
    if BIT:
        lo = hi
    return lo


@triton.jit
def row_tile_trip(tile, IT: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr):
    """Trip IT's [LANES, VEC] vectors of a [LANES, NI, VEC] row tile (NI a power of two <= 32)."""
    NI: tl.constexpr = tile.shape[1]
    t = tl.permute(tile, [0, 2, 1])
    if NI >= 32:
        t = _half(t, (IT >> 4) & 1, LANES, VEC, 16)
    if NI >= 16:
        t = _half(t, (IT >> 3) & 1, LANES, VEC, 8)
    if NI >= 8:
        t = _half(t, (IT >> 2) & 1, LANES, VEC, 4)
    if NI >= 4:
        t = _half(t, (IT >> 1) & 1, LANES, VEC, 2)
    if NI >= 2:
        t = _half(t, IT & 1, LANES, VEC, 1)
    return tl.reshape(t, [LANES, VEC])


@triton.jit
def _tile_offsets(N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr):
    # A [LANES, NI, VEC] tile's element offsets (trip ``it`` of lane ``t``: vector it*LANES + t), NI the next
    # power of two >= N_ITERS, its trips [1, NI, 1] and its vectors [LANES, NI, 1] (a row's mask is per vector: a
    # vector is in the row whole or not at all, N % VEC == 0, and the loads stay VEC wide).
    NI: tl.constexpr = 1 if N_ITERS == 1 else 2 if N_ITERS <= 2 else 4 if N_ITERS <= 4 else 8 if N_ITERS <= 8 \
        else 16 if N_ITERS <= 16 else 32
    tl.static_assert(N_ITERS <= 32, "row tiles hold at most 32 trips (N <= 16384)")
    it = tl.arange(0, NI)[None, :, None]
    vidx = it * LANES + tl.arange(0, LANES)[:, None, None]
    return vidx * VEC + tl.arange(0, VEC)[None, None, :], it, vidx


@triton.jit
def load_row_tile(row_ptr, stride_d, N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
                  EVICT_FIRST: tl.constexpr = False, N=0, UNIFORM: tl.constexpr = True):
    """A whole row of N elements (N % VEC == 0, N <= N_ITERS * LANES * VEC; UNIFORM when equal, and then N is
    not read) as a [LANES, next_pow2(N_ITERS), VEC] tile in x's dtype, kept in registers: trip ``it`` of lane
    ``t`` is tile[t, it] (what compute_stats reads), 0 past the row. Lanes first, so that Triton gives each
    thread one lane's trips (no relayout through shared memory)."""
    offs, it, vidx = _tile_offsets(N_ITERS, LANES, VEC)
    # EVICT_FIRST: the row is read once, so L2 may drop its lines first
    POLICY: tl.constexpr = "evict_first" if EVICT_FIRST else ""
    ptrs = row_ptr + offs * stride_d
    if not UNIFORM:
        return tl.load(ptrs, mask=(it < N_ITERS) & (vidx < N // VEC), other=0.0, eviction_policy=POLICY)
    if offs.shape[1] == N_ITERS:
        return tl.load(ptrs, eviction_policy=POLICY)
    return tl.load(ptrs, mask=it < N_ITERS, other=0.0, eviction_policy=POLICY)


@triton.jit
def store_row_tile(row_ptr, tile, N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr, N=0,
                   UNIFORM: tl.constexpr = True):
    """Store a ``load_row_tile``-layout tile to a contiguous row of N elements."""
    offs, it, vidx = _tile_offsets(N_ITERS, LANES, VEC)
    if not UNIFORM:
        tl.store(row_ptr + offs, tile, mask=(it < N_ITERS) & (vidx < N // VEC))
    elif offs.shape[1] == N_ITERS:
        tl.store(row_ptr + offs, tile)
    else:
        tl.store(row_ptr + offs, tile, mask=it < N_ITERS)


@triton.jit
def welford_tile_stats(tile, N, eps, N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
                       PUSH_MEAN_FMA: tl.constexpr = True, PUSH_M2_FMA: tl.constexpr = True,
                       COMB_MEAN: tl.constexpr = 0, COMB_M2_FMA: tl.constexpr = True,
                       SHUFFLE: tl.constexpr = USE_SHUFFLES, UNIFORM: tl.constexpr = True):
    """``welford_row_stats`` of a row already in registers (``load_row_tile``): the same pushes and combine
    tree, so the same bits; a lane with no vector on a trip keeps its state, as in eager's loop."""
    mean = tl.zeros([LANES], tl.float32)
    m2 = tl.zeros([LANES], tl.float32)
    cnt = tl.zeros([LANES], tl.float32)
    lane = tl.arange(0, LANES)
    for it in tl.static_range(N_ITERS):
        xv = row_tile_trip(tile, it, LANES, VEC).to(tl.float32)
        mean, m2, cnt = _push_trip(mean=mean, m2=m2, cnt=cnt, xv=xv, valid=it * LANES + lane < N // VEC, IT=it,
                                   LANES=LANES, PUSH_MEAN_FMA=PUSH_MEAN_FMA, PUSH_M2_FMA=PUSH_M2_FMA,
                                   UNIFORM=UNIFORM)
    mean, m2 = _combine_lanes(mean=mean, m2=m2, cnt=cnt, N_ITERS=N_ITERS, LANES=LANES, COMB_MEAN=COMB_MEAN,
                              COMB_M2_FMA=COMB_M2_FMA, UNIFORM=UNIFORM, SHUFFLE=SHUFFLE)
    return mean, _rstd(m2, N, eps)


SHORT_ROW = WARP * VEC  # rows up to this long lie in warp 0 of eager's block: short_rows_stats


@triton.jit
def short_rows_stats(x, N, eps, R: tl.constexpr, PUSH_MEAN_FMA: tl.constexpr = True, PUSH_M2_FMA: tl.constexpr = True,
                     COMB_MEAN: tl.constexpr = 0, COMB_M2_FMA: tl.constexpr = True):
    """(mean, rstd), each [R], of R rows of N <= SHORT_ROW elements held as [R, 32, 4] fp32 (lane t of a row:
    columns 4t .. 4t+3; anything past the row is ignored). Eager's block gives such a row to warp 0 alone, one
    vector a lane (threads 32-127 have none): the lanes' pushes and warp 0's shuffle tree make the row's state,
    and the empty warps join through the cross-warp levels, two combines with a zero state (count 0, which leave
    the values as they are except where eager's arithmetic makes a NaN, e.g. an infinite delta times a count of 0:
    computed literally). The same operations in the same order as ``welford_tile_stats``: the same bits."""
    lane = tl.arange(0, 32)[None, :]  # a warp's lanes, a vector of 4 each (WARP, VEC: jit code takes literals)
    valid = lane < N // 4
    mean = tl.zeros([R, 32], tl.float32)
    m2 = tl.zeros([R, 32], tl.float32)
    cnt = tl.zeros([R, 32], tl.float32)
    even, odd = tl.split(tl.reshape(x, [R, 32, 2, 2]))  # column 2a + b: b splits first
    c0, c2 = tl.split(even)
    c1, c3 = tl.split(odd)
    mean, m2, cnt = _welford_push(mean=mean, m2=m2, cnt=cnt, v=c0, valid=valid, N_NEW=1, PUSH_MEAN_FMA=PUSH_MEAN_FMA,
                                  PUSH_M2_FMA=PUSH_M2_FMA)
    mean, m2, cnt = _welford_push(mean=mean, m2=m2, cnt=cnt, v=c1, valid=valid, N_NEW=2, PUSH_MEAN_FMA=PUSH_MEAN_FMA,
                                  PUSH_M2_FMA=PUSH_M2_FMA)
    mean, m2, cnt = _welford_push(mean=mean, m2=m2, cnt=cnt, v=c2, valid=valid, N_NEW=3, PUSH_MEAN_FMA=PUSH_MEAN_FMA,
                                  PUSH_M2_FMA=PUSH_M2_FMA)
    mean, m2, cnt = _welford_push(mean=mean, m2=m2, cnt=cnt, v=c3, valid=valid, N_NEW=4, PUSH_MEAN_FMA=PUSH_MEAN_FMA,
                                  PUSH_M2_FMA=PUSH_M2_FMA)
    mean, m2, cnt = tl.reshape(mean, [R * 32]), tl.reshape(m2, [R * 32]), tl.reshape(cnt, [R * 32])
    # warp 0's shfl_down levels: lane l < off takes (l, l + off), per row
    mean, m2, cnt = _tree_step(mean, m2, cnt, R, 16, COMB_MEAN, COMB_M2_FMA)
    mean, m2, cnt = _tree_step(mean, m2, cnt, R, 8, COMB_MEAN, COMB_M2_FMA)
    mean, m2, cnt = _tree_step(mean, m2, cnt, R, 4, COMB_MEAN, COMB_M2_FMA)
    mean, m2, cnt = _tree_step(mean, m2, cnt, R, 2, COMB_MEAN, COMB_M2_FMA)
    mean, m2, cnt = _tree_step(mean, m2, cnt, R, 1, COMB_MEAN, COMB_M2_FMA)
    # the cross-warp levels (offsets 2, 1): warp 0 takes warp 2's state, then warps 1 + 3's, all empty
    zero = tl.zeros([R], tl.float32)
    mean, m2, cnt = _welford_combine(mean_b=mean, m2_b=m2, cnt_b=cnt, mean_a=zero, m2_a=zero, cnt_a=zero,
                                     COMB_MEAN=COMB_MEAN, COMB_M2_FMA=COMB_M2_FMA)
    mean, m2, cnt = _welford_combine(mean_b=mean, m2_b=m2, cnt_b=cnt, mean_a=zero, m2_a=zero, cnt_a=zero,
                                     COMB_MEAN=COMB_MEAN, COMB_M2_FMA=COMB_M2_FMA)
    return mean, _rstd(m2, N, eps)


@triton.jit
def _rstd(m2, N, eps):
    var = tl.math.div_rn(m2, tl.cast(N, tl.float32))
    return tl.math.rsqrt(var + eps)


@triton.jit
def welford_row_moments(
    row_ptr,
    N,
    stride_d,
    N_ITERS: tl.constexpr,
    LANES: tl.constexpr,
    VEC: tl.constexpr,
    PUSH_MEAN_FMA: tl.constexpr = True,
    PUSH_M2_FMA: tl.constexpr = True,
    COMB_MEAN: tl.constexpr = 0,
    COMB_M2_FMA: tl.constexpr = True,
    UNIFORM: tl.constexpr = False,
    SHUFFLE: tl.constexpr = USE_SHUFFLES,
):
    """(mean, m2) of the row row_ptr[0:N*stride_d:stride_d] in compute_stats order; m2 is the sum of
    squared deviations. stride_d is the element stride along the row (1 when contiguous; Triton
    specializes an integer argument equal to 1, so that case compiles to unit-stride loads).

    N_ITERS >= cdiv(N // VEC, LANES); extra trips are masked out and change nothing.
    UNIFORM (only when N == N_ITERS * LANES * VEC, see ``is_uniform``): no masks, and the
    combine tree's counts are compile-time constants (same bits, fewer instructions).
    """
    tl.static_assert(VEC == 4, "the column split below is written for vec_size 4")
    tl.static_assert(LANES % 32 == 0, "LANES is whole warps")
    NW: tl.constexpr = LANES // 32
    tl.static_assert(NW <= 16 and (NW & (NW - 1)) == 0, "warps per row: power of two <= 16")

    lane = tl.arange(0, LANES)
    col = tl.arange(0, VEC)
    nvec = N // VEC
    mean = tl.zeros([LANES], tl.float32)
    m2 = tl.zeros([LANES], tl.float32)
    cnt = tl.zeros([LANES], tl.float32)
    for it in tl.static_range(N_ITERS):
        vidx = it * LANES + lane
        valid = vidx < nvec
        if UNIFORM:  # N == N_ITERS * LANES * VEC: every lane has a vector on every trip
            xv = tl.load(row_ptr + (vidx[:, None] * VEC + col[None, :]) * stride_d)
        else:
            xv = tl.load(row_ptr + (vidx[:, None] * VEC + col[None, :]) * stride_d, mask=valid[:, None], other=0.0)
        mean, m2, cnt = _push_trip(mean=mean, m2=m2, cnt=cnt, xv=xv.to(tl.float32), valid=valid, IT=it, LANES=LANES,
                                   PUSH_MEAN_FMA=PUSH_MEAN_FMA, PUSH_M2_FMA=PUSH_M2_FMA, UNIFORM=UNIFORM)
    return _combine_lanes(mean=mean, m2=m2, cnt=cnt, N_ITERS=N_ITERS, LANES=LANES, COMB_MEAN=COMB_MEAN,
                          COMB_M2_FMA=COMB_M2_FMA, UNIFORM=UNIFORM, SHUFFLE=SHUFFLE)


@triton.jit
def welford_row_stats(
    row_ptr,
    N,
    stride_d,
    eps,
    N_ITERS: tl.constexpr,
    LANES: tl.constexpr,
    VEC: tl.constexpr,
    PUSH_MEAN_FMA: tl.constexpr = True,
    PUSH_M2_FMA: tl.constexpr = True,
    COMB_MEAN: tl.constexpr = 0,
    COMB_M2_FMA: tl.constexpr = True,
    UNIFORM: tl.constexpr = False,
    SHUFFLE: tl.constexpr = USE_SHUFFLES,
):
    """fp32 (mean, rstd) of one contiguous row, bit-identical to vectorized_layer_norm_kernel.

    Launch the calling kernel with ``launch.EAGER_NUMERICS`` (no FMA contraction; libdevice without its FTZ
    reflect, so ``rsqrt`` is eager's ``rsqrt.approx.f32``). eps must be fp32 (a Python float
    kernel argument is).
    """
    mean, m2 = welford_row_moments(
        row_ptr=row_ptr, N=N, stride_d=stride_d, N_ITERS=N_ITERS, LANES=LANES, VEC=VEC, PUSH_MEAN_FMA=PUSH_MEAN_FMA,
        PUSH_M2_FMA=PUSH_M2_FMA, COMB_MEAN=COMB_MEAN, COMB_M2_FMA=COMB_M2_FMA, UNIFORM=UNIFORM, SHUFFLE=SHUFFLE,
    )
    return mean, _rstd(m2, N, eps)


@triton.jit
def layer_norm_apply_affine(
    x, mean, rstd, w, b, HAS_W: tl.constexpr, HAS_B: tl.constexpr, AFFINE_FMA: tl.constexpr = True
):
    """The vectorized kernel's output expression for each affine case; w, b already fp32."""
    if HAS_W and HAS_B:
        if AFFINE_FMA:
            y = tl.fma(w, rstd * (x - mean), b)
        else:
            y = w * (rstd * (x - mean)) + b
    elif HAS_W:
        y = w * (rstd * (x - mean))
    elif HAS_B:
        if AFFINE_FMA:
            y = tl.fma(rstd, x - mean, b)
        else:
            y = rstd * (x - mean) + b
    else:
        y = rstd * (x - mean)
    return y


@triton.jit
def program_row(S):
    """This program's row (``program_id(0)``) and its (batch, token) in rows laid out [B, S], all int64 for
    the stride products. The division is written in int32 (a grid index is < 2**31): on the GPU an int64
    division is a long instruction sequence that every thread would run before its first load
    (tests/kernels/test_compile_sm90.py checks that the kernels' PTX has none)."""
    row = tl.program_id(0)
    return row.to(tl.int64), (row // S).to(tl.int64), (row % S).to(tl.int64)


# ----------------------------------------------------------------------------------------
# Standalone test kernel: native_layer_norm(x2d, [N], w, b, eps) -> (y, mean, rstd)
# ----------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["N"])
def _layer_norm_exact_kernel(
    X,
    W,
    B,
    Y,
    Mean,
    Rstd,
    N,
    eps,
    N_ITERS: tl.constexpr,
    LANES: tl.constexpr,
    VEC: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    AFFINE_FMA: tl.constexpr,
    PUSH_MEAN_FMA: tl.constexpr,
    PUSH_M2_FMA: tl.constexpr,
    COMB_MEAN: tl.constexpr,
    COMB_M2_FMA: tl.constexpr,
    UNIFORM: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * N
    y_row = Y + row * N
    mean, rstd = welford_row_stats(
        row_ptr=x_row, N=N, stride_d=1, eps=eps, N_ITERS=N_ITERS, LANES=LANES, VEC=VEC, PUSH_MEAN_FMA=PUSH_MEAN_FMA,
        PUSH_M2_FMA=PUSH_M2_FMA, COMB_MEAN=COMB_MEAN, COMB_M2_FMA=COMB_M2_FMA, UNIFORM=UNIFORM,
    )
    lane = tl.arange(0, LANES)
    col = tl.arange(0, VEC)
    for it in range(N_ITERS):
        offs = (it * LANES + lane)[:, None] * VEC + col[None, :]
        mask = offs < N
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        w = x
        b = x
        if HAS_W:
            w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
        y = layer_norm_apply_affine(x, mean, rstd, w, b, HAS_W, HAS_B, AFFINE_FMA)
        tl.store(y_row + offs, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)


def _as_f32(v: float) -> float:
    # static_cast<float>(eps), done on the host so every backend (also the interpreter) agrees
    return torch.tensor(v, dtype=torch.float32).item()


def layer_norm_exact(
    x2d: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    variant: WelfordVariant = DEFAULT_VARIANT,
    affine_fma: bool = True,
    n_iters: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton replica of ``torch.native_layer_norm(x2d, [N], weight, bias, eps)`` on CUDA.

    Returns (y [M, N] in x2d.dtype, mean [M] fp32, rstd [M] fp32). One program of 4 warps per
    row, launched with ``launch.EAGER_NUMERICS``. ``n_iters`` overrides N_ITERS (any value >=
    ``n_iters_for(N)`` gives the same bits; tests use one value for many N to share a compile).
    """
    if x2d.dim() != 2 or not x2d.is_contiguous():
        raise ValueError("x2d must be a contiguous 2-D tensor")
    m, n = x2d.shape
    if n % VEC != 0 or n > MAX_N:
        raise ValueError(f"N={n}: eager uses the vectorized kernel only for N % 4 == 0 and N <= 2**24")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and (t.dtype != x2d.dtype or t.numel() != n or not t.is_contiguous()):
            raise ValueError(f"{name} must be contiguous, {x2d.dtype}, with {n} elements")
    need = n_iters_for(n)
    n_iters = need if n_iters is None else n_iters
    if n_iters < need:
        raise ValueError(f"n_iters={n_iters} < {need} needed for N={n}")
    y = torch.empty_like(x2d)
    mean = torch.empty(m, dtype=torch.float32, device=x2d.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x2d.device)
    if m == 0:
        return y, mean, rstd
    _layer_norm_exact_kernel[(m,)](
        x2d,
        weight,
        bias,
        y,
        mean,
        rstd,
        n,
        _as_f32(eps),
        N_ITERS=n_iters,
        LANES=LANES,
        VEC=VEC,
        HAS_W=weight is not None,
        HAS_B=bias is not None,
        AFFINE_FMA=affine_fma,
        **variant.constexprs(),
        UNIFORM=is_uniform(n, n_iters),
        num_warps=LANES // WARP,
        **EAGER_NUMERICS,
    )
    return y, mean, rstd


# ----------------------------------------------------------------------------------------
# CPU emulation (logic model, float32 tensors, vectorised over rows and lanes)
# ----------------------------------------------------------------------------------------


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    # a*b is exact in float64; the add rounds to float64 then float32 (rare double rounding).
    return (a.double() * b.double() + c.double()).float()


def _mul_add(a, b, c, fused: bool):
    return _fma(a, b, c) if fused else c + a * b


def _combine_emu(mean_b, m2_b, cnt_b, mean_a, m2_a, cnt_a, variant: WelfordVariant):
    delta = mean_b - mean_a
    cnt = cnt_a + cnt_b
    coef = torch.ones_like(cnt) / cnt
    n_a = cnt_a * coef
    n_b = cnt_b * coef
    if variant.comb_mean == COMB_MEAN_FMA_A:
        mean = _fma(n_a, mean_a, n_b * mean_b)
    elif variant.comb_mean == COMB_MEAN_FMA_B:
        mean = _fma(n_b, mean_b, n_a * mean_a)
    else:
        mean = n_a * mean_a + n_b * mean_b
    s = m2_a + m2_b
    t = delta * delta * cnt_a
    m2 = _mul_add(t, n_b, s, variant.comb_m2_fma)
    nonempty = cnt > 0
    zero = torch.zeros_like(mean)
    return torch.where(nonempty, mean, zero), torch.where(nonempty, m2, zero), cnt


def emulate_layer_norm_moments(
    x2d: torch.Tensor, variant: WelfordVariant = DEFAULT_VARIANT, lanes: int = LANES, vec: int = VEC
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, m2) per row, same operation order as compute_stats (see emulate_layer_norm_stats)."""
    x = x2d.detach().to("cpu", torch.float32)
    m, n = x.shape
    if n % vec != 0:
        raise ValueError("N must be a multiple of vec")
    nvec = n // vec
    iters = max(1, -(-nvec // lanes))
    xv = torch.nn.functional.pad(x, (0, iters * lanes * vec - n)).view(m, iters, lanes, vec)
    valid = (torch.arange(iters * lanes).view(iters, lanes) < nvec).unsqueeze(0)
    mean = torch.zeros(m, lanes)
    m2 = torch.zeros(m, lanes)
    cnt = torch.zeros(m, lanes)
    one = torch.ones(())
    for it in range(iters):
        ok = valid[:, it]
        for k in range(vec):
            v = xv[:, it, :, k]
            delta = v - mean
            cnt_new = cnt + 1.0
            coef = one / cnt_new
            mean_new = _mul_add(delta, coef, mean, variant.push_mean_fma)
            m2_new = _mul_add(delta, v - mean_new, m2, variant.push_m2_fma)
            mean = torch.where(ok, mean_new, mean)
            m2 = torch.where(ok, m2_new, m2)
            cnt = torch.where(ok, cnt_new, cnt)
    nw = lanes // WARP
    state = [s.view(m, nw, WARP) for s in (mean, m2, cnt)]
    off = WARP // 2
    while off >= 1:  # shfl_down tree inside each warp
        lo = [s[..., :off] for s in state]
        hi = [s[..., off : 2 * off] for s in state]
        state = list(_combine_emu(*lo, *hi, variant))
        off //= 2
    state = [s.reshape(m, nw) for s in state]
    off = nw // 2
    while off >= 1:  # cross-warp tree
        lo = [s[:, :off] for s in state]
        hi = [s[:, off : 2 * off] for s in state]
        state = list(_combine_emu(*lo, *hi, variant))
        off //= 2
    return state[0][:, 0].contiguous(), state[1][:, 0].contiguous()


def emulate_layer_norm_stats(
    x2d: torch.Tensor, eps: float, variant: WelfordVariant = DEFAULT_VARIANT, rsqrt: str = "f64"
) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU model of the vectorized kernel's (mean, rstd): same lanes, order and roundings.

    FMA is emulated as float64 product + add rounded to float32 (can double-round in rare
    cases). rsqrt="f64" is float64 1/sqrt rounded to float32, which is *not* bit-exact to
    MUFU.RSQ; rsqrt="f32" is fp32 sqrt then fp32 1/x, what the Triton interpreter computes.
    Use it for logic checks, not as the bit-exact reference (that is eager on the GPU).
    """
    mean, m2 = emulate_layer_norm_moments(x2d, variant)
    var = m2 / float(x2d.shape[1])
    ve = var + torch.tensor(eps, dtype=torch.float32)
    if rsqrt == "f64":
        rstd = (1.0 / torch.sqrt(ve.double())).float()
    elif rsqrt == "f32":
        # fp32 sqrt via float64 (exact rounding; torch's fp32 CPU sqrt is only ~0.5 ulp)
        rstd = torch.ones_like(ve) / torch.sqrt(ve.double()).float()
    else:
        raise ValueError(f"rsqrt must be 'f64' or 'f32', not {rsqrt!r}")
    return mean, rstd


def emulate_layer_norm(
    x2d: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    variant: WelfordVariant = DEFAULT_VARIANT,
    affine_fma: bool = True,
    rsqrt: str = "f64",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CPU model of the whole forward: (y in x2d.dtype, mean, rstd); same caveats as the stats."""
    mean, rstd = emulate_layer_norm_stats(x2d, eps, variant, rsqrt)
    x = x2d.detach().to("cpu", torch.float32)
    mu, r = mean[:, None], rstd[:, None]
    w = None if weight is None else weight.detach().to("cpu", torch.float32)[None, :]
    b = None if bias is None else bias.detach().to("cpu", torch.float32)[None, :]
    if w is not None and b is not None:
        y = _mul_add(w, r * (x - mu), b, affine_fma)
    elif w is not None:
        y = w * (r * (x - mu))
    elif b is not None:
        y = _mul_add(r, x - mu, b, affine_fma)
    else:
        y = r * (x - mu)
    return y.to(x2d.dtype), mean, rstd
