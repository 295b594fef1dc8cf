"""Probe: 16-bit unary ops through eager's own output table (``kernels/lut16.py``) on the GPU.

1. For each op (gelu-tanh, gelu-erf, silu, sigmoid, tanh, exp) and dtype (bf16, fp16): build the table from
   eager's op on this GPU, run the table kernel on all 65,536 patterns, count the patterns that differ
   from eager (must be 0) -- or say why no table fits.
2. Steady-state time (``benchmarks/steady.py``) of gelu-tanh at FLUX's FF shape [4096, 12288] bf16: eager's
   kernel, the pointwise pass's fused kernel (``gelu + clone``, libdevice ``tanhf``), the table kernel at a
   few block sizes, and an SM copy of the same bytes; each output compared bitwise with eager.

3. FLUX's gelu chains (single block ``gelu + cat``, FF ``gelu + clone``) through the pass's generated kernel: the
   default (the cat walked in row tiles with the lookup), ``Variants(row_tiles=False)`` (the cat's 1024-element
   programs, recipe) and the lookup off (``Variants.lut16``), twice each, interleaved.

    python benchmarks/probe_lut16.py [--json PATH] [--chains-only]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
from tabulate import tabulate

from diffusion_fuse.kernels.lut16 import all_patterns, build_lut16, lut16_triton
from diffusion_fuse.testing.pointwise import LUT16_UNARY, chain, fuse

try:
    from steady import input_sets, steady_sm_copy_us, steady_us
except ImportError:  # imported as benchmarks.probe_lut16
    from benchmarks.steady import input_sets, steady_sm_copy_us, steady_us

OPS = LUT16_UNARY
BLOCKS = ((2048, 4), (4096, 8), (8192, 8), (8192, 16))


def bits(t):
    return t.view(torch.int16)


def exhaustive() -> list[dict]:
    recs = []
    for name, op in OPS.items():
        for dtype in (torch.bfloat16, torch.float16):
            lut, why = build_lut16(op, dtype, "cuda")
            rec = {"op": name, "dtype": str(dtype).removeprefix("torch."), "table": None, "differ": None, "why": why}
            if lut is not None:
                x = all_patterns(dtype, "cuda")
                rec["table"] = lut.describe()
                rec["table_entries"] = lut.table.numel()
                rec["differ"] = int((bits(lut16_triton(x, lut)) != bits(op(x))).sum())
            recs.append(rec)
    return recs


def timing() -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, 12288, device="cuda", generator=g).bfloat16()
    ref = F.gelu(x, approximate="tanh")
    moved = 2 * x.numel() * x.element_size()
    sets = input_sets((x,), moved)
    lut, why = build_lut16(OPS["gelu_tanh"], torch.bfloat16, "cuda")
    assert lut is not None, why
    fn, _ = chain("flux_gelu_clone")  # the pass's chain at [1, 4096, 12288]
    gm, sites = fuse(fn, x.view(1, 4096, 12288))
    rows = []

    def add(label, call):
        out = call(x)
        exact = bool(torch.equal(bits(out.reshape(ref.shape)), bits(ref)))
        us = steady_us([lambda a=a: call(a) for (a,) in sets])
        rows.append({"variant": label, "us": us, "exact": exact})

    add("eager F.gelu(tanh)", lambda a: F.gelu(a, approximate="tanh"))
    add(f"pointwise pass: gelu + clone ({len(sites)} site)", lambda a: gm(a.view(1, 4096, 12288)))
    for block, warps in BLOCKS:
        add(f"lut16 {block} elements / {warps} warps", lambda a, b=block, w=warps: lut16_triton(a, lut, b, w))
    copy = steady_sm_copy_us(moved)
    for r in rows:
        r["over_sm_copy"] = r["us"] / copy["best"]
    rows.append({"variant": "SM copy of the same bytes (best config)", "us": copy["best"], "exact": None,
                 "over_sm_copy": 1.0, "configs": copy})
    return rows


def chains() -> list[dict]:
    """FLUX's gelu chains through the pointwise pass's kernel, the table lookup on and off (``Variants.lut16``):
    the single block's ``gelu + cat`` (the lookup's larger programs straddle the cat's inputs, so lanes select;
    without it each program branches once) and the FF's ``gelu + clone``."""
    from diffusion_fuse.kernels.launch import EAGER_NUMERICS
    from diffusion_fuse.kernels.pointwise_codegen import load_kernel
    from diffusion_fuse.kernels.pointwise_ops import Variants
    from diffusion_fuse.lowering.pointwise import generate_source
    from diffusion_fuse.testing.pointwise import program_of

    def launcher(key, ins, v):
        # generated once, outside the timing graph's capture (a table is not built during a capture)
        src = generate_source(list(ins), key, v)
        kernel = load_kernel(src)

        def call(a):
            outs = [torch.empty_strided(o.shape, o.stride, dtype=o.dtype, device="cuda") for o in src.outputs]
            kernel[src.grid](*a, *outs, src.numel, *src.tables, **src.constexprs, num_warps=src.num_warps,
                             **EAGER_NUMERICS)
            return outs

        return call, src

    rows = []
    for name in ("flux_gelu_cat", "flux_gelu_clone"):
        fn, ins = chain(name)
        ref = fn(*ins)
        key = program_of(fn, *ins)
        moved = sum(t.numel() * t.element_size() for t in (*ins, ref))
        sets = input_sets(ins, moved)
        # twice each, interleaved: the default, the cat's 1024-element recipe programs instead of row tiles, no table
        for v in (Variants(), Variants(row_tiles=False), Variants(lut16=False)) * 2:
            call, src = launcher(key, ins, v)
            out = call(ins)[0]
            us = steady_us([lambda a=a: call(a) for a in sets])
            rows.append({"chain": name, "lut16": v.lut16, "row_tiles": "CAT_ROWS" in src.constexprs,
                         "tables": len(src.tables), "block": src.constexprs.get("BLOCK"), "warps": src.num_warps,
                         "branches": src.source.count("if c0"), "us": us,
                         "exact": bool(torch.equal(bits(out), bits(ref)))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "probe_lut16.json"))
    ap.add_argument("--chains-only", action="store_true", help="only the chains' lookup on/off timing")
    args = ap.parse_args()
    if args.chains_only:
        ch = chains()
        print(tabulate([[r["chain"], r["lut16"], r["row_tiles"], r["tables"], r["block"], r["warps"], r["branches"], f"{r['us']:.1f}",
                         r["exact"]] for r in ch],
                       headers=["chain", "lut16", "row tiles", "tables", "BLOCK", "warps", "cat branches", "steady µs", "== eager"]))
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "chains": ch}, f, indent=2)
        return
    ex = exhaustive()
    print(tabulate([[r["op"], r["dtype"], r["table"] or r["why"], r["differ"]] for r in ex],
                   headers=["op", "dtype", "table", "patterns differing from eager"]))
    tm = timing()
    print(tabulate([[r["variant"], f"{r['us']:.1f}", f"{r['over_sm_copy']:.2f}", r["exact"]] for r in tm],
                   headers=["gelu-tanh [4096, 12288] bf16", "steady µs", "/ SM copy", "== eager"]))
    ch = chains()
    print(tabulate([[r["chain"], r["lut16"], r["row_tiles"], r["tables"], r["block"], r["warps"], r["branches"], f"{r['us']:.1f}",
                     r["exact"]] for r in ch],
                   headers=["chain", "lut16", "row tiles", "tables", "BLOCK", "warps", "cat branches", "steady µs", "== eager"]))
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "exhaustive": ex,
                   "timing": tm, "chains": ch}, f, indent=2)


if __name__ == "__main__":
    main()
