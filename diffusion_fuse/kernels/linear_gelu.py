"""Gluon kernel for ``diffusion_fuse::linear_gelu``: ``gelu(x @ w.T + b)`` as one warp-specialized GEMM.

Numerics contract (lossless tier), per output element::

    acc = sum over K of x[m, k] * w[n, k]     # fp32, one accumulator, sm_90 ``wgmma ... k16`` steps in K order
    y   = bf16(acc + float(b[n]))             # eager's addmm: cuBLAS's bias epilogue
    out = table[y]                            # eager's gelu of every bf16 value (kernels/lut16.py)

cuBLAS's non-split-K Hopper GEMMs accumulate in the same K order through the same instruction, so ``y`` is
eager's addmm bit for bit: benchmarks/probe_gemm_exact.py and probe_gemm_ws.py found every variant exact at
FLUX.1-dev's linear shapes (results/h200-2026-11-30k). The gelu is eager's own outputs looked up, exact by
construction. The verifier still compares every site on the first call: a shape where cuBLAS picked a
split-K kernel would be put back, not kept.

Schedule ("ping-pong", as cuBLAS's Hopper kernels): a 1-warp TMA loader fills a ring of STAGES shared-memory
stages for every tile of the program in order; two consumer warpgroups take alternate 128x128 tiles and take
turns on the ring; each runs its epilogue (bias, the table, stores) through a shared-memory tile buffer while
the other runs its main loop, so the gelu costs the tensor cores nothing. Measured on an H200 (run 10): 0.89-1.00x
the time of cuBLAS's GEMM followed by the lookup gelu kernel the pointwise pass runs.

The output's row stride is an argument (``LDC``): ``linear_gelu_cat`` has the GEMM write its columns of the
``cat`` buffer (FLUX's single block). A layout's launch is planned once (``GemmLaunch``) and then launched
directly (kernels/launch.CachedLaunch); only the two TMA descriptors are made per call.

Inputs (``can_use_linear_gelu``): CUDA sm_90, bf16 x [..., K] contiguous with at least MIN_ROWS rows, w [N, K]
contiguous, bias [N] or None, K % 64 == 0, N % 8 == 0.
Verified shapes: tests/gpu/test_linear_gelu_gpu.py.
"""

from __future__ import annotations

import threading

import torch
import triton

try:  # Gluon (Triton's Hopper dialect) arrived in Triton 3.4; without it the op keeps its reference path
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    GLUON_ERROR = ""
except Exception as e:  # noqa: BLE001 - any import failure means no kernel, said by the guard
    GLUON_ERROR = f"Gluon unavailable ({type(e).__name__}: {e})"

from .launch import CachedLaunch

BM, BN, BK, STAGES, GROUP_M = 128, 128, 64, 4, 8
MAX_REGISTERS = 168  # 12 warps (2 consumer warpgroups + the loader's) x 32 threads x 168 <= 64K registers
MIN_ROWS = 128  # smaller GEMMs are cuBLAS's split-K territory: another summation order


