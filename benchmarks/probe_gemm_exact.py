"""Probe: can a Triton GEMM reproduce eager's cuBLAS linear bit for bit, and at what speed?

Why: about 90% of a lossless FLUX forward is eager's own GEMMs and attention. The elementwise work that
sits on a GEMM's output (gelu of the MLP's up-projection, the single block's ``cat``) costs a full write
and read of a [4608, 12288] bf16 tensor per block, which only a GEMM epilogue can remove. An epilogue
needs our own GEMM, and the lossless tier needs that GEMM to give cuBLAS's bits.

The hypothesis: for bf16 inputs, cuBLAS's large non-split-K kernels (nvjet ``..._bias_TN*``) and a Triton
``tl.dot`` loop both accumulate each output in one fp32 register through sm_90 ``wgmma ... k16``
instructions issued in K order, so the accumulators are equal; the bias epilogue is then
``bf16(acc + float(bias))``. Split-K kernels (small M) reduce in another order and are not candidates.

For each FLUX linear shape this prints and writes ($OUT/probe_gemm_exact.json): the cuBLAS kernel eager
runs (torch.profiler), and per Triton variant (tile, stages, warps; pointer loads or TMA descriptors,
persistent or not) whether its output equals ``F.linear``'s bitwise (and, if not, whether
``bf16(bf16(acc) + bias)`` does), its time against cuBLAS's, and for the up-projections the time of
the GEMM with eager's gelu-tanh in its epilogue against cuBLAS + eager's gelu. ``--epilogue`` times
the epilogue variants (EPILOGUE_VARIANTS) against cuBLAS + the lookup gelu kernel the pointwise pass runs
($OUT/probe_gemm_exact_epilogue.json).

Times are CUDA events around 20 calls issued back to back from Python: each Triton call pays its JIT dispatch
(and an allocation) on the host, so a GEMM of a few tens of µs (the 512-row ones) is partly host-bound there.

    python benchmarks/probe_gemm_exact.py [--quick] [--epilogue] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from tabulate import tabulate

from diffusion_fuse.kernels.launch import EAGER_NUMERICS
from diffusion_fuse.kernels.pointwise_ops import GELU_TANH_BETA, GELU_TANH_KAPPA, interpreter_libdevice, triton_interpret

try:
    from steady import timed_back_to_back
except ImportError:  # imported as benchmarks.<module>
    from benchmarks.steady import timed_back_to_back

if triton_interpret():
    libdevice = interpreter_libdevice()
else:
    from triton.language.extra import libdevice

# FLUX.1-dev at 1024^2: 4096 image + 512 text tokens; D 3072, MLP 12288
SHAPES = {
    "attn to_q (img)": (4096, 3072, 3072),
    "single to_q / proj (4608)": (4608, 3072, 3072),
    "single proj_mlp (up)": (4608, 3072, 12288),
    "single proj_out (15360 -> 3072)": (4608, 15360, 3072),
    "ff up (img)": (4096, 3072, 12288),
    "ff down (img)": (4096, 12288, 3072),
    "txt to_q (512)": (512, 3072, 3072),
    "txt ff up (512)": (512, 3072, 12288),
}
UP = ("single proj_mlp (up)", "ff up (img)", "txt ff up (512)")

# (BM, BN, BK, stages, warps)
CONFIGS = [(128, 256, 64, 3, 8), (128, 256, 64, 4, 8), (128, 128, 64, 4, 8), (256, 128, 64, 3, 8)]
QUICK_CONFIGS = [(128, 256, 64, 3, 8), (128, 128, 64, 4, 8)]


@triton.jit
def _gelu_tanh(x):
    """eager's bf16 gelu(approximate='tanh') on a bf16 value widened to fp32 (pointwise_ops' recipe)."""
    cube = (x * x) * x
    s = tl.fma(KAPPA, cube, x)
    t = libdevice.tanh(BETA * s)
    return (0.5 * x) * (1.0 + t)


KAPPA = tl.constexpr(float(GELU_TANH_KAPPA))
BETA = tl.constexpr(float(GELU_TANH_BETA))


@triton.jit
def _tile_ids(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    width = GROUP_M * num_pid_n
    group = tile // width
    first_m = group * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % width) % size_m
    pid_n = (tile % width) // size_m
    return pid_m, pid_n


@triton.jit
def _epilogue(acc, bias, EPI: tl.constexpr):
    """EPI 0: bf16(acc + bias); 1: bf16(bf16(acc) + bias) (the alternative rounding); 2: 0 then gelu-tanh."""
    if EPI == 1:
        y = acc.to(tl.bfloat16).to(tl.float32) + bias[None, :]
    else:
        y = acc + bias[None, :]
    if EPI == 2:
        y = _gelu_tanh(y.to(tl.bfloat16).to(tl.float32))
    return y.to(tl.bfloat16)


@triton.jit
def _mm_ptr_kernel(A, W, BIAS, C, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, ldc: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   GROUP_M: tl.constexpr, EPI: tl.constexpr):
    """C[M, N] (row stride ldc) = A[M, K] @ W[N, K]^T + bias, one tile per program, pointer loads."""
    tl.static_assert(K % BK == 0, "K must be a multiple of BK (the K loop is unmasked)")
    pid_m, pid_n = _tile_ids(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptr = A + rm[:, None] * K + rk[None, :]
    w_ptr = W + rn[:, None] * K + rk[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):  # sizes are constexprs: one build per shape (and Triton's interpreter runs it)
        a = tl.load(a_ptr, mask=rm[:, None] < M, other=0.0)
        w = tl.load(w_ptr, mask=rn[:, None] < N, other=0.0)
        acc = tl.dot(a, w.T, acc)  # K order: BK / 16 wgmma k16 steps per trip, trips in order
        a_ptr += BK
        w_ptr += BK
    bias = tl.load(BIAS + rn, mask=rn < N, other=0.0).to(tl.float32)
    y = _epilogue(acc, bias, EPI)
    tl.store(C + rm[:, None] * ldc + rn[None, :], y, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _mm_tma_persistent_kernel(A, W, BIAS, C, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                              ldc: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                              GROUP_M: tl.constexpr, EPI: tl.constexpr, NUM_SMS: tl.constexpr,
                              TMA_STORE: tl.constexpr = True, SPLIT: tl.constexpr = 1):
    """The same, as a persistent kernel (NUM_SMS programs walk the tiles) over TMA descriptors.
    TMA_STORE=False: the tile is stored from registers (no shared-memory staging: more pipeline stages or
    two programs per SM fit). SPLIT 2 or 4: the epilogue runs and stores BN / SPLIT columns at a time
    (fewer live registers; a smaller staging buffer)."""
    a_desc = tl.make_tensor_descriptor(A, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    w_desc = tl.make_tensor_descriptor(W, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    c_desc = tl.make_tensor_descriptor(C, shape=[M, N], strides=[ldc, 1], block_shape=[BM, BN // SPLIT])
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS, flatten=True):
        pid_m, pid_n = _tile_ids(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            a = a_desc.load([pid_m * BM, k])
            w = w_desc.load([pid_n * BN, k])
            acc = tl.dot(a, w.T, acc)
        rn = pid_n * BN + tl.arange(0, BN)
        if SPLIT == 2:
            h0, h1 = acc.reshape(BM, 2, BN // 2).permute(0, 2, 1).split()
            _store_part(c_desc, h0, BIAS, N, pid_m * BM, pid_n * BN, BN // 2, EPI)
            _store_part(c_desc, h1, BIAS, N, pid_m * BM, pid_n * BN + BN // 2, BN // 2, EPI)
        elif SPLIT == 4:
            h0, h1 = acc.reshape(BM, 2, BN // 2).permute(0, 2, 1).split()
            q0, q1 = h0.reshape(BM, 2, BN // 4).permute(0, 2, 1).split()
            _store_part(c_desc, q0, BIAS, N, pid_m * BM, pid_n * BN, BN // 4, EPI)
            _store_part(c_desc, q1, BIAS, N, pid_m * BM, pid_n * BN + BN // 4, BN // 4, EPI)
            q2, q3 = h1.reshape(BM, 2, BN // 4).permute(0, 2, 1).split()
            _store_part(c_desc, q2, BIAS, N, pid_m * BM, pid_n * BN + BN // 2, BN // 4, EPI)
            _store_part(c_desc, q3, BIAS, N, pid_m * BM, pid_n * BN + 3 * (BN // 4), BN // 4, EPI)
        elif TMA_STORE:
            bias = tl.load(BIAS + rn, mask=rn < N, other=0.0).to(tl.float32)
            c_desc.store([pid_m * BM, pid_n * BN], _epilogue(acc, bias, EPI))
        else:
            bias = tl.load(BIAS + rn, mask=rn < N, other=0.0).to(tl.float32)
            rm = pid_m * BM + tl.arange(0, BM)
            tl.store(C + rm[:, None] * ldc + rn[None, :], _epilogue(acc, bias, EPI),
                     mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _store_part(c_desc, part, BIAS, N, row0, col0, WIDTH: tl.constexpr, EPI: tl.constexpr):
    rn = col0 + tl.arange(0, WIDTH)
    bias = tl.load(BIAS + rn, mask=rn < N, other=0.0).to(tl.float32)
    c_desc.store([row0, col0], _epilogue(part, bias, EPI))


def triton_linear(x, w, b, cfg, kind: str, epi: int = 0, out=None, per_sm: int = 1, tma_store: bool = True,
                  split: int = 1):
    """``kind`` "ptr" (a program per tile) or "tma" (persistent, ``per_sm`` programs per SM)."""
    BM, BN, BK, stages, warps = cfg
    M, K = x.shape
    N = w.shape[0]
    c = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    common = dict(BM=BM, BN=BN, BK=BK, GROUP_M=8, EPI=epi, num_stages=stages, num_warps=warps, **EAGER_NUMERICS)
    if kind == "ptr":
        _mm_ptr_kernel[(tiles,)](x, w, b, c, M, N, K, c.stride(0), **common)
    else:
        progs = min(per_sm * torch.cuda.get_device_properties(x.device).multi_processor_count, tiles)
        _mm_tma_persistent_kernel[(progs,)](x, w, b, c, M, N, K, c.stride(0), NUM_SMS=progs, TMA_STORE=tma_store,
                                            SPLIT=split, **common)
    return c


def ms_per_call(fn, calls: int = 20, rounds: int = 5) -> float:
    """Median over ``rounds`` of the ms per call of ``calls`` calls issued back to back, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    return statistics.median(timed_back_to_back(fn, calls) for _ in range(rounds))


