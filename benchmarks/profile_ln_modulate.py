"""Where ln_modulate's time goes on the GPU: host overhead per call, and the kernel's two passes.

Host: microseconds of CPU per call (tiny input, so the GPU is idle) for the registered op,
a cached launch, plan + launch, and eager's ATen chain. Device: do_bench medians at FLUX
[1,4608,3072] bf16 for the whole kernel, the statistics pass alone, and the normalize +
modulate pass alone (given mean/rstd), against the HBM floor.

    python benchmarks/profile_ln_modulate.py
"""

from __future__ import annotations

import time

import torch
import triton
import triton.language as tl
from tabulate import tabulate
from triton.testing import do_bench

import diffusion_fuse  # noqa: F401  (registers the op)
from diffusion_fuse.kernels.layer_norm_stats import LANES, VEC, is_uniform, n_iters_for, welford_row_stats
from diffusion_fuse.kernels.launch import EAGER_NUMERICS
from diffusion_fuse.kernels.ln_modulate import plan_ln_modulate
from diffusion_fuse.lowering.norm_modulate import ln_modulate_reference


@triton.jit
def _stats_only(X, Mean, Rstd, N, eps, N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
                UNIFORM: tl.constexpr, SHUFFLE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    mean, rstd = welford_row_stats(X + row * N, N, 1, eps, N_ITERS, LANES, VEC, UNIFORM=UNIFORM, SHUFFLE=SHUFFLE)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)


@triton.jit
def _apply_only(X, Mean, Rstd, SC, SH, OUT, N, N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    mean = tl.load(Mean + row)
    rstd = tl.load(Rstd + row)
    lane = tl.arange(0, LANES)
    col = tl.arange(0, VEC)
    for it in range(N_ITERS):
        offs = (it * LANES + lane)[:, None] * VEC + col[None, :]
        mask = offs < N
        x = tl.load(X + row * N + offs, mask=mask, other=0.0).to(tl.float32)
        y = (rstd * (x - mean)).to(tl.bfloat16).to(tl.float32)
        t = (tl.load(SC + offs, mask=mask, other=0.0).to(tl.float32) + 1.0).to(tl.bfloat16).to(tl.float32)
        v = (y * t).to(tl.bfloat16).to(tl.float32)
        v = v + tl.load(SH + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(OUT + row * N + offs, v.to(tl.bfloat16), mask=mask)


def host_us(fn, n=2000) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / n * 1e6


def main() -> None:
    rows = []
    small = (torch.randn(1, 16, 64, device="cuda").bfloat16(), None, None, 1e-6,
             torch.randn(1, 1, 64, device="cuda").bfloat16(), torch.randn(1, 1, 64, device="cuda").bfloat16(),
             None, None)
    launch = plan_ln_modulate(*small)
    op = torch.ops.diffusion_fuse.ln_modulate.default
    for name, fn in (("registered op (guard cache + launch)", lambda: op(*small)),
                     ("cached launch", lambda: launch(*small)),
                     ("plan + launch", lambda: plan_ln_modulate(*small)(*small)),
                     ("eager ATen chain (4 ops)", lambda: ln_modulate_reference(*small))):
        rows.append(["host", name, f"{host_us(fn):.1f} us/call"])

    M, D = 4608, 3072
    x = torch.randn(1, M, D, device="cuda").bfloat16()
    sc, sh = torch.randn(1, 1, D, device="cuda").bfloat16(), torch.randn(1, 1, D, device="cuda").bfloat16()
    mean, rstd = torch.empty(M, device="cuda"), torch.empty(M, device="cuda")
    out = torch.empty_like(x)
    it = n_iters_for(D)
    big = (x, None, None, 1e-6, sc, sh, None, None)
    full = plan_ln_modulate(*big)
    t_full = do_bench(lambda: full(*big), return_mode="median") * 1e3
    per_program = {}
    for r in (1, 2, 4, 8):  # rows per program (prefetching the next row); 1 is one program per row
        launch_r = plan_ln_modulate(*big, rows_per_program=r)
        per_program[r] = do_bench(lambda: launch_r(*big), return_mode="median") * 1e3
    def stats(shuffle: bool) -> float:
        return do_bench(lambda: _stats_only[(M,)](x, mean, rstd, D, 1e-6, N_ITERS=it, LANES=LANES, VEC=VEC,
                                                  UNIFORM=is_uniform(D, it), SHUFFLE=shuffle, num_warps=4,
                                                  **EAGER_NUMERICS), return_mode="median") * 1e3

    t_stats, t_stats_smem = stats(True), stats(False)
    t_apply = do_bench(lambda: _apply_only[(M,)](x, mean, rstd, sc, sh, out, D, N_ITERS=it, LANES=LANES, VEC=VEC,
                                                 num_warps=4, **EAGER_NUMERICS), return_mode="median") * 1e3
    floor_read = x.numel() * 2 / 4.2e12 * 1e6
    rows += [["device", "full kernel [1,4608,3072]", f"{t_full:.1f} us"],
             *[["device", f"full kernel, {r} row(s) per program", f"{t:.1f} us"] for r, t in per_program.items()],
             ["device", "statistics pass only (reads x)", f"{t_stats:.1f} us (read floor {floor_read:.1f})"],
             ["device", "statistics pass, shared-memory tree instead of shuffles", f"{t_stats_smem:.1f} us"],
             ["device", "normalize+modulate pass only (reads x, writes out)", f"{t_apply:.1f} us (floor "
                                                                                f"{2 * floor_read:.1f})"]]
    print(tabulate(rows, headers=["where", "what", "time"]))


if __name__ == "__main__":
    main()
