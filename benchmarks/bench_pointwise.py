"""The pointwise pass's fused kernels vs eager, per chain at real shapes, and the host cost of an op call.

For each chain of ``diffusion_fuse.testing.pointwise.CHAINS`` (FLUX-dev RoPE with and without
the txt/img cat, gated residual, gelu + cat, residual + split + cat, gelu + clone, FLUX.2 SwiGLU,
Wan's fp32 residual and RoPE, SANA's linear-attention casts and convolution epilogues, Qwen-Image's
complex RoPE): eager (the ATen ops one by one) and the fused graph (the chain rewritten by the
pointwise pass: one ``diffusion_fuse::pointwise`` call), both timed in the steady state
(``steady.steady_us``: back to back in a CUDA graph, inputs cycled out of the L2, no host time),
outputs compared bitwise; the HBM floor is the bytes a fused kernel must move (inputs read once,
outputs written once) over the copy bandwidth measured in the same run. The fused graph's
``triton.testing.do_bench`` time is kept beside it (``fused_do_bench_us``): it includes the host's
launch path wherever that is longer than do_bench's L2 clear.

Host cost: wall time per call of the fused graph and of eager on tiny inputs (launch-bound),
synchronized once per 1000 calls.

    python benchmarks/bench_pointwise.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton
from tabulate import tabulate

from diffusion_fuse.lowering import counters

try:
    from steady import input_sets, steady_us
except ImportError:  # imported as benchmarks.<module>
    from benchmarks.steady import input_sets, steady_us
from diffusion_fuse.testing.pointwise import CHAINS, chain, fuse, gated_residual, site_ops


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _flat(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def copy_bandwidth() -> float:
    x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x))
    return 2 * x.numel() / (ms * 1e-3)


def host_us_per_call(fn, args, n=1000) -> float:
    for _ in range(10):
        fn(*args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "bench_pointwise.json"))
    args = ap.parse_args()
    bw = copy_bandwidth()
    rows, records = [], []
    for name in CHAINS:
        fn, ins = chain(name)
        gm, sites = fuse(fn, *ins)
        counters.reset()
        ref, got = _flat(fn(*ins)), _flat(gm(*ins))
        exact = all(torch.equal(_bits(r), _bits(g)) for r, g in zip(ref, got))
        hits = counters.snapshot()["kernel"].get("pointwise", 0)
        moved = sum(t.numel() * t.element_size() for t in [*ins, *got] if isinstance(t, torch.Tensor))
        floor_us = moved / bw * 1e6
        sets = input_sets(ins, moved)
        eager_us = steady_us([lambda s=s: fn(*s) for s in sets])
        fused_us = steady_us([lambda s=s: gm(*s) for s in sets])
        do_bench_us = triton.testing.do_bench(lambda: gm(*ins)) * 1e3
        sets = None
        rec = {"chain": name, "site": ",".join(site_ops(sites[0])) if sites else None, "eager_us": eager_us,
               "fused_us": fused_us, "floor_us": floor_us, "fused_do_bench_us": do_bench_us, "exact": exact,
               "kernel_hits": hits}
        records.append(rec)
        rows.append([name, f"{eager_us:.1f}", f"{fused_us:.1f}", f"{floor_us:.1f}", f"{fused_us / floor_us:.2f}",
                     f"{eager_us / fused_us:.2f}", f"{do_bench_us:.1f}", exact, hits])
        ins = ref = got = None  # free before the next chain
        torch.cuda.empty_cache()
    # Host cost: a 2-op chain on tiny tensors, fused (one op call) vs eager (two ATen calls).
    fn = gated_residual
    small = tuple(torch.randn(*s, device="cuda").bfloat16() for s in ((1, 8, 64), (1, 64), (1, 8, 64)))
    gm, _ = fuse(fn, *small)
    host = {"eager_2_ops_us": host_us_per_call(fn, small), "fused_1_call_us": host_us_per_call(gm, small)}
    print(tabulate(rows, headers=["chain", "eager µs", "fused µs", "floor µs", "fused/floor", "eager/fused",
                                  "fused do_bench µs", "exact", "kernel hits"]))
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s; host per call on tiny inputs: eager mul+add "
          f"{host['eager_2_ops_us']:.1f} µs, fused {host['fused_1_call_us']:.1f} µs")
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_GBps": bw / 1e9,
                   "chains": records, "host": host}, f, indent=2)


if __name__ == "__main__":
    main()
