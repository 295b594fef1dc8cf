"""Probe: does a Triton ``tl.dot`` GEMV give cuBLAS's bits for a linear of one row, and is it faster?

Why: the AdaLN modulation ``linear(silu(temb))`` reads a whole [6 D, D] weight to make one row. FLUX.1-dev runs
76 of them per forward (38 at [18432, 3072], non-split-K ``nvjet ... 192x8``, 34 µs each; 38 at [9216, 3072],
split-K plus ``splitKreduce_kernel``, ~22 µs), Qwen-Image 120 at [18432, 3072]: 2.1 ms and ~4 ms, at ~3.3 TB/s.
An HBM-bound kernel of the same bytes runs at ~4.1 TB/s.

Hypotheses, per shape (the kernels below):
* non-split-K: weights as the MMA's A operand, K in order through ``wgmma ... k16``, ``bf16(acc + bias)`` is
  cuBLAS's output bit for bit;
* split-K: cuBLAS cuts K into S parts (contiguous, or interleaved by its 64-wide K tiles), sums each in fp32 as
  above, then adds the partials (in split order, reversed, or as a tree) and the bias and rounds once. The
  partials come from the kernel; the reductions are tried in torch (fp32 adds, the same IEEE operations).

Writes $OUT/probe_gemv_exact.json and prints, per shape: cuBLAS's kernels, which hypothesis (if any) gives its
bits over several random draws, and the steady-state µs (CUDA graph, inputs cycled past the L2) of cuBLAS and of
each tile config of the kernel, with the HBM floor of the weight read at 4.1 TB/s.

    python benchmarks/probe_gemv_exact.py [--quick] [--shapes SUBSTRINGS]

Measured (results/h200-2026-12-01c/run3, run4): every hypothesis of the right split is exact (S = 1 where cuBLAS
runs a non-split kernel, S = 2 contiguous for FLUX's single-block shape, any reduction order: two partials), at
every tile config, batch 1 and 2. Not faster: 32.4 µs at best against cuBLAS's 31.2 at [18432, 3072], 20.6
against 20.0 at [9216, 3072]; 0.7-1.9 µs ahead only at the smaller shapes (FLUX norm_out, SD3.5). No family uses it.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from tabulate import tabulate

from diffusion_fuse.kernels.launch import EAGER_NUMERICS

try:
    from probe_gemm_exact import bits_equal, cublas_kernel_name
    from steady import input_sets, steady_us
except ImportError:  # imported as benchmarks.<module>
    from benchmarks.probe_gemm_exact import bits_equal, cublas_kernel_name
    from benchmarks.steady import input_sets, steady_us

HBM_TBS = 4.1
DEVICE = "cuda"
BLOCK_M = 16  # rows of x, padded: the smallest N of an sm_90 wgmma Triton issues


@triton.jit
def gemv_kernel(X, W, BIAS, OUT, PART, M, N, stride_xm, stride_om, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
                INTERPRETED: tl.constexpr = False):
    """Program (n, s): weight rows [n * BLOCK_N, +BLOCK_N) over the K part s; writes y (SPLIT == 1) or the
    fp32 partial [s, m, n] of PART."""
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    K_PART: tl.constexpr = K // SPLIT
    k0 = pid_s * K_PART
    w_ptrs = W + rn[:, None].to(tl.int64) * K + (k0 + rk)[None, :]
    x_ptrs = X + rm[None, :] * stride_xm + (k0 + rk)[:, None]
    x_mask = rm[None, :] < M
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for _ in range(0, K_PART, BLOCK_K):
        w = tl.load(w_ptrs, eviction_policy="evict_first")  # read once: keep L2 for the activations
        x = tl.load(x_ptrs, mask=x_mask, other=0.0)
        if INTERPRETED:  # Triton 3.6's interpreter multiplies bf16 tiles' raw bits: logic checks in fp32
            w, x = w.to(tl.float32), x.to(tl.float32)
        acc = tl.dot(w, x, acc)  # weights as A, as cuBLAS's kernel for a one-column result has them
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(BIAS + rn).to(tl.float32)[:, None]
        y = acc.to(OUT.dtype.element_ty, fp_downcast_rounding="rtne")
        tl.store(OUT + rm[None, :] * stride_om + rn[:, None], y, mask=x_mask)
    else:
        tl.store(PART + (pid_s * M + rm[None, :]) * N + rn[:, None], acc, mask=x_mask)


@triton.jit
def splitk_reduce_kernel(PART, BIAS, OUT, M, N, stride_om, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                         BLOCK: tl.constexpr):
    """y[m, n] = bf16(((p_0 + p_1) + ...) + float(b[n])): partials added in split order, one rounding."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    total = tl.load(PART + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT):
        total += tl.load(PART + s * M * N + offs, mask=mask, other=0.0)
    n = offs % N
    if HAS_BIAS:
        total += tl.load(BIAS + n, mask=mask, other=0.0).to(tl.float32)
    y = total.to(OUT.dtype.element_ty, fp_downcast_rounding="rtne")
    tl.store(OUT + (offs // N) * stride_om + n, y, mask=mask)


# (name, M, K, N)
SHAPES = [
    ("FLUX/Qwen-Image double-block modulation", 1, 3072, 18432),
    ("FLUX single-block modulation", 1, 3072, 9216),
    ("FLUX norm_out", 1, 3072, 6144),
    ("SD3.5-large block modulation", 1, 2432, 14592),
    ("FLUX double-block modulation, batch 2", 2, 3072, 18432),
]
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
# (BLOCK_N, BLOCK_K, stages, warps) timed for the non-split kernel
CONFIGS = [(64, 128, 6, 4), (32, 256, 4, 4), (16, 256, 4, 4), (16, 512, 4, 4), (16, 1024, 3, 4), (32, 512, 3, 4),
           (32, 512, 4, 4), (32, 1024, 2, 4), (64, 256, 4, 4), (64, 512, 2, 4), (16, 512, 6, 4), (32, 256, 6, 4),
           (16, 256, 8, 4), (32, 128, 8, 4), (16, 512, 4, 2), (32, 512, 3, 8)]


@triton.jit
def gemv_tma_kernel(X, w_desc, BIAS, OUT, M, N, stride_xm, stride_om, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr):
    """gemv_kernel (SPLIT 1) with the weight tiles loaded by TMA (one instruction a tile, no address math)."""
    n0 = tl.program_id(0) * BLOCK_N
    rn = n0 + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    x_ptrs = X + rm[None, :] * stride_xm + rk[:, None]
    x_mask = rm[None, :] < M
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        w = w_desc.load([n0, k])
        x = tl.load(x_ptrs, mask=x_mask, other=0.0)
        acc = tl.dot(w, x, acc)
        x_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(BIAS + rn).to(tl.float32)[:, None]
    tl.store(OUT + rm[None, :] * stride_om + rn[:, None], acc.to(OUT.dtype.element_ty), mask=x_mask)


def run_gemv_tma(x, w, b, cfg, out=None):
    from triton.tools.tensor_descriptor import TensorDescriptor

    bn, bk, stages, warps = cfg
    M, K = x.shape
    N = w.shape[0]
    out = torch.empty(M, N, device=x.device, dtype=x.dtype) if out is None else out
    desc = TensorDescriptor.from_tensor(w, [bn, bk])
    gemv_tma_kernel[(N // bn,)](x, desc, b, out, M, N, x.stride(0), out.stride(0), K=K, HAS_BIAS=True, BLOCK_N=bn,
                                BLOCK_K=bk, BLOCK_M=BLOCK_M, num_stages=stages, num_warps=warps, **EAGER_NUMERICS)
    return out


TMA_CONFIGS = [(64, 128, 6, 4), (32, 256, 4, 4), (16, 256, 6, 4), (32, 256, 6, 4), (64, 256, 4, 4), (16, 256, 8, 4),
               (128, 128, 4, 4), (32, 128, 8, 4)]


def run_gemv(x, w, b, split, cfg, part=None, out=None, interleave=False):
    """The kernel's output (SPLIT 1) or its fp32 partials [S, M, N] (SPLIT > 1)."""
    bn, bk, stages, warps = cfg
    M, K = x.shape
    N = w.shape[0]
    if interleave:  # split s takes K tiles s, s + S, ...: permute K so that they are contiguous
        tiles = torch.arange(K // 64, device=x.device).view(-1, split).t().reshape(-1)
        perm = (tiles[:, None] * 64 + torch.arange(64, device=x.device)).reshape(-1)
        x, w = x[:, perm].contiguous(), w[:, perm].contiguous()
    if split > 1 and part is None:
        part = torch.empty(split, M, N, device=x.device, dtype=torch.float32)
    if out is None:
        out = torch.empty(M, N, device=x.device, dtype=x.dtype)
    gemv_kernel[(N // bn, split)](x, w, b if b is not None else w, out, part if part is not None else out, M, N,
                                  x.stride(0), out.stride(0), K=K, HAS_BIAS=b is not None, SPLIT=split, BLOCK_N=bn,
                                  BLOCK_K=bk, BLOCK_M=BLOCK_M, INTERPRETED=DEVICE == "cpu", num_stages=stages,
                                  num_warps=warps, **EAGER_NUMERICS)
    return out if split == 1 else part


def reduce_torch(part, b, how):
    """Reduction hypotheses for the partials, in fp32 torch adds."""
    p = list(part)
    if how == "forward":
        t = p[0]
        for q in p[1:]:
            t = t + q
    elif how == "reverse":
        t = p[-1]
        for q in reversed(p[:-1]):
            t = t + q
    elif how == "zero-first":
        t = torch.zeros_like(p[0])
        for q in p:
            t = t + q
    else:  # pairwise tree
        while len(p) > 1:
            p = [p[i] + p[i + 1] if i + 1 < len(p) else p[i] for i in range(0, len(p), 2)]
        t = p[0]
    if b is not None:
        t = t + b.float()
    return t.to(torch.bfloat16)


def run_reduce(part, b, out, block=1024):
    S, M, N = part.shape
    splitk_reduce_kernel[(triton.cdiv(M * N, block),)](part, b if b is not None else part, out, M, N, out.stride(0),
                                                       HAS_BIAS=b is not None, SPLIT=S, BLOCK=block, num_warps=4,
                                                       **EAGER_NUMERICS)
    return out


def draw(M, K, N, seed):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = F.silu(torch.randn(M, K, device=DEVICE, generator=g) * 2).bfloat16()
    w = (torch.randn(N, K, device=DEVICE, generator=g) * 0.02).bfloat16()
    b = (torch.randn(N, device=DEVICE, generator=g) * 0.02).bfloat16()
    return x, w, b


def exactness(M, K, N, seeds):
    """Which (split, layout, reduce) hypotheses give F.linear's bits on every draw."""
    rows = []
    for split in SPLITS:
        if K % (split * 64):
            continue
        for interleave in ((False,) if split == 1 else (False, True)):
            hows = ("kernel",) if split == 1 else ("forward", "reverse", "zero-first", "tree", "kernel-reduce")
            ok = dict.fromkeys(hows, True)
            diffs = dict.fromkeys(hows, 0)
            for seed in seeds:
                x, w, b = draw(M, K, N, seed)
                ref = F.linear(x, w, b)
                res = run_gemv(x, w, b, split, (64, 64, 4, 4), interleave=interleave)
                for how in hows:
                    if how == "kernel":
                        got = res
                    elif how == "kernel-reduce":
                        got = run_reduce(res, b, torch.empty(M, N, device=DEVICE, dtype=torch.bfloat16))
                    else:
                        got = reduce_torch(res, b, how)
                    eq, nd = bits_equal(ref, got)
                    ok[how] &= eq
                    diffs[how] += nd
            for how in hows:
                rows.append({"split": split, "interleaved": interleave, "reduce": how, "exact": ok[how],
                             "differing": diffs[how]})
    return rows


def timing(M, K, N, exact_split, configs):
    x, w, b = draw(M, K, N, 0)
    nbytes = w.numel() * 2
    sets = input_sets((x, w, b), nbytes)
    res = {"cublas_us": steady_us([lambda s=s: F.linear(*s) for s in sets]), "floor_us": nbytes / HBM_TBS / 1e6}
    for cfg in configs:
        bn, bk, _, _ = cfg
        if N % bn or K % (exact_split * bk):
            continue
        key = "x".join(map(str, cfg))
        try:
            if exact_split == 1:
                calls = [lambda s=s: run_gemv(*s, 1, cfg) for s in sets]
            else:
                parts = [torch.empty(exact_split, M, N, device=DEVICE) for _ in sets]

                def call(s, p):
                    run_gemv(*s, exact_split, cfg, part=p)
                    return run_reduce(p, s[2], torch.empty(M, N, device=DEVICE, dtype=torch.bfloat16))

                calls = [lambda s=s, p=p: call(s, p) for s, p in zip(sets, parts)]
            got = calls[0]()
            eq, _ = bits_equal(F.linear(*sets[0]), got)
            res[key] = {"us": steady_us(calls), "exact": eq}
        except Exception as e:  # noqa: BLE001 - a config that does not build is reported, not fatal
            res[key] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    for cfg in TMA_CONFIGS if exact_split == 1 else ():
        key = "tma " + "x".join(map(str, cfg))
        if N % cfg[0] or K % cfg[1]:
            continue
        try:
            calls = [lambda s=s: run_gemv_tma(*s, cfg) for s in sets]
            eq, _ = bits_equal(F.linear(*sets[0]), calls[0]())
            res[key] = {"us": steady_us(calls), "exact": eq}
        except Exception as e:  # noqa: BLE001 - as above
            res[key] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="two shapes, two seeds, three configs")
    ap.add_argument("--shapes", default="", help="comma-separated substrings of the shape names to run")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "probe_gemv_exact.json"))
    args = ap.parse_args()
    shapes = SHAPES[:2] if args.quick else SHAPES
    seeds = (0, 1) if args.quick else (0, 1, 2, 3)
    configs = CONFIGS[:3] if args.quick else CONFIGS
    if args.shapes:
        shapes = [sh for sh in shapes if any(t in sh[0] for t in args.shapes.split(","))]
    results, table = [], []
    for name, M, K, N in shapes:
        x, w, b = draw(M, K, N, 0)
        kern = cublas_kernel_name(lambda: F.linear(x, w, b))
        ex = exactness(M, K, N, seeds)
        exact = [r for r in ex if r["exact"]]
        split = exact[0]["split"] if exact and not exact[0]["interleaved"] else None
        tm = timing(M, K, N, split, configs) if split is not None else {}
        results.append({"shape": name, "M": M, "K": K, "N": N, "cublas_kernels": kern, "exactness": ex, "timing": tm})
        best = min(((k, v["us"]) for k, v in tm.items() if isinstance(v, dict) and v.get("exact")),
                   key=lambda kv: kv[1], default=(None, None))
        table.append([name, f"{M}x{K} @ {N}x{K}", kern[:48], ", ".join(
            f"S{r['split']}{'i' if r['interleaved'] else ''}/{r['reduce']}" for r in exact) or "none",
            f"{tm['cublas_us']:.1f}" if tm else "-", f"{best[1]:.1f} ({best[0]})" if best[0] else "-",
            f"{tm['floor_us']:.1f}" if tm else "-"])
        print(json.dumps(results[-1], indent=1)[:4000], flush=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    print(tabulate(table, headers=["shape", "x @ w", "cuBLAS", "exact hypotheses", "cuBLAS µs", "gemv µs (cfg)",
                                   "floor µs"]))


if __name__ == "__main__":
    main()
