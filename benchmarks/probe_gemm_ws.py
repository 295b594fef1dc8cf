"""Probe: a warp-specialized Gluon GEMM whose gelu epilogue overlaps the next tile's main loop.

``probe_gemm_exact.py`` found that a Triton GEMM gives cuBLAS's bits at FLUX's linear shapes, but that a gelu
epilogue in a persistent Triton GEMM costs ~0.15 ms per up-projection: each program's tensor cores idle
while its warps run the gelu. cuBLAS's own Hopper kernels hide their epilogue with two consumer warpgroups
that take turns ("ping-pong"). This probe builds that schedule in Gluon (Triton 3.6's Hopper dialect):

* a loader partition (1 warp) issues the TMA loads of every tile of the program, in order, into a ring
  of STAGES shared-memory buffers (``ready``/``empty`` mbarriers per stage);
* two consumer warpgroups (the default partition and a 4-warp worker) take alternate tiles and take turns
  on the ring. Each runs ``warpgroup_mma`` over its tile's K steps in order (one fp32 accumulator, k16
  steps: the accumulation order that gave cuBLAS's bits in probe_gemm_exact), then its epilogue: ``bf16(acc
  + bias)`` into a shared-memory tile buffer, then 32-row chunks of it, optionally with eager's gelu-tanh
  (EPI 2: the recipe; EPI 3: looked up in eager's table, kernels/lut16.py), stored to global memory. While
  one warpgroup runs its epilogue, the ring already holds the other's tile, so the tensor cores keep working.

It prints and writes ($OUT/probe_gemm_ws.json), for FLUX's up-projections: whether the GEMM and the
GEMM + gelu equal eager's (``F.linear``, ``F.gelu(approximate="tanh")``) bitwise, and their times against
cuBLAS, cuBLAS + the lookup gelu kernel the pointwise pass runs (kernels/lut16.py) and cuBLAS + eager's gelu.
Times: CUDA events around 20 calls issued back to back (each Triton call pays its host dispatch).

    python benchmarks/probe_gemm_ws.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
import triton
from tabulate import tabulate
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from diffusion_fuse.kernels.launch import EAGER_NUMERICS
from diffusion_fuse.kernels.pointwise_ops import GELU_TANH_BETA, GELU_TANH_KAPPA

KAPPA = gl.constexpr(float(GELU_TANH_KAPPA))
BETA = gl.constexpr(float(GELU_TANH_BETA))


@gluon.constexpr_function
def smem_layout(rows, cols):
    return gl.NVMMASharedLayout.get_default_for([rows, cols], gl.bfloat16)


@gluon.jit
def _tile_ids(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    width = GROUP_M * num_pid_n
    first_m = (tile // width) * GROUP_M
    size_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (tile % width) % size_m, (tile % width) // size_m


@gluon.jit
def _consume(J0: gl.constexpr, a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, ldc, pid,
             NUM_PROGS: gl.constexpr, EPI: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
             GROUP_M: gl.constexpr, LO: gl.constexpr, SPAN: gl.constexpr, SPECIAL: gl.constexpr,
             TABLE: gl.constexpr):
    """Tiles J0, J0 + 2, ... of this program: K steps through the ring, then the epilogue.

    The two consumers take turns on the ring (``turn`` mbarriers): a consumer starts waiting on its tile's
    stages only after the other has waited on all of its previous tile's. A ``ready`` wait is by phase parity,
    so a consumer that waited a whole tile ahead would take the other's data for its own."""
    # one warpgroup: warps along M ([4, 1]), one wgmma n of the tile's width (BN <= 256)
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    # the epilogue's chunks: 8 contiguous bf16 (16 bytes) per thread, a warp over 2 rows of 128
    CHUNK: gl.constexpr = 32
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    epi_smem = epi_bufs.index(J0)
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    n_local = gl.cdiv(num_pid_m * num_pid_n - pid, NUM_PROGS)
    k_tiles = gl.cdiv(K, BK)
    if EPI == 3:  # eager's gelu as a table (kernels/lut16.py), read once per consumer
        lut_layout: gl.constexpr = gl.BlockedLayout([TABLE // 128], [32], [4], [0])
        lut = gl.load(LUT + gl.arange(0, TABLE, layout=lut_layout))
    t = 0  # this consumer's tiles so far
    for j in range(J0, n_local, 2):
        pid_m, pid_n = _tile_ids(pid + j * NUM_PROGS, num_pid_m, num_pid_n, GROUP_M)
        # consumer 0's first tile needs no turn; every other tile waits for the other's previous main loop
        mbarrier.wait(turn.index(J0), (t + J0 + 1) & 1, pred=(J0 == 1) | (t > 0))
        acc = gl.zeros([BM, BN], gl.float32, layout=layout)
        base = j * k_tiles
        for k in range(k_tiles):
            step = base + k
            s = step % STAGES
            mbarrier.wait(ready.index(s), (step // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
            # the previous step's wgmma is done: its stage goes back to the loader
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), count=1, pred=k > 0)
        mbarrier.arrive(turn.index(1 - J0), count=1)  # every ready wait of this tile is done: the other's turn
        t += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((base + k_tiles - 1) % STAGES), count=1)
        # epilogue through shared memory: bf16(acc + bias) into this consumer's tile buffer (the accumulator's
        # registers free), then row chunks in a coalescing layout: eager's gelu on each, stored to global memory
        cols = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
        bias = gl.load(BIAS + cols, mask=cols < N, other=0.0).to(gl.float32)
        gl.thread_barrier()  # every thread is done reading the buffer's previous tile
        epi_smem.store((acc + gl.expand_dims(bias, 0)).to(gl.bfloat16))
        gl.thread_barrier()
        for r0 in gl.static_range(0, BM, CHUNK):
            xb = epi_smem.slice(r0, CHUNK, dim=0).load(out_layout)
            x = xb.to(gl.float32)
            if EPI == 3:  # kernels/lut16.py's lut16_apply on the chunk's bf16 patterns
                b = gl.reshape(xb.to(gl.uint16, bitcast=True).to(gl.int32), [CHUNK * BN])
                m = b & 0x7FFF
                top = SPAN + 1 + gl.maximum(m - (SPECIAL - 1), 0)
                inner = gl.maximum(gl.minimum(m - (LO - 1), top), 0)
                idx = gl.minimum(m, 256 + inner) + (b >> 15) * (256 + 2 + SPAN + (0x8000 - SPECIAL))
                entry = gl.gather(lut, idx, 0)
                r = gl.reshape((b & (entry >> 16)) + entry, [CHUNK, BN])
                x = gl.convert_layout(r, out_layout).to(gl.uint16).to(gl.bfloat16, bitcast=True).to(gl.float32)
            if EPI == 2:  # eager's gelu-tanh on the rounded output (pointwise_ops' recipe)
                s_ = gl.fma(KAPPA, (x * x) * x, x)
                th = gl.extra.libdevice.tanh(BETA * s_)
                x = (0.5 * x) * (1.0 + th)
            rows = pid_m * BM + r0 + gl.arange(0, CHUNK, layout=gl.SliceLayout(1, out_layout))
            ocols = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, out_layout))
            ptrs = C + gl.expand_dims(rows, 1) * ldc + gl.expand_dims(ocols, 0)
            mask = (gl.expand_dims(rows, 1) < M) & (gl.expand_dims(ocols, 0) < N)
            gl.store(ptrs, x.to(gl.bfloat16), mask=mask)


