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

``schedule="coop"`` runs this file's other kernel: both MMA warpgroups on one 128 x 256 tile (sharing its B tile,
loading their own ring ahead) and the epilogue in a third warpgroup, for half the L2 and shared-memory traffic
per flop of a 128 x 128 tile.

The kernel now lives in kernels/linear_gelu.py (``launch_gemm``; ``EPI`` 0/2/3), behind the opt-in ``linear_gelu``
family; runs 6-10 of results/h200-2026-11-30k ran it as it stood in this file at the commits COMMANDS.md names.

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
from tabulate import tabulate

from diffusion_fuse.kernels.linear_gelu import BK, GLUON_ERROR, GROUP_M, launch_gemm

if not GLUON_ERROR:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

    from diffusion_fuse.kernels.linear_gelu import _alloc_ring, _store_chunk, _tile_ids

COOP = dict(bn=256, stages=3, num_warps=8, maxnreg=168)  # 12 warps (8 MMA, 4 epilogue) x 32 x 168 <= 64K registers

if not GLUON_ERROR:
    # Cooperative schedule: both MMA warpgroups on one 128 x 256 tile (64 rows each, one B tile shared), loading
    # their own ring ahead (Triton's software pipeline), the epilogue in a third warpgroup of its own. A 128 x 128
    # ping-pong tile reads A and B through L2 and shared memory for half the math of this one's (cuBLAS's
    # 256 x 128 ratio). 12 warps: a separate loader warp would make 16, too many for the MMA's 154+ registers.
    @gluon.jit
    def _coop_load(a_desc, w_desc, a_bufs, b_bufs, ready, step, n_local, k_tiles, pid, num_pid_m, num_pid_n,
                   NUM_PROGS: gl.constexpr, TBM: gl.constexpr, TBN: gl.constexpr, TBK: gl.constexpr,
                   GROUP: gl.constexpr):
        """TMA loads of this program's K step ``step`` (counted over all its tiles) into its ring stage."""
        STG: gl.constexpr = a_bufs.type.shape[0]
        j = step // k_tiles
        pid_m, pid_n = _tile_ids(pid + j * NUM_PROGS, num_pid_m, num_pid_n, GROUP)
        s = step % STG
        live = j < n_local
        mbarrier.expect(ready.index(s), TBM * TBK * 2 + TBN * TBK * 2, pred=live)
        k = (step % k_tiles) * TBK
        tma.async_copy_global_to_shared(a_desc, [pid_m * TBM, k], ready.index(s), a_bufs.index(s), pred=live)
        tma.async_copy_global_to_shared(w_desc, [pid_n * TBN, k], ready.index(s), b_bufs.index(s), pred=live)

    @gluon.jit
    def _coop_mma(a_desc, w_desc, a_bufs, b_bufs, ready, handoff, epi_bufs, LUT, BIAS, C, M, N, K, LDC, pid,
                  NUM_PROGS: gl.constexpr, HAS_BIAS: gl.constexpr, EPI: gl.constexpr, TBM: gl.constexpr,
                  TBN: gl.constexpr, TBK: gl.constexpr, GROUP: gl.constexpr, LO: gl.constexpr, SPAN: gl.constexpr,
                  SPECIAL: gl.constexpr, TABLE: gl.constexpr):
        """Every tile of this program: K steps through the ring (each step's wait on its predecessor's MMA frees
        a stage for the load STG - 1 steps ahead, next tile's included), then ``bf16(acc + bias)`` into the tile
        buffer once the epilogue partition has read the previous tile out of it (``handoff`` 1); 0 signals it."""
        layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                         instr_shape=[16, TBN, 16])
        STG: gl.constexpr = a_bufs.type.shape[0]
        epi_smem = epi_bufs.index(0)
        num_pid_m = gl.cdiv(M, TBM)
        num_pid_n = gl.cdiv(N, TBN)
        n_local = gl.cdiv(num_pid_m * num_pid_n - pid, NUM_PROGS)
        k_tiles = K // TBK
        for p in gl.static_range(STG - 1):
            _coop_load(a_desc, w_desc, a_bufs, b_bufs, ready, p, n_local, k_tiles, pid, num_pid_m, num_pid_n,
                       NUM_PROGS, TBM, TBN, TBK, GROUP)
        for j in range(n_local):
            pid_m, pid_n = _tile_ids(pid + j * NUM_PROGS, num_pid_m, num_pid_n, GROUP)
            acc = gl.zeros([TBM, TBN], gl.float32, layout=layout)
            base = j * k_tiles
            for k in range(k_tiles):
                step = base + k
                s = step % STG
                mbarrier.wait(ready.index(s), (step // STG) & 1)
                acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))  # the previous step's stage is free
                gl.thread_barrier()  # in both warpgroups
                _coop_load(a_desc, w_desc, a_bufs, b_bufs, ready, step + STG - 1, n_local, k_tiles, pid, num_pid_m,
                           num_pid_n, NUM_PROGS, TBM, TBN, TBK, GROUP)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            if HAS_BIAS:
                cols = pid_n * TBN + gl.arange(0, TBN, layout=gl.SliceLayout(0, layout))
                acc = acc + gl.expand_dims(gl.load(BIAS + cols, mask=cols < N, other=0.0).to(gl.float32), 0)
            mbarrier.wait(handoff.index(1), (j & 1) ^ 1)  # a fresh barrier counts as released
            epi_smem.store(acc.to(gl.bfloat16))
            mbarrier.arrive(handoff.index(0), count=1)  # (after a barrier over this partition's warps)

    @gluon.jit
    def _coop_epilogue(handoff, epi_bufs, LUT, BIAS, C, M, N, K, LDC, pid, NUM_PROGS: gl.constexpr, HAS_BIAS: gl.constexpr, EPI: gl.constexpr, TBM: gl.constexpr,
                       TBN: gl.constexpr, TBK: gl.constexpr, GROUP: gl.constexpr, LO: gl.constexpr,
                       SPAN: gl.constexpr, SPECIAL: gl.constexpr, TABLE: gl.constexpr):
        """Each tile the MMA partition hands over: out of the tile buffer in CHUNK-row pieces, through the
        epilogue, to C; then the buffer is released (``handoff`` 1)."""
        CHUNK: gl.constexpr = 8
        out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
        lut_layout: gl.constexpr = gl.BlockedLayout([TABLE // 128], [32], [4], [0])
        SLOTS: gl.constexpr = 256 + 2 + SPAN + (0x8000 - SPECIAL)  # kernels/lut16.py: a sign's slots
        epi_smem = epi_bufs.index(0)
        lut = gl.load(LUT + gl.arange(0, TABLE, layout=lut_layout)) if EPI == 3 else 0
        num_pid_m = gl.cdiv(M, TBM)
        num_pid_n = gl.cdiv(N, TBN)
        n_local = gl.cdiv(num_pid_m * num_pid_n - pid, NUM_PROGS)
        for j in range(n_local):
            pid_m, pid_n = _tile_ids(pid + j * NUM_PROGS, num_pid_m, num_pid_n, GROUP)
            mbarrier.wait(handoff.index(0), j & 1)
            for r0 in gl.static_range(0, TBM, CHUNK):
                _store_chunk(epi_smem, r0, CHUNK, out_layout, lut, C, M, N, LDC, pid_m * TBM, pid_n * TBN, EPI, LO,
                             SPAN, SPECIAL, SLOTS)
            mbarrier.arrive(handoff.index(1), count=1)

    @gluon.jit
    def _linear_gelu_coop_kernel(a_desc, w_desc, LUT, BIAS, C, M, N, K, LDC, NUM_PROGS: gl.constexpr,
                                 HAS_BIAS: gl.constexpr, EPI: gl.constexpr, TBM: gl.constexpr, TBN: gl.constexpr,
                                 TBK: gl.constexpr, GROUP: gl.constexpr, STG: gl.constexpr, LO: gl.constexpr,
                                 SPAN: gl.constexpr, SPECIAL: gl.constexpr, TABLE: gl.constexpr):
        a_bufs, b_bufs, ready, handoff, epi_bufs = _alloc_ring(STG, TBM, TBN, TBK, 1)
        pid = gl.program_id(0)
        gl.warp_specialize([
            (_coop_mma, (a_desc, w_desc, a_bufs, b_bufs, ready, handoff, epi_bufs, LUT, BIAS, C, M, N, K, LDC, pid,
                         NUM_PROGS, HAS_BIAS, EPI, TBM, TBN, TBK, GROUP, LO, SPAN, SPECIAL, TABLE)),
            (_coop_epilogue, (handoff, epi_bufs, LUT, BIAS, C, M, N, K, LDC, pid, NUM_PROGS, HAS_BIAS, EPI, TBM, TBN,
                              TBK, GROUP, LO, SPAN, SPECIAL, TABLE)),
        ], [4], [112])  # the epilogue warpgroup: 112 registers, the rest to the MMA's


def gemm_ws(x, w, b, epi=0, stages=None, group_m=GROUP_M, lut=None, schedule="pingpong"):
    """``bf16(x @ w.T + b)`` [then eager's gelu-tanh: epi 2 computed, 3 looked up in ``lut``] with the kernel of
    kernels/linear_gelu.py (``schedule="coop"``: this file's cooperative one): x [M, K], w [N, K] bf16 contiguous,
    K % 64 == 0."""
    assert x.shape[1] % BK == 0 and x.is_contiguous() and w.is_contiguous()
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    kernel = dict(COOP, kernel=_linear_gelu_coop_kernel) if schedule == "coop" else {}
    if stages is not None:
        kernel["stages"] = stages
    return launch_gemm(x, w, b, out, lut, epi, group_m=group_m, **kernel)


SHAPES = {"small (256 x 128 x 384)": (256, 128, 384),
          "img ff up (4096 x 3072 x 12288)": (4096, 3072, 12288),
          "single proj_mlp (4608 x 3072 x 12288)": (4608, 3072, 12288),
          "img to_q (4096 x 3072 x 3072)": (4096, 3072, 3072)}
VARIANTS = [dict(schedule="pingpong"), dict(schedule="coop"), dict(schedule="coop", group_m=16),
            dict(schedule="pingpong", stages=3)]


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
                rows.append(["", label,
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