def cublas_kernel_name(fn) -> str:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    return " + ".join(dict.fromkeys(n[:70] for n in names))


def bits_equal(a, b) -> tuple[bool, int]:
    d = a.view(torch.int16) != b.view(torch.int16)
    return not bool(d.any()), int(d.sum())


# The epilogue study (--epilogue): where the gelu epilogue's arithmetic can overlap another tile's main loop
# (two programs per SM) or the tile is stored from registers (shared memory left for more stages).
# (kind, (BM, BN, BK, stages, warps), programs per SM, TMA store, epilogue column split)
# Session 11 (results/h200-2026-11-30k/run2): without a split every variant's gelu epilogue cost 0.16-0.72 ms
# (0.607-1.393 ms against the GEMM's 0.397-0.688), more than cuBLAS + the lookup kernel (0.505-0.515).
EPILOGUE_VARIANTS = [
    ("tma", (128, 256, 64, 3, 8), 1, True, 1),
    ("tma", (128, 256, 64, 3, 8), 1, True, 2),
    ("tma", (128, 256, 64, 3, 8), 1, True, 4),
    ("tma", (128, 256, 64, 4, 8), 1, True, 4),
    ("tma", (128, 128, 64, 3, 4), 2, False, 1),
    ("tma", (128, 128, 64, 3, 4), 2, True, 2),
    ("tma", (128, 128, 64, 3, 4), 1, True, 2),
    ("tma", (128, 128, 64, 4, 8), 1, True, 2),
]


