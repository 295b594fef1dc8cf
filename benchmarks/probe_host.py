"""Where a CUDA-graph forward's host time goes, stage by stage (issue #9: FLUX.1-dev's ~4.5 ms before the GPU starts).

FLUX.1-dev's module tree at full depth (19 double + 38 single blocks, 1160 parameters) with narrow widths: the host's
work per call depends on the number of modules, parameters and graph nodes, not on their sizes, and the narrow model
compiles in seconds. Each compiled variant is called ``--reps`` times after warm-up; every call is stamped with
``time.perf_counter_ns`` at:

- ``call``: the user's call (``torch.compiler.cudagraph_mark_step_begin()`` just before it);
- ``ours``: entry to the backend's compiled callable (lossless: ``cudagraphs.CudaGraphedGraph.__call__``);
- ``replay``: entry to ``torch.cuda.CUDAGraph.replay`` (cudagraph trees, after its checks and input copies);
- ``replayed``: its return (cudaGraphLaunch of the whole graph);
- ``returned``: the user's call returning.

``dynamo-only`` is Dynamo's own cost: a backend whose compiled function returns the first call's outputs (guards,
frame entry, parameter gathering; no AOTAutograd). The table gives medians in ms; one more call per variant runs
under torch.profiler for the host start → first GPU activity time.

    python benchmarks/probe_host.py [--reps 30] [--variants dynamo-only,lossless-cudagraphs,inductor-cudagraphs]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings

import torch
from tabulate import tabulate

warnings.filterwarnings("ignore")

STAMPS: dict[str, int] = {}


def _stamp(name: str) -> None:
    STAMPS.setdefault(name, time.perf_counter_ns())


def _patch() -> None:
    """Stamp the stages (first entry per call only: a tree may replay more than one graph)."""
    from diffusion_fuse import cudagraphs

    orig_call = cudagraphs.CudaGraphedGraph.__call__

    def ours(self, args):
        _stamp("ours")
        return orig_call(self, args)

    cudagraphs.CudaGraphedGraph.__call__ = ours
    orig_replay = torch.cuda.CUDAGraph.replay

    def replay(self):
        _stamp("replay")
        out = orig_replay(self)
        STAMPS["replayed"] = time.perf_counter_ns()
        return out

    torch.cuda.CUDAGraph.replay = replay


DEV = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: a smoke run of the non-graph variants


def narrow_flux1():
    from diffusers import FluxTransformer2DModel

    with torch.device(DEV):
        m = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=19, num_single_layers=38,
                                   attention_head_dim=32, num_attention_heads=2, joint_attention_dim=64,
                                   pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=(8, 12, 12))
    m = m.eval().to(torch.bfloat16)
    S, T = 256, 64
    g = torch.Generator(device=DEV).manual_seed(0)
    kw = dict(hidden_states=torch.randn(1, S, 16, device=DEV, generator=g).bfloat16(),
              encoder_hidden_states=torch.randn(1, T, 64, device=DEV, generator=g).bfloat16(),
              pooled_projections=torch.randn(1, 32, device=DEV, generator=g).bfloat16(),
              timestep=torch.tensor([0.5], device=DEV).bfloat16(), img_ids=torch.zeros(S, 3, device=DEV),
              txt_ids=torch.zeros(T, 3, device=DEV), guidance=torch.tensor([3.5], device=DEV).bfloat16(),
              return_dict=False)
    return m, kw


def compiled(m, variant: str):
    import diffusion_fuse

    torch._dynamo.reset()
    if variant == "eager":
        return m
    if variant == "dynamo-only":
        def backend(gm, example_inputs):
            out = gm(*example_inputs)
            return lambda *args: out
        return torch.compile(m, backend=backend, dynamic=False)
    if variant == "inductor-cudagraphs":
        return torch.compile(m, backend="inductor", mode="reduce-overhead", dynamic=False)
    if variant == "lossless-cudagraphs":
        return torch.compile(m, backend="diffusion_fuse", mode="reduce-overhead", dynamic=False)
    if variant == "lossless":
        return torch.compile(m, backend="diffusion_fuse", dynamic=False)
    raise SystemExit(f"unknown variant {variant!r}; allowed: {', '.join(VARIANTS)}")


VARIANTS = ("eager", "dynamo-only", "lossless", "lossless-cudagraphs", "inductor-cudagraphs")


def _sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def first_gpu_ms(fn) -> float | None:
    """Host start of one call → the first GPU activity, under torch.profiler (ms)."""
    from torch.profiler import ProfilerActivity, profile

    if DEV != "cuda":
        return None
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with torch.profiler.record_function("probe_call"):
            fn()
        torch.cuda.synchronize()
    ev = prof.events()
    start = [e.time_range.start for e in ev if e.name == "probe_call" and e.device_type.name == "CPU"]
    gpu = [e.time_range.start for e in ev if e.device_type == torch.autograd.DeviceType.CUDA]
    return (min(gpu) - start[0]) / 1e3 if start and gpu else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--variants", default="eager,dynamo-only,lossless,lossless-cudagraphs,inductor-cudagraphs")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "probe_host.json"))
    args = ap.parse_args()
    _patch()
    m, kw = narrow_flux1()
    n_params = sum(1 for _ in m.parameters())
    rows, out = [], {"params": n_params, "variants": {}}
    for variant in args.variants.split(","):
        fn = compiled(m, variant)

        def call():
            torch.compiler.cudagraph_mark_step_begin()
            return fn(**kw)

        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(4):  # verification, warm-up, recording, first replay
                call()
            _sync()
            first_s = time.perf_counter() - t0
            per: dict[str, list[float]] = {}
            for _ in range(args.reps):
                STAMPS.clear()
                STAMPS["call"] = time.perf_counter_ns()
                call()
                STAMPS["returned"] = time.perf_counter_ns()
                _sync()
                STAMPS["synced"] = time.perf_counter_ns()
                order = [k for k in ("call", "ours", "replay", "replayed", "returned", "synced") if k in STAMPS]
                for a, b in zip(order, order[1:]):
                    per.setdefault(f"{a}→{b}", []).append((STAMPS[b] - STAMPS[a]) / 1e6)
            gpu_first = first_gpu_ms(call)
        med = {k: statistics.median(v) for k, v in per.items()}
        out["variants"][variant] = {"median_ms": med, "first_gpu_ms": gpu_first, "warmup_s": first_s}
        rows.append([variant, *(f"{med[k]:.3f}" if k in med else "" for k in
                                ("call→ours", "ours→replay", "call→replay", "replay→replayed",
                                 "replayed→returned", "call→returned", "returned→synced")),
                     f"{gpu_first:.3f}" if gpu_first is not None else "", f"{first_s:.1f}"])
        print(variant, {k: round(v, 3) for k, v in med.items()}, "first GPU", gpu_first, flush=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\nnarrow FLUX.1-dev tree ({n_params} parameters), host ms per call, medians of {args.reps}:")
    print(tabulate(rows, headers=["variant", "call→ours", "ours→replay", "call→replay", "replay (launch)",
                                  "replayed→returned", "call→returned", "returned→synced", "host→first GPU",
                                  "warm-up s"]))


if __name__ == "__main__":
    main()