@gluon.jit
def _consumer0(a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, ldc, pid, NUM_PROGS: gl.constexpr,
               EPI: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr,
               LO: gl.constexpr, SPAN: gl.constexpr, SPECIAL: gl.constexpr, TABLE: gl.constexpr):
    _consume(0, a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, ldc, pid, NUM_PROGS, EPI, BM, BN, BK, GROUP_M, LO, SPAN, SPECIAL, TABLE)


@gluon.jit
def _consumer1(a_desc, w_desc, a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, ldc, pid, NUM_PROGS: gl.constexpr,
               EPI: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr,
               LO: gl.constexpr, SPAN: gl.constexpr, SPECIAL: gl.constexpr, TABLE: gl.constexpr):
    _consume(1, a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, ldc, pid, NUM_PROGS, EPI, BM, BN, BK, GROUP_M, LO, SPAN, SPECIAL, TABLE)


@gluon.jit
def _loader(a_desc, w_desc, a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, ldc, pid, NUM_PROGS: gl.constexpr,
            EPI: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr,
            LO: gl.constexpr, SPAN: gl.constexpr, SPECIAL: gl.constexpr, TABLE: gl.constexpr):
    """Every tile of this program in order, each K step into the next free stage of the ring."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    n_local = gl.cdiv(num_pid_m * num_pid_n - pid, NUM_PROGS)
    k_tiles = gl.cdiv(K, BK)
    for j in range(n_local):
        pid_m, pid_n = _tile_ids(pid + j * NUM_PROGS, num_pid_m, num_pid_n, GROUP_M)
        for k in range(k_tiles):
            step = j * k_tiles + k
            s = step % STAGES
            mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)  # a fresh barrier counts as released
            mbarrier.expect(ready.index(s), BM * BK * 2 + BN * BK * 2)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BM, k * BK], ready.index(s), a_bufs.index(s))
            tma.async_copy_global_to_shared(w_desc, [pid_n * BN, k * BK], ready.index(s), b_bufs.index(s))


@gluon.jit
def _gemm_ws_kernel(a_desc, w_desc, LUT, BIAS, C, M, N, K, ldc, NUM_PROGS: gl.constexpr, EPI: gl.constexpr,
                    BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                    LO: gl.constexpr, SPAN: gl.constexpr, SPECIAL: gl.constexpr, TABLE: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], smem_layout(BM, BK))
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], smem_layout(BN, BK))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    epi_bufs = gl.allocate_shared_memory(gl.bfloat16, [2, BM, BN],
                                         gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0]))
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    pid = gl.program_id(0)
    # (the argument tuples are written out: one bound to a name first hands the workers its constexprs as tensors)
    gl.warp_specialize([
        (_consumer0, (a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, ldc, pid, NUM_PROGS, EPI, BM, BN, BK,
                      GROUP_M, LO, SPAN, SPECIAL, TABLE)),
        (_consumer1, (a_desc, w_desc, a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, ldc, pid, NUM_PROGS, EPI, BM, BN, BK,
                      GROUP_M, LO, SPAN, SPECIAL, TABLE)),
        (_loader, (a_desc, w_desc, a_bufs, b_bufs, ready, empty, turn, epi_bufs, LUT, BIAS, C, M, N, K, ldc, pid, NUM_PROGS, EPI, BM, BN, BK,
                   GROUP_M, LO, SPAN, SPECIAL, TABLE)),
    ], [4, 1], [232, 40])


def gemm_ws(x, w, b, epi=0, bm=128, bn=128, bk=64, stages=4, group_m=8, maxnreg=168, lut=None):
    """``bf16(x @ w.T + b)`` [then eager's gelu-tanh]: x [M, K], w [N, K] bf16 contiguous, K % bk == 0."""
    M, K = x.shape
    N = w.shape[0]
    assert K % bk == 0 and x.is_contiguous() and w.is_contiguous()
    c = torch.empty(M, N, dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    progs = min(torch.cuda.get_device_properties(x.device).multi_processor_count, tiles)
    a_desc = TensorDescriptor.from_tensor(x, [bm, bk], gl.NVMMASharedLayout.get_default_for([bm, bk], gl.bfloat16))
    w_desc = TensorDescriptor.from_tensor(w, [bn, bk], gl.NVMMASharedLayout.get_default_for([bn, bk], gl.bfloat16))
    lut_c = lut.constexprs() if lut is not None else dict(LO=0, SPAN=0, SPECIAL=0x7F80, TABLE=4096)
    table = lut.table if lut is not None else b
    _gemm_ws_kernel[(progs,)](a_desc, w_desc, table, b, c, M, N, K, c.stride(0), NUM_PROGS=progs, EPI=epi, BM=bm, BN=bn, BK=bk,
                              GROUP_M=group_m, STAGES=stages, num_warps=4, maxnreg=maxnreg, **lut_c,
                              **EAGER_NUMERICS)
    return c


SHAPES = {"small (256 x 128 x 384)": (256, 128, 384),
          "img ff up (4096 x 3072 x 12288)": (4096, 3072, 12288),
          "single proj_mlp (4608 x 3072 x 12288)": (4608, 3072, 12288),
          "img to_q (4096 x 3072 x 3072)": (4096, 3072, 3072)}
VARIANTS = [dict(stages=4), dict(stages=3), dict(stages=4, group_m=16)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "probe_gemm_ws.json"))
    ap.add_argument("--variant", type=int, default=None, help="one of VARIANTS only (a kernel that faults takes "
                    "its process's CUDA context with it: run each in its own process)")
    args = ap.parse_args()
    variants = VARIANTS if args.variant is None else [VARIANTS[args.variant]]
    from probe_gemm_exact import bits_equal, ms_per_call

    from diffusion_fuse.kernels.lut16 import build_lut16, lut16_triton

    gelu = lambda t: F.gelu(t, approximate="tanh")  # noqa: E731
    lut, why = build_lut16(gelu, torch.bfloat16, "cuda")
    assert lut is not None, why
    g = torch.Generator(device="cuda").manual_seed(2)
    rows, records = [], []
    for name, (M, K, N) in SHAPES.items():
        x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
        w = (torch.randn(N, K, device="cuda", generator=g) * K ** -0.5).bfloat16()
        b = (torch.randn(N, device="cuda", generator=g) * 0.1).bfloat16()
        ref = F.linear(x, w, b)
        base = {"cuBLAS": lambda: F.linear(x, w, b),  # noqa: B023
                "cuBLAS + lookup gelu": lambda: lut16_triton(F.linear(x, w, b), lut, 8192, 16),  # noqa: B023
                "cuBLAS + eager gelu": lambda: gelu(F.linear(x, w, b))}  # noqa: B023
        rec = dict(shape=name, M=M, K=K, N=N, base_ms={k: ms_per_call(f) for k, f in base.items()}, variants=[])
        rows += [[name, k, "", f"{v:.3f}", ""] for k, v in rec["base_ms"].items()]
        for var in variants:
            label = ", ".join(f"{k} {v}" for k, v in var.items())
            v = dict(variant=label)
            try:
                v["exact_gemm"], v["ndiff_gemm"] = bits_equal(ref, gemm_ws(x, w, b, 0, **var))
                v["exact_gelu"], v["ndiff_gelu"] = bits_equal(gelu(ref), gemm_ws(x, w, b, 2, **var))
                v["exact_lut"], v["ndiff_lut"] = bits_equal(gelu(ref), gemm_ws(x, w, b, 3, lut=lut, **var))
                v["gemm_ms"] = ms_per_call(lambda: gemm_ws(x, w, b, 0, **var))  # noqa: B023
                v["gelu_ms"] = ms_per_call(lambda: gemm_ws(x, w, b, 2, **var))  # noqa: B023
                v["lut_ms"] = ms_per_call(lambda: gemm_ws(x, w, b, 3, lut=lut, **var))  # noqa: B023
                rows.append(["", f"WS ping-pong 128x128x64, {label}",
                             " / ".join("exact" if v[f"exact_{e}"] else f"DIFF {v[f'ndiff_{e}']}"
                                        for e in ("gemm", "gelu", "lut")),
                             f"{v['gemm_ms']:.3f}", f"{v['gelu_ms']:.3f}", f"{v['lut_ms']:.3f}"])
            except Exception as e:  # a variant that does not build or run is reported, not fatal
                v["error"] = f"{type(e).__name__}: {str(e)[:400]}"
                rows.append(["", label, "error", v["error"][:60], ""])
            rec["variants"].append(v)
        records.append(rec)
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), records=records), f, indent=2)
    print(tabulate(rows, headers=["shape", "variant", "bits (GEMM / + gelu / + gelu looked up)", "GEMM ms",
                                  "GEMM + gelu ms", "GEMM + gelu looked up ms"]))


if __name__ == "__main__":
    main()
