"""Depthwise convolutions at real shapes: eager vs Inductor vs diffusion_fuse vs the HBM floor, in one run.

Workloads: SANA-1.6B's GLUMBConv ``conv_depth`` (3 x 3, 11200 channels, 32 x 32 latents, batch 2, channels-last
as the 1 x 1 convolution before it leaves it, bias), the same at SANA's 2048² (64 x 64 latents, batch 1 and 2), and a
contiguous [2, 2560, 64, 64] one (ATen's own depthwise kernel). For each, the convolution alone and the GLUMBConv
tail ``x, gate = conv(h).chunk(2, 1); x * silu(gate)``: eager, Inductor (default mode), the lossless backend with
the family off (its default: cuDNN convolves, the pointwise pass adds the bias in the GLU's kernel) and on
(``options={"patterns": {"depthwise_conv": True}}``: the ``depthwise_conv`` op, with the GLU in the same kernel), and
the floor (input and output bytes over the copy bandwidth of a 1 GiB copy measured in the same run). Times are
``benchmarks/steady.py`` medians (calls back to back in one CUDA graph, inputs cycled out of L2); "exact": both
lossless variants bitwise against eager; "kernel ran": the family's op ran its kernel (not eager's convolution).

    python benchmarks/bench_depthwise_conv.py [--workloads A,B] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from tabulate import tabulate

import diffusion_fuse  # noqa: F401  (registers backend="diffusion_fuse")
from diffusion_fuse.lowering import counters

try:
    from steady import copy_bandwidth, input_sets, steady_us
except ImportError:  # imported as benchmarks.bench_depthwise_conv
    from benchmarks.steady import copy_bandwidth, input_sets, steady_us

WORKLOADS = {  # name: (batch, channels, height, width, channels_last)
    "sana_1600m_1024px": (2, 11200, 32, 32, True),
    "sana_1600m_2048px": (1, 11200, 64, 64, True),
    "sana_1600m_2048px_cfg": (2, 11200, 64, 64, True),  # guidance's batch of 2: the GLU's tiles index in int64
    "contiguous_2560": (2, 2560, 64, 64, False),
}


def conv(h, w, b):
    return torch.nn.functional.conv2d(h, w, b, padding=1, groups=h.shape[1])


def conv_glu(h, w, b):
    x, gate = torch.chunk(conv(h, w, b), 2, dim=1)
    return x * torch.nn.functional.silu(gate)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "bench_depthwise_conv.json"))
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, from {list(WORKLOADS)}")
    args = ap.parse_args()
    bw = copy_bandwidth()
    g = torch.Generator(device="cuda").manual_seed(0)
    rows, records = [], []
    for name in args.workloads.split(","):
        n, c, hh, ww, cl = WORKLOADS[name]
        h = torch.randn(n, c, hh, ww, device="cuda", generator=g).bfloat16()
        if cl:
            h = h.to(memory_format=torch.channels_last)
        w = (torch.randn(c, 1, 3, 3, device="cuda", generator=g) * 0.3).bfloat16()
        b = torch.randn(c, device="cuda", generator=g).bfloat16()
        for fn in (conv, conv_glu):
            torch._dynamo.reset()
            ours = torch.compile(fn, backend="diffusion_fuse", fullgraph=True,
                                 options={"patterns": {"depthwise_conv": True}})
            default = torch.compile(fn, backend="diffusion_fuse", fullgraph=True)
            inductor = torch.compile(fn, fullgraph=True)
            with torch.no_grad():
                want = fn(h, w, b)
                before = counters.snapshot()["kernel"].get("depthwise_conv", 0)
                ours(h, w, b)
                ran = counters.snapshot()["kernel"].get("depthwise_conv", 0) > before  # else the guard declined
                exact = all(torch.equal(want.view(torch.int16), got.view(torch.int16)) and want.stride() == got.stride()
                            for got in (ours(h, w, b), default(h, w, b)))
                moved = (h.numel() + w.numel() + b.numel() + want.numel()) * 2
                sets = input_sets((h, w, b), moved)
                t = {k: steady_us([lambda s=s, f=f: f(*s) for s in sets])
                     for k, f in (("eager", fn), ("inductor", inductor), ("off", default), ("ours", ours))}
            floor = moved / bw * 1e6
            records.append({"workload": name, "chain": fn.__name__, **{f"{k}_us": v for k, v in t.items()},
                            "floor_us": floor, "exact": exact, "kernel_ran": ran})
            rows.append([name, fn.__name__, f"{t['eager']:.1f}", f"{t['inductor']:.1f}", f"{t['off']:.1f}",
                         f"{t['ours']:.1f}", f"{floor:.1f}", f"{t['off'] / t['ours']:.2f}x",
                         f"{t['inductor'] / t['ours']:.2f}x", exact, ran])
            sets = None
        torch.cuda.empty_cache()
    print(tabulate(rows, headers=["workload", "chain", "eager µs", "Inductor µs", "lossless, family off µs",
                                  "lossless, family on µs", "floor µs", "on vs off", "on vs Inductor", "exact",
                                  "kernel ran"]))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; copy bandwidth {bw / 1e9:.0f} GB/s")
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_GBps": bw / 1e9,
                   "rows": records}, f, indent=2)


if __name__ == "__main__":
    main()
