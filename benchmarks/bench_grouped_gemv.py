"""A forward's modulation linears: cuBLAS one launch each (eager's and the lossless tier's without the family)
against ``diffusion_fuse::grouped_gemv`` (one launch), at FLUX.1-dev's and Qwen-Image's real shapes, steady state.

Per model: the µs of all its modulation linears (FLUX.1-dev: 38 x [18432, 3072] for the double blocks' image
and text norms, 38 x [9216, 3072] for the single blocks, [6144, 3072] for norm_out; Qwen-Image: 120 x [18432,
3072] and norm_out), whether the op gives cuBLAS's bits for every member, and the HBM floor (the weights' bytes
over the device copy bandwidth measured in the same run). The weights (6.5 and 13.6 GB) evict the L2 on their
own: one input set.

    python benchmarks/bench_grouped_gemv.py [--json PATH] [--models flux1,qwen_image]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from tabulate import tabulate

import diffusion_fuse  # noqa: F401  (registers the ops)
from diffusion_fuse.kernels import grouped_gemv as gg
from diffusion_fuse.lowering.grouped_gemv import grouped_gemv

try:
    from bench_rms_norm import copy_bandwidth
    from steady import steady_us
except ImportError:  # imported as benchmarks.bench_grouped_gemv
    from benchmarks.bench_rms_norm import copy_bandwidth
    from benchmarks.steady import steady_us

MODELS = {  # name: (K, member row counts in graph order)
    "flux1": (3072, [18432, 18432] * 19 + [9216] * 38 + [6144]),
    "qwen_image": (3072, [18432, 18432] * 60 + [6144]),
}


def operands(k, sizes, rows=1):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.nn.functional.silu(torch.randn(rows, k, device="cuda", generator=g) * 2).bfloat16()
    ws = [(torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16() for n in sizes]
    bs = [(torch.randn(n, device="cuda", generator=g) * 0.02).bfloat16() for n in sizes]
    return x, ws, bs


def time_model(name: str, bw: float) -> dict:
    k, sizes = MODELS[name]
    x, ws, bs = operands(k, sizes)
    nbytes = sum(w.numel() * 2 for w in ws)
    ref = grouped_gemv(x, ws, bs)
    op = torch.ops.diffusion_fuse.grouped_gemv
    return {"model": name, "members": len(ws), "weight_bytes": nbytes, "floor_us": nbytes / bw * 1e6,
            "forms": {str(n): gg.member_form(x.device, 1, n, k, x.dtype, True) for n in sorted(set(sizes))},
            "cublas_us": steady_us([lambda: [torch.addmm(b, x, w.t()) for w, b in zip(ws, bs)]], rounds=3),
            "op_us": steady_us([lambda: op(x, ws, bs)], rounds=3),
            "op_bit_exact": bool(torch.equal(op(x, ws, bs).view(torch.int16), ref.view(torch.int16)))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "bench_grouped_gemv.json"))
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    bw = copy_bandwidth()
    results, table = [], []
    for name in args.models.split(","):
        row = time_model(name, bw)  # the weights are freed when it returns
        torch.cuda.empty_cache()
        results.append(row)
        table.append([name, row["members"], f"{row['weight_bytes'] / 1e9:.2f}", f"{row['cublas_us']:.0f}",
                      f"{row['op_us']:.0f}", f"{row['floor_us']:.0f}", f"{row['op_us'] / row['floor_us']:.2f}",
                      "yes" if row["op_bit_exact"] else "NO"])
    with open(args.json, "w") as f:
        json.dump({"copy_bandwidth": bw, "rows": results}, f, indent=1)
    print(tabulate(table, headers=["modulation linears", "members", "GB", "cuBLAS µs", "grouped µs", "floor µs",
                                   "grouped / floor", "bit-exact"]))


if __name__ == "__main__":
    main()
