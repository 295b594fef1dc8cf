"""LN + modulate at real shapes: eager vs Inductor vs diffusion_fuse vs the HBM floor, in one run.

Workloads (issue #3): FLUX [1,4608,3072] bf16 (LN + modulate, and gated residual + LN + modulate); Wan2.1-14B [1,32760,5120] (FP32LayerNorm form,
fp32 [1,1,D] modulation, bf16 out); Wan2.2-5B [1,27280,3072] (per-token modulation: strided
slices of a [1,S,6,D] fp32 table). Two timings of each, in the same run:

- ``do_bench``: medians of ``triton.testing.do_bench`` (CUDA events, warm-up, L2 flushed before every call by a
  256 MB memset, whose dirty lines the timed kernel then writes back);
- steady: ``benchmarks/steady.py`` -- calls back to back in one CUDA graph, cycling through enough input copies
  that no input is in L2 when read, outputs kept (the way the large copy that gives the floor is timed).

The floor is the bytes that must move (inputs read once, output written once) over the device-to-device copy
bandwidth of a 1 GiB copy measured in the same run; "copy" is a copy of the kernel's bytes at its size, timed
both ways.

Each LN+modulate workload also times the kernel's launch variants (kernels/norm_modulate.py
``LAUNCH_CANDIDATES``: row groups, the one-exchange tree, register caps, cache hints) in the same run: rows
labelled ``  variant <name>``, bit-exactness checked against eager like the default row (their
eager/inductor ratios use that workload's eager and Inductor times). The gated workload times the
cache-hint candidates only (``plan_gated_residual_norm_modulate(cache_hints=...)``).

    python benchmarks/bench_norm.py [--json PATH] [--variants all|none|NAME,NAME]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from tabulate import tabulate
from triton.testing import do_bench

from diffusion_fuse.kernels.gated_residual_norm_modulate import plan_gated_residual_norm_modulate
from diffusion_fuse.kernels.norm_modulate import LAUNCH_CANDIDATES, LaunchVariant, plan_norm_modulate
from diffusion_fuse.lowering.gated_residual_norm_modulate import gated_residual_norm_modulate
from diffusion_fuse.lowering.norm_modulate import norm_modulate

try:
    from steady import input_sets, steady_copy_us, steady_sm_copy_us, steady_us
except ImportError:  # imported as benchmarks.bench_norm
    from benchmarks.steady import input_sets, steady_copy_us, steady_sm_copy_us, steady_us


def copy_bandwidth() -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")
    return 2 * n / (ms * 1e-3)


def copy_us(nbytes: int) -> float:
    """µs of one device copy moving ``nbytes`` (half read, half written) at this size: launch, ramp-up and tail
    included, what the fastest kernel of that traffic takes (next to the floor from the large copy's bandwidth)."""
    a = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median") * 1e3


def workloads():
    g = torch.Generator(device="cuda").manual_seed(0)

    def rn(*shape, dtype):
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    x = rn(1, 4608, 3072, dtype=torch.bfloat16)
    yield "FLUX LN+mod [1,4608,3072] bf16", (x, None, None, 1e-6, rn(1, 1, 3072, dtype=torch.bfloat16),
                                             rn(1, 1, 3072, dtype=torch.bfloat16), None, None)
    res, y = rn(1, 4608, 3072, dtype=torch.bfloat16), rn(1, 4608, 3072, dtype=torch.bfloat16)
    gate, sc, sh = (rn(1, 1, 3072, dtype=torch.bfloat16) for _ in range(3))
    yield "FLUX gated res+LN+mod [1,4608,3072] bf16", ("gated", (res, y, gate, None, None, 1e-6, sc, sh, None))
    x = rn(1, 32760, 5120, dtype=torch.bfloat16)
    yield "Wan2.1 LN+mod [1,32760,5120] f32 LN", (x, None, None, 1e-6, rn(1, 1, 5120, dtype=torch.float32),
                                                  rn(1, 1, 5120, dtype=torch.float32), torch.float32, torch.bfloat16)
    x = rn(1, 27280, 3072, dtype=torch.bfloat16)
    table = rn(1, 27280, 6, 3072, dtype=torch.float32)
    yield "Wan2.2 LN+mod per-token [1,27280,3072]", (x, None, None, 1e-6, table[:, :, 1], table[:, :, 0],
                                                     torch.float32, torch.bfloat16)


def floor_bytes(args, out) -> int:
    if args[0] == "gated":  # reads residual, x, gate, scale, shift; writes r and out
        res, x, gate, _w, _b, _eps, sc, sh, _ = args[1]
        n = 2 * res.numel() * res.element_size() + sum(o.numel() * o.element_size() for o in out)
        return n + sum(_distinct(t, x) * t.element_size() for t in (gate, sc, sh))
    x, _w, _b, _eps, sc, sh, *_ = args
    n = x.numel() * x.element_size() + out.numel() * out.element_size()
    for t in (sc, sh):
        if t is not None:
            n += _distinct(t, x) * t.element_size()
    return n


def _distinct(t, x) -> int:
    """Elements of ``t`` that must be read once when broadcast to ``x`` (broadcast dims count once)."""
    e = t.expand(x.shape)
    n = x.shape[-1]
    for d in range(x.dim() - 1):
        n *= e.shape[d] if e.stride(d) else 1
    return n


def _equal(a, b) -> bool:
    if isinstance(a, tuple):
        return all(_equal(x, y) for x, y in zip(a, b))
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "bench_norm.json"))
    ap.add_argument("--variants", default="all", help="launch variants timed per LN+modulate workload: all, none, "
                    f"or names from {sorted(k for k in LAUNCH_CANDIDATES if k != 'default')}")
    args_ = ap.parse_args()
    if args_.variants == "all":
        variants = [k for k in LAUNCH_CANDIDATES if k != "default"]
    else:
        variants = [] if args_.variants == "none" else args_.variants.split(",")
    unknown = [v for v in variants if v not in LAUNCH_CANDIDATES]
    if unknown:
        ap.error(f"unknown variants {unknown}")
    bw = copy_bandwidth()
    rows, steady_rows, records = [], [], []
    for name, spec in workloads():
        if spec[0] == "gated":
            args, reference, plan = spec[1], gated_residual_norm_modulate, plan_gated_residual_norm_modulate
            op_fn = torch.ops.diffusion_fuse.gated_residual_norm_modulate
        else:
            args, reference, plan, op_fn = spec, norm_modulate, plan_norm_modulate, \
                torch.ops.diffusion_fuse.norm_modulate
        eager = lambda: reference(*args)  # noqa: E731 - the ATen chain eager runs
        ind = torch.compile(reference)
        launch = plan(*args)  # the kernel alone: planned once, as the op caches it per layout
        ours = lambda: launch(*args)  # noqa: E731
        op = lambda: op_fn(*args)  # noqa: E731
        ref = eager()
        exact = _equal(ref, ours())
        ind_exact = _equal(ref, ind(*args))
        t = {k: do_bench(f, warmup=25, rep=200, return_mode="median") * 1e3
             for k, f in (("eager", eager), ("inductor", lambda: ind(*args)), ("ours", ours), ("ours_op", op))}
        fb = floor_bytes(spec, ref)
        floor_us = fb / bw * 1e6
        t["copy"] = copy_us(fb)
        sets = input_sets(args, fb)
        for k, f in (("eager", reference), ("inductor", ind), ("ours", launch)):
            t[f"{k}_steady"] = steady_us([lambda f=f, a=a: f(*a) for a in sets])
        t["copy_steady"] = steady_copy_us(fb)
        sm_copy = steady_sm_copy_us(fb)  # an SM copy kernel of the same bytes (the graph's copy_ is a memcpy node)
        t["sm_copy_steady"] = sm_copy["best"]
        rec = dict(workload=name, variant="default", **{f"{k}_us": v for k, v in t.items()}, floor_us=floor_us,
                   floor_bytes=fb, ours_over_floor=t["ours"] / floor_us, eager_over_ours=t["eager"] / t["ours"],
                   inductor_over_ours=t["inductor"] / t["ours"], bit_exact=exact, inductor_bit_exact=ind_exact,
                   ours_over_copy=t["ours"] / t["copy"], ours_steady_over_floor=t["ours_steady"] / floor_us,
                   ours_steady_over_copy=t["ours_steady"] / t["copy_steady"], input_sets=len(sets),
                   sm_copy_configs_us=sm_copy, ours_steady_over_sm_copy=t["ours_steady"] / t["sm_copy_steady"])
        records.append(rec)
        rows.append([name, f"{t['eager']:.1f}", f"{t['inductor']:.1f}", f"{t['ours']:.1f}", f"{t['ours_op']:.1f}",
                     f"{floor_us:.1f}", f"{rec['ours_over_floor']:.2f}", f"{t['copy']:.1f}",
                     f"{rec['ours_over_copy']:.2f}", f"{rec['eager_over_ours']:.2f}",
                     f"{rec['inductor_over_ours']:.2f}", exact, ind_exact])
        steady_rows.append([name, f"{t['eager_steady']:.1f}", f"{t['inductor_steady']:.1f}",
                            f"{t['ours_steady']:.1f}", f"{floor_us:.1f}", f"{rec['ours_steady_over_floor']:.2f}",
                            f"{t['copy_steady']:.1f}", f"{rec['ours_steady_over_copy']:.2f}",
                            f"{t['sm_copy_steady']:.1f}", f"{rec['ours_steady_over_sm_copy']:.2f}",
                            f"{t['eager_steady'] / t['ours_steady']:.2f}",
                            f"{t['inductor_steady'] / t['ours_steady']:.2f}", len(sets)])
        for vname in variants:
            lv = LAUNCH_CANDIDATES[vname]
            if spec[0] == "gated":  # the gated kernel's variants are the cache hints alone
                if lv != LaunchVariant(cache_hints=lv.cache_hints):
                    continue
                launch_v = plan(*args, cache_hints=lv.cache_hints)
            else:
                launch_v = plan(*args, launch_variant=lv)
            v_exact = _equal(ref, launch_v(*args))
            us = do_bench(lambda: launch_v(*args), warmup=25, rep=200, return_mode="median") * 1e3  # noqa: B023
            us_steady = steady_us([lambda a=a: launch_v(*a) for a in sets])  # noqa: B023
            records.append(dict(workload=name, variant=vname, variant_label=lv.label, ours_us=us, eager_us=t["eager"],
                                inductor_us=t["inductor"], floor_us=floor_us, floor_bytes=fb,
                                ours_over_floor=us / floor_us, eager_over_ours=t["eager"] / us,
                                inductor_over_ours=t["inductor"] / us, ours_over_default=us / t["ours"],
                                ours_steady_us=us_steady, ours_steady_over_floor=us_steady / floor_us,
                                bit_exact=v_exact))
            steady_rows.append([f"  variant {vname}", "", "", f"{us_steady:.1f}", f"{floor_us:.1f}",
                                f"{us_steady / floor_us:.2f}", "", f"{us_steady / t['copy_steady']:.2f}", "",
                                f"{us_steady / t['sm_copy_steady']:.2f}", "", "", ""])
            rows.append([f"  variant {vname} ({lv.label})", "", "", f"{us:.1f}", "", f"{floor_us:.1f}",
                         f"{us / floor_us:.2f}", "", f"{us / t['copy']:.2f}", f"{t['eager'] / us:.2f}",
                         f"{t['inductor'] / us:.2f}", v_exact, ""])
    big = steady_sm_copy_us(1 << 30)  # the SM copy's bandwidth where size no longer matters
    sm_bw = (1 << 30) / (big["best"] * 1e-6)
    with open(args_.json, "w") as f:
        json.dump({"copy_GBps": bw / 1e9, "sm_copy_1GiB_steady_GBps": sm_bw / 1e9, "sm_copy_1GiB_us": big, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "records": records}, f, indent=2)
    print(f"\ncopy bandwidth {bw / 1e9:.0f} GB/s ({torch.cuda.get_device_name()}, torch {torch.__version__})")
    print(tabulate(rows, headers=["workload", "eager us", "inductor us", "ours us", "ours (op) us", "floor us",
                                  "ours/floor", "copy of those bytes us", "ours/copy", "eager/ours", "inductor/ours",
                                  "bit-exact", "inductor exact"]))
    print("\nsteady state (benchmarks/steady.py: back to back in one CUDA graph, inputs not in L2, outputs kept; "
          f"SM copy kernel at 1 GiB: {sm_bw / 1e9:.0f} GB/s)")
    print(tabulate(steady_rows, headers=["workload", "eager us", "inductor us", "ours us", "floor us", "ours/floor",
                                         "copy of those bytes us", "ours/copy", "SM copy of those bytes us",
                                         "ours/SM copy", "eager/ours", "inductor/ours", "input sets"]))


if __name__ == "__main__":
    main()
