"""Probe: how the pointwise kernels' launch shape changes their time at FLUX-dev shapes (steady state).

For FLUX's FF gelu ([4096, 12288] bf16), the single block's gelu + cat ([4608, 3072 + 12288]) and the gated
residual ([4608, 3072]): the generated kernel with ``BLOCK`` elements per program (1024, 2048, 4096) and 4 or 8
warps, and for gelu + cat with and without the per-program branch (``Generator._uniform_cat``), each checked
bitwise against eager and timed with ``benchmarks/steady.py`` next to eager and the HBM floor (bytes over the
copy bandwidth ``bench_pointwise.copy_bandwidth`` measures, as everywhere in BENCHMARKS.md).

    python benchmarks/probe_pointwise_block.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from tabulate import tabulate

from diffusion_fuse.kernels import pointwise_codegen as pc
from diffusion_fuse.kernels.launch import CachedLaunch
from diffusion_fuse.lowering.pointwise import generate_source
from bench_pointwise import copy_bandwidth
from diffusion_fuse.testing import pointwise as pw
from steady import input_sets, steady_us


def cases():
    bf = torch.bfloat16
    r = lambda *s: torch.randn(*s, device="cuda", dtype=bf)  # noqa: E731
    return {
        "FF gelu [4096,12288]": (lambda x: torch.nn.functional.gelu(x, approximate="tanh"), (r(1, 4096, 12288),)),
        "gelu + cat [4608,15360]": (pw.gelu_cat, (r(1, 4608, 3072), r(1, 4608, 12288))),
        "gated residual [4608,3072]": (pw.gated_residual, (r(1, 4608, 3072), r(1, 3072), r(1, 4608, 3072))),
    }


def build(fn, args, block, warps, branch=True):
    saved_block, saved_uniform = pc.BLOCK, pc.Generator._uniform_cat
    pc.BLOCK = block
    if not branch:
        pc.Generator._uniform_cat = lambda self, o, idx: None
    try:
        src = generate_source(list(args), pw.program_of(fn, *args))
    finally:
        pc.BLOCK, pc.Generator._uniform_cat = saved_block, saved_uniform
    kernel = CachedLaunch(pc.load_kernel(src), src.grid, src.constexprs, num_warps=warps)

    def call(*ins):
        outs = [torch.empty_strided(o.shape, o.stride, dtype=o.dtype, device="cuda") for o in src.outputs]
        kernel(*ins, *outs, src.numel)
        return outs[0]

    return call, src


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "probe_pointwise_block.json"))
    args_ = ap.parse_args()
    rows, recs = [], []
    bw = copy_bandwidth()
    for name, (fn, args) in cases().items():
        ref = fn(*args)
        nbytes = sum(a.numel() * a.element_size() for a in args) + ref.numel() * ref.element_size()
        sets = input_sets(args, nbytes)
        eager_us = steady_us([lambda s=s: fn(*s) for s in sets])
        floor_us = nbytes / bw * 1e6
        variants = [(b, w, True) for b in (1024, 2048, 4096) for w in (4, 8)]
        if name.startswith("gelu + cat"):
            variants.append((1024, 4, False))
        for block, warps, branch in variants:
            call, src = build(fn, args, block, warps, branch)
            got = call(*args)
            equal = bool(torch.equal(ref.view(torch.int16), got.view(torch.int16)))
            us = steady_us([lambda s=s: call(*s) for s in sets])
            label = f"BLOCK {block}, {warps} warps" + ("" if branch else ", no per-program branch")
            branched = "c0 = " in src.source
            rows.append([name, label, branched, f"{eager_us:.1f}", f"{us:.1f}", f"{floor_us:.1f}",
                         f"{us / floor_us:.2f}", equal])
            recs.append({"chain": name, "block": block, "warps": warps, "branch_allowed": branch,
                         "branched": branched, "eager_us": eager_us, "us": us, "floor_us": floor_us,
                         "equal": equal, "kernel": src.name})
            print(rows[-1], flush=True)
    print(tabulate(rows, headers=["chain", "launch", "branched", "eager us", "ours us", "floor us", "ours/floor",
                                  "== eager"]))
    with open(args_.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": recs}, f, indent=1)


if __name__ == "__main__":
    main()