def epilogue_study(json_path: str) -> None:
    """Up-projections with eager's gelu-tanh in the epilogue, against cuBLAS + the lookup gelu kernel
    (kernels/lut16.py, what the pointwise pass runs for FLUX's FF gelu) and cuBLAS + eager's gelu."""
    from diffusion_fuse.kernels.lut16 import build_lut16, lut16_triton

    gelu = lambda t: F.gelu(t, approximate="tanh")  # noqa: E731
    lut, why = build_lut16(gelu, torch.bfloat16, "cuda")
    assert lut is not None, why
    g = torch.Generator(device="cuda").manual_seed(1)
    rows, records = [], []
    for name in ("single proj_mlp (up)", "ff up (img)"):
        M, K, N = SHAPES[name]
        x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
        w = (torch.randn(N, K, device="cuda", generator=g) * K ** -0.5).bfloat16()
        b = (torch.randn(N, device="cuda", generator=g) * 0.1).bfloat16()
        ref = gelu(F.linear(x, w, b))
        assert torch.equal(lut16_triton(F.linear(x, w, b), lut, 8192, 16).view(torch.int16), ref.view(torch.int16))
        base = {"cuBLAS alone": lambda: F.linear(x, w, b),  # noqa: B023
                "cuBLAS + lookup gelu": lambda: lut16_triton(F.linear(x, w, b), lut, 8192, 16),  # noqa: B023
                "cuBLAS + eager gelu": lambda: gelu(F.linear(x, w, b))}  # noqa: B023
        rec = dict(shape=name, M=M, K=K, N=N, base_ms={k: ms_per_call(f) for k, f in base.items()}, variants=[])
        for k, v in rec["base_ms"].items():
            rows.append([name, k, "", f"{v:.3f}", ""])
        for kind, cfg, per_sm, tma_store, split in EPILOGUE_VARIANTS:
            label = (f"{kind} {cfg[0]}x{cfg[1]}x{cfg[2]} s{cfg[3]} w{cfg[4]} x{per_sm}/SM "
                     f"{'tma' if tma_store else 'reg'} store" + (f", {split} parts" if split > 1 else ""))
            v = dict(variant=label)
            try:
                run = lambda e: triton_linear(x, w, b, cfg, kind, e, per_sm=per_sm, tma_store=tma_store,  # noqa: B023,E731
                                              split=split)  # noqa: B023
                v["exact_gemm"] = bits_equal(F.linear(x, w, b), run(0))[0]
                v["exact_gelu"] = bits_equal(ref, run(2))[0]
                v["gemm_ms"] = ms_per_call(lambda: run(0))  # noqa: B023
                v["gelu_ms"] = ms_per_call(lambda: run(2))  # noqa: B023
                rows.append(["", label, "exact" if v["exact_gemm"] and v["exact_gelu"] else "DIFF",
                             f"{v['gemm_ms']:.3f}", f"{v['gelu_ms']:.3f}"])
            except Exception as e:  # a config that does not build here is reported, not fatal
                v["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(["", label, "error", v["error"][:50], ""])
            rec["variants"].append(v)
        records.append(rec)
        with open(json_path, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), records=records), f, indent=2)
    print(tabulate(rows, headers=["shape", "variant", "bits", "GEMM ms", "GEMM + gelu epilogue ms"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="two tile configs, fewer shapes")
    ap.add_argument("--epilogue", action="store_true", help="the gelu-epilogue study only (EPILOGUE_VARIANTS)")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "probe_gemm_exact.json"))
    args = ap.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    if args.epilogue:
        return epilogue_study(args.json.replace(".json", "_epilogue.json"))
    configs = QUICK_CONFIGS if args.quick else CONFIGS
    g = torch.Generator(device="cuda").manual_seed(0)
    rows, records = [], []
    for name, (M, K, N) in SHAPES.items():
        if args.quick and name not in ("single proj_mlp (up)", "single proj_out (15360 -> 3072)", "txt to_q (512)"):
            continue
        x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
        w = (torch.randn(N, K, device="cuda", generator=g) * K ** -0.5).bfloat16()
        b = (torch.randn(N, device="cuda", generator=g) * 0.1).bfloat16()
        ref = F.linear(x, w, b)
        kname = cublas_kernel_name(lambda: F.linear(x, w, b))  # noqa: B023
        t_cublas = ms_per_call(lambda: F.linear(x, w, b))  # noqa: B023
        tflops = 2 * M * N * K / (t_cublas * 1e-3) / 1e12
        rec = dict(shape=name, M=M, K=K, N=N, cublas_kernel=kname, cublas_ms=t_cublas, cublas_tflops=tflops,
                   variants=[])
        if name in UP:
            gelu_ref = F.gelu(ref, approximate="tanh")
            t_gelu = ms_per_call(lambda: F.gelu(F.linear(x, w, b), approximate="tanh"))  # noqa: B023
            rec["cublas_plus_eager_gelu_ms"] = t_gelu
        rows.append([name, f"{M}x{K}x{N}", "cuBLAS", kname[:40], "", f"{t_cublas:.3f}", "1.000", f"{tflops:.0f}", ""])
        for kind in ("ptr", "tma"):
            for cfg in configs:
                label = f"{kind} {cfg[0]}x{cfg[1]}x{cfg[2]} s{cfg[3]} w{cfg[4]}"
                v = dict(variant=label)
                try:
                    got = triton_linear(x, w, b, cfg, kind)
                    v["exact"], v["ndiff"] = bits_equal(ref, got)
                    if not v["exact"]:
                        v["exact_round_acc_first"] = bits_equal(ref, triton_linear(x, w, b, cfg, kind, epi=1))[0]
                        v["max_abs_diff"] = float((ref.float() - got.float()).abs().max())
                    v["ms"] = ms_per_call(lambda: triton_linear(x, w, b, cfg, kind))  # noqa: B023
                    if name in UP:
                        v["gelu_epilogue_exact"] = bits_equal(gelu_ref, triton_linear(x, w, b, cfg, kind, epi=2))[0]
                        v["gelu_epilogue_ms"] = ms_per_call(lambda: triton_linear(x, w, b, cfg, kind, epi=2))  # noqa: B023
                except Exception as e:  # a config that does not build here is reported, not fatal
                    v["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                rec["variants"].append(v)
                if "error" in v:
                    rows.append(["", "", label, "error", v["error"][:60], "", "", "", ""])
                    continue
                gelu = (f"{v['gelu_epilogue_ms']:.3f} ({'exact' if v['gelu_epilogue_exact'] else 'DIFF'}) vs "
                        f"{rec['cublas_plus_eager_gelu_ms']:.3f}") if name in UP else ""
                rows.append(["", "", label, "exact" if v["exact"] else f"DIFF {v['ndiff']}"
                             + (" (acc-first: exact)" if v.get("exact_round_acc_first") else ""),
                             "", f"{v['ms']:.3f}", f"{v['ms'] / t_cublas:.3f}",
                             f"{2 * M * N * K / (v['ms'] * 1e-3) / 1e12:.0f}", gelu])
        records.append(rec)
        print(f"done {name}", flush=True)
        with open(args.json, "w") as f:  # after every shape: a run cut short keeps what it measured
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                           records=records), f, indent=2)
    print(tabulate(rows, headers=["shape", "MxKxN", "variant", "bits vs F.linear", "", "ms", "/cuBLAS", "TFLOP/s",
                                  "gelu epilogue ms vs cuBLAS + eager gelu"]))


if __name__ == "__main__":
    main()