if not GLUON_ERROR:
    from .pointwise_ops import GELU_TANH_BETA, GELU_TANH_KAPPA

    GELU_BETA = gl.constexpr(float(GELU_TANH_BETA))
    GELU_KAPPA = gl.constexpr(float(GELU_TANH_KAPPA))
    # the TMA descriptors' shared layouts: built once, not on every launch
    A_LAYOUT = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    W_LAYOUT = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)

    @gluon.constexpr_function
    def _smem_layout(rows, cols):
        return gl.NVMMASharedLayout.get_default_for([rows, cols], gl.bfloat16)

    @gluon.jit
    def _alloc_barriers(n: gl.constexpr):
        bars = gl.allocate_shared_memory(gl.int64, [n, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(n):
            mbarrier.init(bars.index(i), count=1)
        return bars

    @gluon.jit
    def _alloc_ring(STG: gl.constexpr, TBM: gl.constexpr, TBN: gl.constexpr, TBK: gl.constexpr, EPI_BUFS: gl.constexpr):
        """A program's shared memory: the STG-stage A and B ring with its ``ready`` barriers, two more barriers
        (the ping-pong's turns, or the cooperative kernel's hand-off) and EPI_BUFS epilogue tile buffers."""
        a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STG, TBM, TBK], _smem_layout(TBM, TBK))
        b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STG, TBN, TBK], _smem_layout(TBN, TBK))
        ready = _alloc_barriers(STG)
        pair = _alloc_barriers(2)
        epi_bufs = gl.allocate_shared_memory(gl.bfloat16, [EPI_BUFS, TBM, TBN],
                                             gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0]))
        return a_bufs, b_bufs, ready, pair, epi_bufs

    @gluon.jit
    def _tile_ids(tile, num_pid_m, num_pid_n, GROUP: gl.constexpr):
        width = GROUP * num_pid_n
        first_m = (tile // width) * GROUP
        size_m = gl.minimum(num_pid_m - first_m, GROUP)
        return first_m + (tile % width) % size_m, (tile % width) // size_m

    @gluon.jit
    def _store_chunk(epi_smem, r0: gl.constexpr, CHUNK: gl.constexpr, out_layout: gl.constexpr, lut, C, M, N, LDC,
                     row0, col0, EPI: gl.constexpr, LO: gl.constexpr, SPAN: gl.constexpr, SPECIAL: gl.constexpr,
                     SLOTS: gl.constexpr):
        """Rows r0 .. r0 + CHUNK of the tile in ``epi_smem`` (``bf16(acc + bias)``) through the epilogue, stored
        to C at (row0 + r0, col0)."""
        TBN: gl.constexpr = epi_smem.type.shape[1]
        xb = epi_smem.slice(r0, CHUNK, dim=0).load(out_layout)
        if EPI == 3:  # eager's gelu looked up: kernels/lut16.py's lut16_slot and lut16_apply
            b = gl.reshape(xb.to(gl.uint16, bitcast=True).to(gl.int32), [CHUNK * TBN])
            m = b & 0x7FFF
            top = SPAN + 1 + gl.maximum(m - (SPECIAL - 1), 0)
            inner = gl.maximum(gl.minimum(m - (LO - 1), top), 0)
            entry = gl.gather(lut, gl.minimum(m, 256 + inner) + (b >> 15) * SLOTS, 0)
            r = gl.convert_layout(gl.reshape((b & (entry >> 16)) + entry, [CHUNK, TBN]), out_layout)
            yb = r.to(gl.uint16).to(gl.bfloat16, bitcast=True)
        elif EPI == 2:  # eager's gelu-tanh computed (pointwise_ops' recipe): benchmarks only
            x = xb.to(gl.float32)
            th = gl.extra.libdevice.tanh(GELU_BETA * gl.fma(GELU_KAPPA, (x * x) * x, x))
            yb = ((0.5 * x) * (1.0 + th)).to(gl.bfloat16)
        else:  # the linear alone: benchmarks only
            yb = xb
        rows = row0 + r0 + gl.arange(0, CHUNK, layout=gl.SliceLayout(1, out_layout))
        ocols = col0 + gl.arange(0, TBN, layout=gl.SliceLayout(0, out_layout))
        mask = (gl.expand_dims(rows, 1) < M) & (gl.expand_dims(ocols, 0) < N)
        gl.store(C + gl.expand_dims(rows, 1).to(gl.int64) * LDC + gl.expand_dims(ocols, 0), yb, mask=mask)

    @gluon.jit
    def _consume(J0: gl.constexpr, a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, LDC, pid,
                 NUM_PROGS: gl.constexpr, HAS_BIAS: gl.constexpr, EPI: gl.constexpr, TBM: gl.constexpr, TBN: gl.constexpr,
                 TBK: gl.constexpr, GROUP: gl.constexpr, LO: gl.constexpr, SPAN: gl.constexpr,
                 SPECIAL: gl.constexpr, TABLE: gl.constexpr):
        """Tiles J0, J0 + 2, ... of this program: K steps through the ring, then the epilogue.

        The consumers take turns on the ring (``turn``): one starts waiting on its tile's stages only after
        the other waited on all of its previous tile's. A ``ready`` wait is by phase parity: a consumer a
        whole tile ahead would take the other's data."""
        layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, TBN, 16])
        CHUNK: gl.constexpr = 32  # epilogue rows at a time: 8 contiguous bf16 per thread, a warp over 2 rows
        out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        lut_layout: gl.constexpr = gl.BlockedLayout([TABLE // 128], [32], [4], [0])
        STG: gl.constexpr = a_bufs.type.shape[0]
        SLOTS: gl.constexpr = 256 + 2 + SPAN + (0x8000 - SPECIAL)  # kernels/lut16.py: a sign's slots
        epi_smem = epi_bufs.index(J0)
        lut = gl.load(LUT + gl.arange(0, TABLE, layout=lut_layout)) if EPI == 3 else 0
        num_pid_m = gl.cdiv(M, TBM)
        num_pid_n = gl.cdiv(N, TBN)
        n_local = gl.cdiv(num_pid_m * num_pid_n - pid, NUM_PROGS)
        k_tiles = K // TBK
        t = 0
        for j in range(J0, n_local, 2):
            pid_m, pid_n = _tile_ids(pid + j * NUM_PROGS, num_pid_m, num_pid_n, GROUP)
            mbarrier.wait(turn.index(J0), (t + J0 + 1) & 1, pred=(J0 == 1) | (t > 0))
            acc = gl.zeros([TBM, TBN], gl.float32, layout=layout)
            base = j * k_tiles
            for k in range(k_tiles):
                step = base + k
                s = step % STG
                mbarrier.wait(ready.index(s), (step // STG) & 1)
                acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))  # the previous step's stage is free
                mbarrier.arrive(empty.index((step + STG - 1) % STG), count=1, pred=k > 0)
            mbarrier.arrive(turn.index(1 - J0), count=1)
            t += 1
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            mbarrier.arrive(empty.index((base + k_tiles - 1) % STG), count=1)
            if HAS_BIAS:
                cols = pid_n * TBN + gl.arange(0, TBN, layout=gl.SliceLayout(0, layout))
                acc = acc + gl.expand_dims(gl.load(BIAS + cols, mask=cols < N, other=0.0).to(gl.float32), 0)
            gl.thread_barrier()  # every thread is done reading the buffer's previous tile
            epi_smem.store(acc.to(gl.bfloat16))
            gl.thread_barrier()
            for r0 in gl.static_range(0, TBM, CHUNK):
                _store_chunk(epi_smem, r0, CHUNK, out_layout, lut, C, M, N, LDC, pid_m * TBM, pid_n * TBN, EPI, LO,
                             SPAN, SPECIAL, SLOTS)

    @gluon.jit
    def _consumer0(a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, LDC, pid,
                   NUM_PROGS: gl.constexpr, HAS_BIAS: gl.constexpr, EPI: gl.constexpr, TBM: gl.constexpr, TBN: gl.constexpr,
                   TBK: gl.constexpr, GROUP: gl.constexpr, LO: gl.constexpr, SPAN: gl.constexpr,
                   SPECIAL: gl.constexpr, TABLE: gl.constexpr):
        _consume(0, a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, LDC, pid, NUM_PROGS, HAS_BIAS,
                 EPI, TBM, TBN, TBK, GROUP, LO, SPAN, SPECIAL, TABLE)

    # The two workers share one signature (Gluon's rule for worker partitions).
    @gluon.jit
    def _consumer1(a_desc, w_desc, a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, LDC, pid,
                   NUM_PROGS: gl.constexpr, HAS_BIAS: gl.constexpr, EPI: gl.constexpr, TBM: gl.constexpr, TBN: gl.constexpr,
                   TBK: gl.constexpr, GROUP: gl.constexpr, LO: gl.constexpr, SPAN: gl.constexpr,
                   SPECIAL: gl.constexpr, TABLE: gl.constexpr):
        _consume(1, a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, LDC, pid, NUM_PROGS, HAS_BIAS,
                 EPI, TBM, TBN, TBK, GROUP, LO, SPAN, SPECIAL, TABLE)

    @gluon.jit
    def _loader(a_desc, w_desc, a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, LDC, pid,
                NUM_PROGS: gl.constexpr, HAS_BIAS: gl.constexpr, EPI: gl.constexpr, TBM: gl.constexpr, TBN: gl.constexpr,
                TBK: gl.constexpr, GROUP: gl.constexpr, LO: gl.constexpr, SPAN: gl.constexpr,
                SPECIAL: gl.constexpr, TABLE: gl.constexpr):
        """Every tile of this program in order, each K step into the next free stage of the ring."""
        STG: gl.constexpr = a_bufs.type.shape[0]
        num_pid_m = gl.cdiv(M, TBM)
        num_pid_n = gl.cdiv(N, TBN)
        n_local = gl.cdiv(num_pid_m * num_pid_n - pid, NUM_PROGS)
        k_tiles = K // TBK
        for j in range(n_local):
            pid_m, pid_n = _tile_ids(pid + j * NUM_PROGS, num_pid_m, num_pid_n, GROUP)
            for k in range(k_tiles):
                step = j * k_tiles + k
                s = step % STG
                mbarrier.wait(empty.index(s), ((step // STG) & 1) ^ 1)  # a fresh barrier counts as released
                mbarrier.expect(ready.index(s), TBM * TBK * 2 + TBN * TBK * 2)
                tma.async_copy_global_to_shared(a_desc, [pid_m * TBM, k * TBK], ready.index(s), a_bufs.index(s))
                tma.async_copy_global_to_shared(w_desc, [pid_n * TBN, k * TBK], ready.index(s), b_bufs.index(s))

    @gluon.jit
    def _linear_gelu_kernel(a_desc, w_desc, LUT, BIAS, C, M, N, K, LDC, NUM_PROGS: gl.constexpr, HAS_BIAS: gl.constexpr,
                            EPI: gl.constexpr, TBM: gl.constexpr, TBN: gl.constexpr, TBK: gl.constexpr, GROUP: gl.constexpr,
                            STG: gl.constexpr, LO: gl.constexpr, SPAN: gl.constexpr, SPECIAL: gl.constexpr,
                            TABLE: gl.constexpr):
        a_bufs, b_bufs, ready, turn, epi_bufs = _alloc_ring(STG, TBM, TBN, TBK, 2)
        empty = _alloc_barriers(STG)
        pid = gl.program_id(0)
        # The tuples are written out in the call: bound to a name first, their constexprs reach the workers
        # as tensors (Triton 3.6).
        gl.warp_specialize([
            (_consumer0, (a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, LDC, pid, NUM_PROGS,
                          HAS_BIAS, EPI, TBM, TBN, TBK, GROUP, LO, SPAN, SPECIAL, TABLE)),
            (_consumer1, (a_desc, w_desc, a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, LDC, pid,
                          NUM_PROGS, HAS_BIAS, EPI, TBM, TBN, TBK, GROUP, LO, SPAN, SPECIAL, TABLE)),
            (_loader, (a_desc, w_desc, a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, LDC, pid,
                       NUM_PROGS, HAS_BIAS, EPI, TBM, TBN, TBK, GROUP, LO, SPAN, SPECIAL, TABLE)),
        ], [4, 1], [232, 40])


_tables: dict[tuple[str, str], object] = {}
_tables_lock = threading.Lock()


def gelu_table(approximate: str, device: torch.device):
    """kernels/lut16.py's table of eager's bf16 gelu on ``device``, built once (None when none fits)."""
    from .lut16 import build_lut16

    key = (approximate, str(device))
    with _tables_lock:
        if key not in _tables:
            lut, _why = build_lut16(lambda t: torch.nn.functional.gelu(t, approximate=approximate), torch.bfloat16,
                                    device)
            _tables[key] = lut
        return _tables[key]


class GemmLaunch:
    """``out[M, N] = epilogue(bf16(x2 @ weight.T + bias))`` for one layout, launched directly after the first
    call (kernels/launch.CachedLaunch), not through Gluon's JIT binding every argument on every call (an op call
    takes 66.6 µs of host time planned, 122.1 when each call builds its launch: benchmarks/bench_linear_gelu.py).

    ``epi`` 3 is eager's gelu looked up in ``lut`` (kernels/lut16.py; what the op runs), 2 eager's gelu-tanh
    computed, 0 the linear alone (both for benchmarks/probe_gemm_ws.py). x2 [M, K], weight [N, K] bf16
    contiguous, K % BK == 0; out [M, N] bf16 with unit column stride and row stride ``ldc`` (a column slice
    of a wider buffer: the single block's ``cat``)."""

    def __init__(self, M, N, K, ldc, device, has_bias, lut, epi=3, stages=STAGES, group_m=GROUP_M, kernel=None, bn=BN,
                 num_warps=4, maxnreg=MAX_REGISTERS):
        # kernel, bn, num_warps, maxnreg: another kernel of this one's signature (benchmarks/probe_gemm_ws.py)
        self.M, self.N, self.K, self.ldc, self.bn = M, N, K, ldc, bn
        self.w_layout = W_LAYOUT if bn == BN else gl.NVMMASharedLayout.get_default_for([bn, BK], gl.bfloat16)
        progs = min(torch.cuda.get_device_properties(device).multi_processor_count,
                    triton.cdiv(M, BM) * triton.cdiv(N, bn))
        self.lut = lut
        lut_c = lut.constexprs() if lut is not None else dict(LO=0, SPAN=0, SPECIAL=0x7F80, TABLE=4096)
        self.launch = CachedLaunch(kernel or _linear_gelu_kernel, (progs,), dict(
            NUM_PROGS=progs, HAS_BIAS=has_bias, EPI=epi, TBM=BM, TBN=bn, TBK=BK, GROUP=group_m, STG=stages, **lut_c),
            num_warps=num_warps, maxnreg=maxnreg)

    def __call__(self, x2, weight, bias, out):
        M, N, K = self.M, self.N, self.K
        a_desc = TensorDescriptor(x2, [M, K], [K, 1], [BM, BK], A_LAYOUT)
        w_desc = TensorDescriptor(weight, [N, K], [K, 1], [self.bn, BK], self.w_layout)
        table = self.lut.table if self.lut is not None else out  # (not read unless epi == 3)
        self.launch(a_desc, w_desc, table, bias if bias is not None else out, out, M, N, K, self.ldc)
        return out


def launch_gemm(x2, weight, bias, out, lut, epi=3, stages=STAGES, group_m=GROUP_M, **kernel):
    """One call of ``GemmLaunch`` (benchmarks/probe_gemm_ws.py)."""
    (M, K), N = x2.shape, weight.shape[0]
    return GemmLaunch(M, N, K, out.stride(0), x2.device, bias is not None, lut, epi, stages, group_m, **kernel)(
        x2, weight, bias, out)


def plan_linear_gelu(x, weight, bias, approximate="tanh"):
    """A launch for inputs of this layout (they must satisfy ``can_use_linear_gelu``). ``approximate`` has a
    default because the dispatcher leaves out an argument equal to its schema default."""
    K = x.shape[-1]
    M, N = x.numel() // K, weight.shape[0]
    gemm = GemmLaunch(M, N, K, N, x.device, bias is not None, gelu_table(approximate, x.device))
    out_shape = (*x.shape[:-1], N)

    def launch(x, weight, bias, approximate="tanh"):
        out = torch.empty(out_shape, dtype=torch.bfloat16, device=x.device)
        gemm(x.view(M, K), weight, bias, out.view(M, N))
        return out

    return launch


def plan_linear_gelu_cat(x, weight, bias, before, after, approximate="tanh"):
    """``cat([*before, gelu(x @ weight.T + bias), *after], -1)``: the GEMM writes its columns of the ``cat``
    buffer straight (row stride the buffer's width), the other pieces are copied into theirs. Inputs as
    ``can_use_linear_gelu_cat`` accepts them."""
    K = x.shape[-1]
    M, N = x.numel() // K, weight.shape[0]
    col = sum(t.shape[-1] for t in before)
    width = col + N + sum(t.shape[-1] for t in after)
    starts, c = [], 0
    for t in [*before, None, *after]:  # each piece's first column (None: the GEMM's)
        if t is None:
            c += N
        else:
            starts.append(c)
            c += t.shape[-1]
    gemm = GemmLaunch(M, N, K, width, x.device, bias is not None, gelu_table(approximate, x.device))
    out_shape = (*x.shape[:-1], width)

    def launch(x, weight, bias, before, after, approximate="tanh"):
        out = torch.empty(out_shape, dtype=torch.bfloat16, device=x.device)
        # the pieces first: a GEMM store outside its columns would then show as a wrong piece
        for c, t in zip(starts, [*before, *after]):
            out[..., c:c + t.shape[-1]].copy_(t)
        gemm(x.view(M, K), weight, bias, out.view(M, width)[:, col:col + N])
        return out

    return launch


def linear_gelu_gluon(x, weight, bias, approximate="tanh"):
    """Plan and launch once (tests, benchmarks)."""
    return plan_linear_gelu(x, weight, bias, approximate)(x, weight, bias, approximate)
