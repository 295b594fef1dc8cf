"""Context parallelism on several GPUs: eager CP vs Inductor CP vs diffusion_fuse lossless CP, and one GPU.

    torchrun --nproc-per-node 2 benchmarks/bench_context_parallel.py [--models flux1_2048,wan21_14b_720p]
        [--ulysses 2 | --ring 2 --attention-backend _native_flash] [--variants eager,inductor,lossless]
        [--reps 4] [--whole] [--no-single] [--json PATH]

Each rank builds the same model (bench_models.py's official configs, random bf16 weights from one seed) and the same
inputs, runs it eagerly on its own GPU first (the one-GPU time and output; ``--no-single`` skips it), then enables
diffusers' context parallelism (``enable_parallelism(config=ContextParallelConfig(...))``, the model's ``_cp_plan``)
and runs each variant: ``eager``, ``inductor`` (default mode), ``lossless`` (``backend="diffusion_fuse"``),
``lossless-cudagraphs`` (its ``mode="reduce-overhead"``), each compiled with diffusers' ``compile_repeated_blocks``
(``--whole``: the whole transformer, one graph). Timing: one warm-up call, then ABBA rounds of one forward each
between CUDA events after a barrier; a forward's time is the slowest rank's; medians. Exactness, on every rank:
each compiled variant's first and last outputs against eager CP, bitwise; eager CP against one-GPU eager (bitwise,
else the relative L2 error). Rank 0 prints a table and writes JSON (default ``$OUT/bench_context_parallel.json``).

    torchrun --nproc-per-node 2 benchmarks/bench_context_parallel.py --tiny    # the code path on the CPU (gloo)

``--tiny`` runs the same steps on the tiny models of the same classes (diffusion_fuse/testing/tiny_models.py) on the
CPU, timed with ``perf_counter``: what it checks is the code path and the exactness, not speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_models  # noqa: E402
from bench_models import MODELS, abba, activate, bits, build_real, compile_blocks, compile_kwargs, rel_l2  # noqa: E402


def _flux1_2048_inputs(gen: torch.Generator) -> dict:
    # 2048²: 256x256 latents, 2x2-packed -> 128x128 = 16,384 tokens of 64 channels; 512 T5 tokens.
    d, rnd = gen.device, bench_models._randn
    ids = torch.zeros(128, 128, 3, device=d)
    ids[..., 1] = torch.arange(128, device=d)[:, None]
    ids[..., 2] = torch.arange(128, device=d)[None, :]
    return dict(hidden_states=rnd(gen, 1, 16384, 64), encoder_hidden_states=rnd(gen, 1, 512, 4096),
                pooled_projections=rnd(gen, 1, 768), timestep=torch.tensor([0.5], device=d).bfloat16(),
                img_ids=ids.reshape(-1, 3), txt_ids=torch.zeros(512, 3, device=d),
                guidance=torch.tensor([3.5], device=d).bfloat16(), return_dict=False)


def _wan21_720p_inputs(gen: torch.Generator) -> dict:
    # 1280x720, 81 frames through the 8x VAE: 21 x 90 x 160 latents of 16 channels -> 75,600 tokens; 512 UMT5 tokens.
    d, rnd = gen.device, bench_models._randn
    return dict(hidden_states=rnd(gen, 1, 16, 21, 90, 160), timestep=torch.tensor([500], device=d),
                encoder_hidden_states=rnd(gen, 1, 512, 4096), return_dict=False)


# name -> (bench_models spec, inputs, shape)
WORKLOADS = {
    "flux1_2048": ("flux1", _flux1_2048_inputs, "2048², 16,384 image + 512 text tokens"),
    "wan21_14b_720p": ("wan21_14b", _wan21_720p_inputs, "720p/81f, 75,600 tokens"),
}
VARIANTS = ("eager", "inductor", "lossless", "lossless-cudagraphs")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def slowest_ms(fn, rank_ms: list[float]) -> Any:
    """``fn()`` between CUDA events after a barrier; appends the slowest rank's milliseconds to ``rank_ms``."""
    dist.barrier()
    if DEVICE == "cpu":
        t0 = time.perf_counter()
        out = fn()
        t = torch.tensor([(time.perf_counter() - t0) * 1e3])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        rank_ms.append(float(t))
        return out
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    out = fn()
    b.record()
    torch.cuda.synchronize()
    t = torch.tensor([a.elapsed_time(b)], device=DEVICE)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    rank_ms.append(float(t))
    return out


