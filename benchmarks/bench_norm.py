"""LN + modulate at real shapes: eager vs Inductor vs diffusion_fuse vs the HBM floor, in one run.

Workloads: FLUX [1,4608,3072] bf16 (LN + modulate, and gated residual + LN + modulate); Wan2.1-14B
[1,32760,5120] (FP32LayerNorm form, fp32 [1,1,D] modulation, bf16 out); Wan2.2-5B [1,27280,3072] (per-token
modulation: strided slices of a [1,S,6,D] fp32 table); SD3.5-large's image stream [1,4096,2432] bf16 (both
forms; a row that is no multiple of 512 elements). Two timings of each, in the same run:

- ``do_bench``: medians of ``triton.testing.do_bench`` (CUDA events, warm-up, L2 flushed before every call by a
  256 MB memset, whose dirty lines the timed kernel then writes back);
- steady: ``benchmarks/steady.py`` -- calls back to back in one CUDA graph, cycling through enough input copies
  that no input is in L2 when read, outputs kept (the way the large copy that gives the floor is timed).

The floor is the bytes that must move (inputs read once, output written once) over the device-to-device copy
bandwidth of a 1 GiB copy measured in the same run; "copy" is a copy of the kernel's bytes at its size, timed
both ways. "ours" is the kernel alone, planned once for the layout (``SPEC.plan``) as the op caches it;
"ours (op)" the ``torch.ops.diffusion_fuse`` call (guard, plan cache, kernel).

    python benchmarks/bench_norm.py [--json PATH] [--workloads TEXT]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from tabulate import tabulate
from triton.testing import do_bench

from diffusion_fuse.lowering import gated_residual_norm_modulate as gated_op
from diffusion_fuse.lowering import norm_modulate as norm_op

try:
    from steady import copy_bandwidth, input_sets, steady_copy_us, steady_sm_copy_us, steady_us
except ImportError:  # imported as benchmarks.bench_norm
    from benchmarks.steady import copy_bandwidth, input_sets, steady_copy_us, steady_sm_copy_us, steady_us


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

    def bf16_forms(model, S, D):
        # LN + modulate, and gated residual + LN + modulate, bf16 throughout, [1,1,D] modulation
        bf = torch.bfloat16
        x = rn(1, S, D, dtype=bf)
        yield f"{model} LN+mod [1,{S},{D}] bf16", (x, None, None, 1e-6, rn(1, 1, D, dtype=bf), rn(1, 1, D, dtype=bf),
                                                   None, None)
        res, y = rn(1, S, D, dtype=bf), rn(1, S, D, dtype=bf)
        gate, sc, sh = (rn(1, 1, D, dtype=bf) for _ in range(3))
        yield f"{model} gated res+LN+mod [1,{S},{D}] bf16", ("gated", (res, y, gate, None, None, 1e-6, sc, sh, None))

    yield from bf16_forms("FLUX", 4608, 3072)
    x = rn(1, 32760, 5120, dtype=torch.bfloat16)
    yield "Wan2.1 LN+mod [1,32760,5120] f32 LN", (x, None, None, 1e-6, rn(1, 1, 5120, dtype=torch.float32),
                                                  rn(1, 1, 5120, dtype=torch.float32), torch.float32, torch.bfloat16)
    x = rn(1, 27280, 3072, dtype=torch.bfloat16)
    table = rn(1, 27280, 6, 3072, dtype=torch.float32)
    yield "Wan2.2 LN+mod per-token [1,27280,3072]", (x, None, None, 1e-6, table[:, :, 1], table[:, :, 0],
                                                     torch.float32, torch.bfloat16)
    yield from bf16_forms("SD3.5-L", 4096, 2432)  # D % 512 != 0: each row's last trip is a partial one


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


def time_workload(spec) -> tuple[dict, int, list, bool, bool]:
    """(µs per timing, floor bytes, input sets, bit-exact, Inductor bit-exact) of one workload."""
    if spec[0] == "gated":
        args, reference, op_spec = spec[1], gated_op.gated_residual_norm_modulate, gated_op.SPEC
    else:
        args, reference, op_spec = spec, norm_op.norm_modulate, norm_op.SPEC
    op_fn = getattr(torch.ops.diffusion_fuse, op_spec.name)
    ind = torch.compile(reference)
    bound = op_spec.bind(args)
    launch = op_spec.plan(bound)  # the kernel alone: planned once, as the op caches it per layout

    def ours(*a):
        return launch(op_spec.bind(a) if a else bound)

    ref = reference(*args)  # the ATen chain eager runs
    exact, ind_exact = _equal(ref, ours()), _equal(ref, ind(*args))
    calls = {"eager": lambda: reference(*args), "inductor": lambda: ind(*args), "ours": lambda: launch(bound),
             "ours_op": lambda: op_fn(*args)}
    t = {k: do_bench(f, warmup=25, rep=200, return_mode="median") * 1e3 for k, f in calls.items()}
    fb = floor_bytes(spec, ref)
    t["copy"] = copy_us(fb)
    sets = input_sets(args, fb)
    for k, f in (("eager", reference), ("inductor", ind), ("ours", ours)):
        t[f"{k}_steady"] = steady_us([lambda f=f, a=a: f(*a) for a in sets])
    t["copy_steady"] = steady_copy_us(fb)
    sm_copy = steady_sm_copy_us(fb)  # an SM copy kernel of the same bytes (the graph's copy_ is a memcpy node)
    t["sm_copy_steady"], t["sm_copy_configs"] = sm_copy["best"], sm_copy
    return t, fb, sets, exact, ind_exact


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "bench_norm.json"))
    ap.add_argument("--workloads", default="", help="run only the workloads whose name contains this text")
    args_ = ap.parse_args()
    bw = copy_bandwidth()
    rows, steady_rows, records = [], [], []
    for name, spec in workloads():
        if args_.workloads not in name:
            continue
        t, fb, sets, exact, ind_exact = time_workload(spec)
        sm_copy = t.pop("sm_copy_configs")
        floor_us = fb / bw * 1e6
        rec = dict(workload=name, **{f"{k}_us": v for k, v in t.items()}, floor_us=floor_us,
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
    big = steady_sm_copy_us(1 << 30)  # the SM copy's bandwidth where size no longer matters
    sm_bw = (1 << 30) / (big["best"] * 1e-6)
    with open(args_.json, "w") as f:
        json.dump({"copy_GBps": bw / 1e9, "sm_copy_1GiB_steady_GBps": sm_bw / 1e9, "sm_copy_1GiB_us": big,
                   "device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records}, f, indent=2)
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
