"""Probe: does a lossless forward make the host wait for the GPU, and where does the GPU wait for the host?

The FLUX-dev-sized stack (bench_e2e.flux_stack), compiled whole and per block (diffusers'
``compile_repeated_blocks``, as bench_models compiles FLUX.1-dev), in the lossless tier and with Inductor:

1. one forward under ``torch.cuda.set_sync_debug_mode("warn")``: every operation that synchronizes the host
   with the GPU warns; the distinct call sites are printed with their stacks;
2. N forwards issued back to back, profiled with CUDA activity only (no host-side instrumentation, which would
   slow the host and create gaps of its own), a marker kernel before each: per forward the host time, summed
   kernel time, span and idle time; the steady-state figures leave out the first forward (it starts with
   nothing queued). GPU-bound forwards issued back to back should leave no gap but the launch latency.

With ``--flux1``, FLUX.1-dev at full depth (bench_models' model and inputs), per block only.

    python benchmarks/probe_syncs.py [--json PATH]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import traceback
import warnings

import torch

import diffusion_fuse  # noqa: F401 - registers backend="diffusion_fuse"
from bench_e2e import flux_stack


def sync_sites(fn) -> list[str]:
    """The distinct stacks at which ``fn`` synchronizes (``set_sync_debug_mode("warn")`` warnings), with counts."""
    sites: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        stack = [f for f in traceback.extract_stack() if "warnings.py" not in f.filename][-12:]
        sites["".join(traceback.format_list(stack)) + f"  -> {message}"] += 1

    with warnings.catch_warnings():  # restores showwarning on exit
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return [f"{n}x\n{s}" for s, n in sites.most_common() if "prototype feature" not in s]


def b2b_profile(fn, calls: int) -> dict:
    """``calls`` forwards issued back to back, a marker kernel (``torch.cuda._sleep``) before each: per forward,
    the host time until it returned, its kernel time, its span and its idle time on the GPU (from its first
    kernel after the marker to the next marker)."""
    import time

    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    host = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            torch.cuda._sleep(1000)
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    ks = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    forwards, cur = [], None
    for e in ks:
        if "spin" in e.name or "sleep" in e.name.lower():
            cur = []
            forwards.append(cur)
        elif cur is not None:
            cur.append(e)
    per = []
    for f in forwards:
        gaps = sorted(((b.time_range.start - a.time_range.end, a.name[:50], b.name[:50]) for a, b in zip(f, f[1:])),
                      reverse=True)
        per.append({"kernels": len(f), "kernel_ms": sum(e.device_time for e in f) / 1e3,
                    "span_ms": (f[-1].time_range.end - f[0].time_range.start) / 1e3,
                    "idle_ms": sum(max(g, 0) for g, _, _ in gaps) / 1e3,
                    "gaps_over_20us": sum(g > 20 for g, _, _ in gaps),
                    "largest_gaps": [[round(g, 1), a, b] for g, a, b in gaps[:8]]})
    steady = per[1:] or per
    return {"host_ms": host, "forwards": per,
            "kernel_ms_per_forward": sum(p["kernel_ms"] for p in steady) / len(steady),
            "span_ms_per_forward": sum(p["span_ms"] for p in steady) / len(steady),
            "idle_ms_per_forward": sum(p["idle_ms"] for p in steady) / len(steady),
            "gaps_over_20us_per_forward": sum(p["gaps_over_20us"] for p in steady) / len(steady),
            "largest_gaps": sorted((g for p in steady for g in p["largest_gaps"]), reverse=True)[:12]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "probe_syncs.json"))
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--flux1", action="store_true", help="FLUX.1-dev at full depth, per block only")
    args = ap.parse_args()
    if args.flux1:
        import bench_models

        spec = bench_models.MODELS["flux1"]
        model = bench_models.build_real(spec, [])
        kw = spec.inputs(torch.Generator(device="cuda").manual_seed(0))
    else:
        model, kw = flux_stack()
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    out = {}
    with torch.no_grad():
        variants = {} if args.flux1 else {
            "lossless_whole": torch.compile(model, backend="diffusion_fuse"),
            "inductor_whole": torch.compile(model),
        }
        for name, fn in variants.items():
            fn(**kw)
            fn(**kw)
            torch.cuda.synchronize()
            out[name] = {"sync_sites": sync_sites(lambda fn=fn: fn(**kw)),
                         **b2b_profile(lambda fn=fn: fn(**kw), args.calls)}
        for name, backend in (("lossless_regional", "diffusion_fuse"), ("inductor_regional", "inductor")):
            torch._dynamo.reset()
            model.compile_repeated_blocks(backend=backend, dynamic=False)
            model(**kw)
            model(**kw)
            torch.cuda.synchronize()
            out[name] = {"sync_sites": sync_sites(lambda: model(**kw)), **b2b_profile(lambda: model(**kw), args.calls)}
            for m in model.modules():
                m._compiled_call_impl = None
    for name, r in out.items():
        print(f"== {name}: kernels {r['kernel_ms_per_forward']:.2f} ms, span {r['span_ms_per_forward']:.2f} ms, "
              f"idle {r['idle_ms_per_forward']:.2f} ms, gaps > 20 us {r['gaps_over_20us_per_forward']:.1f} per forward;"
              f" {len(r['sync_sites'])} synchronizing call sites")
        print("   host ms per forward:", [round(h, 2) for h in r["host_ms"]],
              "idle ms per forward:", [round(f["idle_ms"], 2) for f in r["forwards"]])
        for g in r["largest_gaps"][:6]:
            print("   gap", g)
        for s in r["sync_sites"][:4]:
            print(s)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