def all_ranks(flag: bool) -> bool:
    t = torch.tensor([int(flag)], device=DEVICE)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t)


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def run_workload(name: str, args: argparse.Namespace) -> dict:
    import diffusion_fuse
    from diffusion_fuse.testing.context_parallel import enable_context_parallel

    spec_name, make_inputs, shape = WORKLOADS[name]
    spec = MODELS[spec_name]
    notes: list[str] = []
    if args.tiny:
        from diffusion_fuse.testing.tiny_models import build

        model, kwargs = build(spec.tiny, torch.bfloat16, DEVICE)
        shape = f"tiny {spec.tiny}"
    else:
        torch.manual_seed(0)
        model = build_real(spec, notes)
        kwargs = make_inputs(torch.Generator(DEVICE).manual_seed(1))
    rec: dict[str, Any] = {"model": spec.label, "workload": name, "shape": shape, "notes": notes,
                           "ulysses": args.ulysses, "ring": args.ring, "world": dist.get_world_size(),
                           "compile": "whole" if args.whole else "repeated blocks", "device": DEVICE,
                           "variants": {v: {} for v in args.variants}}
    if args.attention_backend:
        model.set_attention_backend(args.attention_backend)
    with torch.no_grad():
        single = None
        if not args.no_single:
            single = model(**kwargs)[0]
            ms: list[float] = []
            for _ in range(max(1, args.reps // 2)):
                single = slowest_ms(lambda: model(**kwargs)[0], ms)
            rec["one_gpu_ms"] = statistics.median(ms)
        enable_context_parallel(model, ulysses_degree=args.ulysses, ring_degree=args.ring)
        eager = model(**kwargs)[0]
        if single is not None:
            rec["cp_equals_one_gpu"] = all_ranks(equal(single, eager))
            rec["cp_vs_one_gpu_rel_l2"] = rel_l2(single, eager)
            del single
        blocks = [m for m in model.modules() if m.__class__.__name__ in (model._repeated_blocks or ())]
        impls: dict[str, Any] = {}
        for v in args.variants:
            if v == "eager":
                impls[v] = None
                continue
            report = diffusion_fuse.Report()
            ck = compile_kwargs(v, report)
            t0 = time.perf_counter()
            if args.whole:
                impls[v] = torch.compile(model, **ck)
            else:
                activate(blocks, None)
                impls[v] = compile_blocks(model, ck)
                activate(blocks, impls[v])
            fwd = impls[v] if args.whole else model
            first = fwd(**kwargs)[0]
            first_s = time.perf_counter() - t0
            rec["variants"][v].update(first_call_s=first_s, first_equal_eager_cp=all_ranks(equal(eager, first)),
                                      sites=len(report.sites()), kept=report.count(status="kept"))
            del first
            if not args.whole:
                activate(blocks, None)

        def forward(v: str) -> torch.Tensor:
            if args.whole:
                return (impls[v] or model)(**kwargs)[0]
            activate(blocks, impls[v])
            return model(**kwargs)[0]

        times: dict[str, list[float]] = {v: [] for v in args.variants}
        last: dict[str, torch.Tensor] = {}
        for v in args.variants:
            forward(v)  # warm-up (CUDA graphs: the recording)
        for _, v in abba(list(args.variants), args.reps):
            last[v] = slowest_ms(lambda v=v: forward(v), times[v]).clone()
        activate(blocks, None)
    for v in args.variants:
        r = rec["variants"][v]
        r["ms"] = statistics.median(times[v])
        r["last_equal_eager_cp"] = all_ranks(equal(eager, last[v]))
        if "one_gpu_ms" in rec:
            r["speedup_over_one_gpu"] = rec["one_gpu_ms"] / r["ms"]
    base = rec["variants"].get("eager", {}).get("ms")
    for v in args.variants:
        if base:
            rec["variants"][v]["speedup_over_eager_cp"] = base / rec["variants"][v]["ms"]
    return rec


def print_table(rec: dict) -> None:
    head = (f"\n{rec['model']} {rec['shape']}: {rec['world']} ranks ({rec['device']}), Ulysses {rec['ulysses']}, "
            f"ring {rec['ring']}, {rec['compile']}")
    if "one_gpu_ms" in rec:
        head += (f"; one rank alone, eager {rec['one_gpu_ms']:.1f} ms, CP eager bitwise equal to it: "
                 f"{rec['cp_equals_one_gpu']} (rel L2 {rec['cp_vs_one_gpu_rel_l2']:.2e})")
    print(head)
    print(f"{'variant':<22}{'ms':>10}{'vs eager CP':>13}{'vs 1 GPU':>10}{'first s':>9}  bitwise = eager CP  sites")
    for v, r in rec["variants"].items():
        exact = f"{r.get('first_equal_eager_cp', True)}/{r['last_equal_eager_cp']}"
        print(f"{v:<22}{r['ms']:>10.1f}{r.get('speedup_over_eager_cp', 0):>12.3f}x"
              f"{r.get('speedup_over_one_gpu', 0):>9.2f}x{r.get('first_call_s', 0):>9.1f}  {exact:<19}"
              f"{r.get('kept', '')}/{r.get('sites', '')}")
    for n in rec["notes"]:
        print("  note:", n)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(WORKLOADS), help=f"comma-separated, from {list(WORKLOADS)}")
    ap.add_argument("--variants", default="eager,inductor,lossless", help=f"comma-separated, from {VARIANTS}")
    ap.add_argument("--ulysses", type=int, default=None, help="Ulysses degree (default: the world size)")
    ap.add_argument("--ring", type=int, default=1, help="ring degree")
    ap.add_argument("--attention-backend", default=None,
                    help="diffusers attention backend (ring needs one with the log-sum-exp: _native_flash)")
    ap.add_argument("--reps", type=int, default=4, help="timed forwards per variant (ABBA rounds)")
    ap.add_argument("--whole", action="store_true", help="compile the whole transformer, not its repeated blocks")
    ap.add_argument("--no-single", action="store_true", help="skip the one-GPU eager run")
    ap.add_argument("--tiny", action="store_true", help="the tiny models of the same classes (CPU: gloo)")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "bench_context_parallel.json"))
    args = ap.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    for v in args.variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; choose from {VARIANTS}")
    if DEVICE == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo")
    if args.ulysses is None:
        args.ulysses = dist.get_world_size() // args.ring
    runs = []
    try:
        for name in [m for m in args.models.split(",") if m]:
            rec = run_workload(name, args)
            runs.append(rec)
            if dist.get_rank() == 0:
                print_table(rec)
                with open(args.json, "w") as f:
                    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
                    json.dump({"torch": torch.__version__, "device": device, "runs": runs}, f, indent=1)
            torch._dynamo.reset()
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
