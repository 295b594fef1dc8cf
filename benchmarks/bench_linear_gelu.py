"""The ``linear_gelu`` family at FLUX.1-dev's shapes: the up-projection and its gelu (and the single block's cat)
as the lossless tier runs them without the family and with it, against eager, Inductor and cuBLAS's GEMM alone.

Workloads (bf16, random weights):

* ``img ff up``: ``gelu(F.linear(x, W, b), "tanh")``, x [1, 4096, 3072], W [12288, 3072] (double block, image);
* ``txt ff up``: the same with 512 rows (double block, text);
* ``single mlp + cat``: ``cat([attn, gelu(F.linear(x, W, b))], -1)``, x [1, 4608, 3072], attn [1, 4608, 3072]
  (single block: ``linear_gelu_cat``, the GEMM writing its columns of the cat buffer).

Each is ``torch.compile``d: lossless (cuBLAS GEMM, then the pointwise pass's lookup gelu [+ cat] kernel),
lossless with the family on (the Gluon GEMM with the gelu in its epilogue), Inductor (default mode), and run
eager. ``gemm alone`` is cuBLAS's ``F.linear`` with no activation: a fused op's lower bound. Times are
``benchmarks/steady.py``'s (calls back to back in one CUDA graph, medians of replays); every compiled output
is compared bitwise with eager's. The host column is µs per call of the family's op on a small shape, planned
(direct launch) against building the launch and going through Gluon's JIT on each call (``launch_gemm``).

    python benchmarks/bench_linear_gelu.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
from bench_pointwise import host_us_per_call
from steady import steady_us
from tabulate import tabulate

import diffusion_fuse
from diffusion_fuse.lowering import counters


class UpGelu(torch.nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.proj = torch.nn.Linear(k, n, dtype=torch.bfloat16, device="cuda")

    def forward(self, x):
        return F.gelu(self.proj(x), approximate="tanh")


class MlpCat(UpGelu):
    def forward(self, x, attn):
        return torch.cat([attn, F.gelu(self.proj(x), approximate="tanh")], dim=-1)


WORKLOADS = {  # name: (module, rows, K, N, with the attention piece)
    "img ff up": (UpGelu, 4096, 3072, 12288, False),
    "txt ff up": (UpGelu, 512, 3072, 12288, False),
    "single mlp + cat": (MlpCat, 4608, 3072, 12288, True),
}


def _bits(t):
    return t.view(torch.int16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "bench_linear_gelu.json"))
    args = ap.parse_args()
    torch.manual_seed(0)
    rows, records = [], []
    for name, (cls, m, k, n, with_attn) in WORKLOADS.items():
        torch._dynamo.reset()
        model = cls(k, n).eval()
        with torch.no_grad():
            model.proj.weight.mul_(k ** -0.5 / model.proj.weight.std())
        inputs = [torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16)]
        if with_attn:
            inputs.append(torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16))
        reports = {"lossless": diffusion_fuse.Report(), "lossless + linear_gelu": diffusion_fuse.Report()}
        variants = {
            "eager": model,
            "inductor": torch.compile(model),
            "lossless": torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, reports["lossless"])),
            "lossless + linear_gelu": torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(
                {"patterns": {"linear_gelu": True}}, reports["lossless + linear_gelu"])),
        }
        rec = {"workload": name, "M": m, "K": k, "N": n}
        with torch.no_grad():
            ref = model(*inputs)
            for v, fn in variants.items():
                counters.reset()
                out = fn(*inputs)
                rec[f"{v} exact"] = bool(torch.equal(_bits(out), _bits(ref)))
                rec[f"{v} kernels"] = dict(counters.snapshot()["kernel"])
                rec[f"{v} us"] = steady_us([lambda fn=fn: fn(*inputs)])
            w, b = model.proj.weight, model.proj.bias
            rec["gemm alone us"] = steady_us([lambda: F.linear(inputs[0], w, b)])
        for v, r in reports.items():
            rec[f"{v} sites"] = [f"{s.pattern}:{s.status}" for g in r.graphs for s in g.sites.values()]
        records.append(rec)
        rows.append([name, *(f"{rec[f'{v} us']:.1f}" + ("" if rec[f"{v} exact"] or v == "inductor" else " (differs)")
                             for v in variants), f"{rec['gemm alone us']:.1f}",
                     f"{rec['lossless + linear_gelu us'] / rec['lossless us']:.3f}",
                     f"{rec['lossless + linear_gelu us'] / rec['gemm alone us']:.3f}"])
        print(rec, flush=True)

    # host cost of one op call on a small shape: planned (direct launch) against Gluon's JIT every call
    from diffusion_fuse.kernels.linear_gelu import gelu_table, launch_gemm

    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(256, 1024, device="cuda", dtype=torch.bfloat16)
    lut = gelu_table("tanh", x.device)
    calls = {"op (planned, direct launch)": lambda: torch.ops.diffusion_fuse.linear_gelu(x, w, b),
             "launch built, Gluon JIT, each call": lambda: launch_gemm(x, w, b, out, lut),
             "F.linear + F.gelu": lambda: F.gelu(F.linear(x, w, b), approximate="tanh")}
    host = {k: host_us_per_call(fn, (), n=200) for k, fn in calls.items()}
    print(json.dumps(host))
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records,
                   "host_us": host}, f, indent=1)
    print(tabulate([[k, f"{v:.1f}"] for k, v in host.items()], headers=["host µs per call (256 x 1024 x 1024)", ""]))
    print(tabulate(rows, headers=["workload (µs, steady)", "eager", "inductor", "lossless", "lossless + lg",
                                  "gemm alone", "lg / lossless", "lg / gemm alone"]))


if __name__ == "__main__":
    main()
