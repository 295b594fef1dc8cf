"""End to end at real shapes: eager vs Inductor vs diffusion_fuse lossless (pointwise pass on and off), in one run.

Models (random weights, bf16, real widths; issue #3):
- flux_stack: FLUX.1-dev-sized FluxTransformer2DModel with 2 double + 4 single blocks, 1024²
  (4096 image + 512 text tokens).
- flux_fp8_stack: the same stack with every linear an FP8-static linear
  (diffusion_fuse.testing.fp8.FP8StaticLinear, input scales calibrated on one call; issue #5).
- flux_torchao_stack: the same stack quantized with torchao's own static FP8 recipe
  (``Float8StaticActivationFloat8WeightConfig``, prepare / one calibration call / convert; needs torchao).
- sana: SANA-1.6B, full depth, 1024² batch 2 (bench_models.py's config and inputs).
- wan22_block: Wan2.2-TI2V-5B-sized WanTransformer3DModel with 1 block at 704p/121f
  (27,280 tokens, per-token timesteps), fp32 modules kept as from_pretrained keeps them.
Each forward is timed with CUDA events after warm-up (median of --reps); outputs are compared
bitwise with eager. Prints a table; writes JSON (--json).

    python benchmarks/bench_e2e.py [--models flux_stack,flux_fp8_stack,wan22_block] [--reps 10] [--profile]
        [--cudagraphs] [--back-to-back N]   (N forwards issued without a sync between them, per forward)
        [--host-hidden]   (each forward's GPU time with its host work queued behind a GPU sleep)
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

import diffusion_fuse
from diffusion_fuse.testing.tiny_models import cast_like_from_pretrained

try:
    from steady import timed_back_to_back
except ImportError:  # imported as benchmarks.<module>
    from benchmarks.steady import timed_back_to_back

warnings.filterwarnings("ignore")


def flux_stack():
    from diffusers import FluxTransformer2DModel

    with torch.device("cuda"):
        m = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=2, num_single_layers=4,
                                   attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                                   pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))
    m = m.eval().to(torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.zeros(64, 64, 3, device="cuda")
    ids[..., 1] = torch.arange(64, device="cuda")[:, None]
    ids[..., 2] = torch.arange(64, device="cuda")[None, :]
    kw = dict(hidden_states=torch.randn(1, 4096, 64, device="cuda", generator=g).bfloat16(),
              encoder_hidden_states=torch.randn(1, 512, 4096, device="cuda", generator=g).bfloat16(),
              pooled_projections=torch.randn(1, 768, device="cuda", generator=g).bfloat16(),
              timestep=torch.tensor([0.5], device="cuda").bfloat16(), img_ids=ids.reshape(-1, 3),
              txt_ids=torch.zeros(512, 3, device="cuda"), guidance=torch.tensor([3.5], device="cuda").bfloat16(),
              return_dict=False)
    return m, kw


def flux_fp8_stack():
    from diffusion_fuse.testing.fp8 import quantize_linears_fp8

    m, kw = flux_stack()
    quantize_linears_fp8(m, kw)
    return m, kw


def wan22_block():
    from diffusers import WanTransformer3DModel

    with torch.device("cuda"):
        m = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=24, attention_head_dim=128,
                                  in_channels=48, out_channels=48, text_dim=4096, freq_dim=256, ffn_dim=14336,
                                  num_layers=1, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
                                  rope_max_seq_len=1024)
    m = cast_like_from_pretrained(m.eval(), torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(0)
    ts = torch.full((31, 22, 40), 500, dtype=torch.int64, device="cuda")
    ts[0] = 0  # TI2V: the conditioning frame has timestep 0
    kw = dict(hidden_states=torch.randn(1, 48, 31, 44, 80, device="cuda", generator=g).bfloat16(),
              timestep=ts.flatten().unsqueeze(0),
              encoder_hidden_states=torch.randn(1, 512, 4096, device="cuda", generator=g).bfloat16(),
              return_dict=False)
    return m, kw


def flux_torchao_stack():
    """The FLUX stack with torchao's own static FP8 recipe (torchao >= 0.18 importable: carry its wheel)."""
    from diffusion_fuse.testing.fp8 import quantize_linears_torchao

    m, kw = flux_stack()
    quantize_linears_torchao(m, kw)
    return m, kw


def sana():
    """SANA-1.6B at full depth, 1024² batch 2 (the whole-model table's config and inputs, benchmarks/bench_models.py):
    host-bound in eager; here whole-model compiled, for kernel profiles (--profile) under CUDA graphs."""
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_models

    spec = bench_models.MODELS["sana"]
    m = bench_models.build_real(spec, [])
    return m, spec.inputs(torch.Generator(device="cuda").manual_seed(0))


MODELS = {"sana": sana, "flux_stack": flux_stack, "flux_fp8_stack": flux_fp8_stack, "flux_torchao_stack": flux_torchao_stack,
          "wan22_block": wan22_block}


class phase:
    """Records when a timing phase ran (wall clock, as nvidia-smi's log stamps its samples) in ``rec["phases"]``:
    ``benchmarks/clocks_summary.py --phases`` gives each phase's GPU clocks and power from run_gpu.sh's log."""

    def __init__(self, rec: dict, name: str) -> None:
        self.rec, self.name = rec, name

    def __enter__(self) -> None:
        self.t0 = time.time()

    def __exit__(self, *exc) -> None:
        self.rec.setdefault("phases", []).append([self.name, self.t0, time.time()])


HOST_MS: dict[int, list[float]] = {}  # id(fn) -> host ms of each timed call (until it returned, before the sync)


def timed(fn, reps: int) -> tuple[float, list[float]]:
    times, host = [], HOST_MS.setdefault(id(fn), [])
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        a.record()
        fn()
        b.record()
        host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), times


B2B_ROUNDS = 6  # back-to-back rounds per variant, interleaved ABBA across the variants


_SLEEP_CYCLES_PER_MS: list[float] = []


def _sleep_ms(ms: float) -> None:
    """Keep the GPU busy for about ``ms`` (``torch.cuda._sleep``, calibrated once with CUDA events)."""
    if not _SLEEP_CYCLES_PER_MS:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        torch.cuda._sleep(10_000_000)
        b.record()
        b.synchronize()
        _SLEEP_CYCLES_PER_MS.append(10_000_000 / a.elapsed_time(b))
    torch.cuda._sleep(int(ms * _SLEEP_CYCLES_PER_MS[0]))


def timed_host_hidden(fn, reps: int, host_ms: float) -> tuple[float, list[float], int]:
    """GPU ms of one forward with its host work hidden: the GPU sleeps (longer than the forward's host time)
    before the start event, so the whole forward is queued when the start event fires, as in a denoising loop
    whose host runs ahead. What it excludes is the host latency before the first kernel, which a single synced
    forward pays in full. Returns (median, times, reps in which the start event had fired before the call
    returned: the sleep did not cover the host, and that rep measured host time too)."""
    times, exposed = [], 0
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        _sleep_ms(max(3 * host_ms, 2.0))
        a.record()
        fn()
        b.record()
        exposed += bool(a.query())
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), times, exposed


def cprofile_calls(fn, tag: str, calls: int = 3) -> None:
    """Where the host time of ``calls`` calls goes (cProfile, by own time) -> $OUT/cprofile_<tag>.txt."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(45)
    with open(os.path.join(os.environ.get("OUT", "."), f"cprofile_{tag}.txt"), "w") as f:
        f.write(f"{tag}: {calls} calls\n{buf.getvalue()}")


def gap_report(prof, kernels) -> str:
    """Where the GPU is idle during the profiled call: from the call's first host event to its first kernel, and
    between kernels (start of one minus end of the one before), largest gaps with their neighbours."""
    ks = sorted(kernels, key=lambda e: e.time_range.start)
    if not ks:
        return ""
    host = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    first_host = min((e.time_range.start for e in host), default=ks[0].time_range.start)
    gaps = [(b.time_range.start - a.time_range.end, a.name[:60], b.name[:60]) for a, b in zip(ks, ks[1:])]
    idle = sum(max(g, 0.0) for g, _, _ in gaps)
    span = ks[-1].time_range.end - ks[0].time_range.start
    lines = [f"\nGPU span {span / 1e3:.3f} ms (first kernel start to last kernel end), idle between kernels "
             f"{idle / 1e3:.3f} ms in {len(gaps)} gaps, host start to first kernel {(ks[0].time_range.start - first_host) / 1e3:.3f} ms"]
    for lo, hi in ((0, 2), (2, 5), (5, 20), (20, 1e12)):
        sel = [g for g, _, _ in gaps if lo <= g < hi]
        lines.append(f"  gaps {lo}-{hi if hi < 1e12 else 'inf'} us: {len(sel)}, {sum(sel) / 1e3:.3f} ms")
    lines.append("largest gaps (us, kernel before -> kernel after):")
    for g, a, b in sorted(gaps, reverse=True)[:15]:
        lines.append(f"  {g:8.1f}  {a} -> {b}")
    return "\n".join(lines) + "\n"


def profile_call(fn, tag: str, calls: int = 1) -> float:
    """``calls`` profiled calls issued back to back: writes the kernel table and the GPU's idle gaps to
    $OUT/profile_<tag>.txt; returns summed kernel ms per call."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_ms = sum(e.device_time for e in kernels) / 1e3
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(e.device_time)
    rows = sorted(((sum(v) / 1e3, len(v), n[:110]) for n, v in by_name.items()), reverse=True)
    table = tabulate([[f"{ms:.3f}", f"{100 * ms / busy_ms:.1f}", c, n] for ms, c, n in rows],
                     headers=["ms", "%", "calls", "kernel"])
    with open(os.path.join(os.environ.get("OUT", "."), f"profile_{tag}.txt"), "w") as f:
        f.write(f"{tag}: {len(kernels)} kernels, {busy_ms:.3f} ms summed kernel time\n{table}\n")
        f.write(gap_report(prof, kernels))
    print(f"{tag}: {len(kernels)} kernels, {busy_ms:.3f} ms kernel time; top 8:")
    print("\n".join(table.splitlines()[:10]))
    return busy_ms / calls


def _new_step(fn):
    """Each call is a new forward for torch's cudagraph trees (outputs of the previous one may be overwritten)."""
    def call(**kw):
        torch.compiler.cudagraph_mark_step_begin()
        return fn(**kw)

    return call


def bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="flux_stack,flux_fp8_stack,wan22_block")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--skip-inductor", action="store_true")
    ap.add_argument("--skip-nopw", action="store_true", help="skip the lossless run with the pointwise pass off")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "bench_e2e.json"))
    ap.add_argument("--cudagraphs", action="store_true",
                    help='add lossless and Inductor under CUDA graphs (mode="reduce-overhead")')
    ap.add_argument("--profile", action="store_true",
                    help="also profile one call per variant: kernel table and GPU-busy share to $OUT/profile_*.txt")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time the variants in R rounds, alternating their order (ABBA), --reps calls each per round; "
                         "medians over all rounds (clock and host drift spread over every variant)")
    ap.add_argument("--host-hidden", action="store_true",
                    help="also time each forward with its host work hidden behind a GPU sleep (GPU ms per forward)")
    ap.add_argument("--back-to-back", type=int, default=0, metavar="N",
                    help=f"also time N forwards issued back to back, per forward (median of {B2B_ROUNDS} rounds, "
                         "interleaved ABBA across the variants)")
    args = ap.parse_args()
    rows, records = [], []
    for name in args.models.split(","):
        torch._dynamo.reset()
        HOST_MS.clear()  # keyed by id() of this model's call lambdas, which a later model's may reuse
        model, kw = MODELS[name]()
        variants = {"eager": model}
        report = diffusion_fuse.Report()
        variants["lossless"] = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
        if not args.skip_nopw:  # the same tier without the pointwise pass: what the pass is worth
            nopw = diffusion_fuse.DiffusionFuseBackend({"patterns": {"pointwise": False}}, diffusion_fuse.Report())
            variants["lossless_nopw"] = torch.compile(model, backend=nopw)
        if not args.skip_inductor:
            variants["inductor"] = torch.compile(model)
        if args.cudagraphs:  # the host-overhead cure: one graph replay per forward
            # options={"cudagraphs": True} is what backend="diffusion_fuse", mode="reduce-overhead" sets
            variants["lossless_cudagraphs"] = torch.compile(
                model, backend=diffusion_fuse.DiffusionFuseBackend({"cudagraphs": True}, diffusion_fuse.Report()))
            if not args.skip_inductor:
                variants["inductor_cudagraphs"] = torch.compile(model, mode="reduce-overhead")
        for k in [k for k in variants if k.endswith("_cudagraphs")]:
            variants[k] = _new_step(variants[k])
        rec: dict = {"model": name}
        outs = {}
        with torch.no_grad():
            calls = {}
            for k, fn in variants.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                outs[k] = fn(**kw)[0].clone()  # a CUDA-graph output is overwritten by the next replay
                torch.cuda.synchronize()
                rec[f"{k}_first_call_s"] = time.perf_counter() - t0
                fn(**kw)  # warm-up
                torch.cuda.reset_peak_memory_stats()
                calls[k] = call = lambda fn=fn: fn(**kw)  # noqa: E731
                with phase(rec, f"{k} synced"):
                    rec[f"{k}_ms"], rec[f"{k}_times"] = timed(call, args.reps)
                rec[f"{k}_host_ms"] = statistics.median(HOST_MS[id(call)])
                rec[f"{k}_peak_GiB"] = torch.cuda.max_memory_allocated() / 2**30
            for r in range(1, args.rounds):  # ABBA: later rounds alternate the order
                for k in (reversed(list(calls)) if r % 2 else list(calls)):
                    with phase(rec, f"{k} synced"):
                        rec[f"{k}_times"] += timed(calls[k], args.reps)[1]
                    rec[f"{k}_ms"] = statistics.median(rec[f"{k}_times"])
                    rec[f"{k}_host_ms"] = statistics.median(HOST_MS[id(calls[k])])
            rec["rounds"] = args.rounds
            if args.host_hidden:
                for r in range(max(args.rounds, 1)):
                    for k in (reversed(list(calls)) if r % 2 else list(calls)):
                        with phase(rec, f"{k} host hidden"):
                            _, times, exposed = timed_host_hidden(calls[k], args.reps, rec[f"{k}_host_ms"])
                        rec.setdefault(f"{k}_gpu_times", []).extend(times)
                        rec[f"{k}_gpu_exposed"] = rec.get(f"{k}_gpu_exposed", 0) + exposed
                        rec[f"{k}_gpu_ms"] = statistics.median(rec[f"{k}_gpu_times"])
            # ABBA rounds across the variants: the GPU's power state drifts with time, and interleaving spreads the
            # drift over every variant (each variant's own load still sets its clock at the power cap)
            if args.back_to_back:
                for r in range(B2B_ROUNDS):
                    for k in (reversed(list(calls)) if r % 2 else list(calls)):
                        with phase(rec, f"{k} back to back"):
                            rec.setdefault(f"{k}_b2b_times", []).append(
                                timed_back_to_back(calls[k], args.back_to_back))
                for k in calls:
                    rec[f"{k}_b2b_ms"] = statistics.median(rec[f"{k}_b2b_times"])
            # a second round of eager and ours, interleaved, to show the spread
            rec["eager_ms_2"], _ = timed(lambda: model(**kw), args.reps)
            rec["lossless_ms_2"], _ = timed(lambda: variants["lossless"](**kw), args.reps)
            if args.profile:
                for k, fn in variants.items():
                    rec[f"{k}_kernel_ms"] = profile_call(lambda: fn(**kw), f"{name}_{k}")
                    if k.startswith("lossless") or k == "inductor_cudagraphs":  # the host per call, side by side
                        cprofile_calls(lambda: fn(**kw), f"{name}_{k}")
                    if args.back_to_back:  # where the GPU idles when forwards are issued without a sync
                        profile_call(lambda: fn(**kw), f"{name}_{k}_b2b{args.back_to_back}", args.back_to_back)
                print(name, "host ms per call (until it returns):",
                      {k: round(rec[f"{k}_host_ms"], 2) for k in variants})
        rec["lossless_equal"] = torch.equal(bits(outs["eager"]), bits(outs["lossless"]))
        if "lossless_nopw" in outs:
            rec["lossless_nopw_equal"] = torch.equal(bits(outs["eager"]), bits(outs["lossless_nopw"]))
        rec["inductor_equal"] = torch.equal(bits(outs["eager"]), bits(outs["inductor"])) if "inductor" in outs else None
        for k in ("lossless_cudagraphs", "inductor_cudagraphs"):
            if k in outs:
                rec[f"{k}_equal"] = torch.equal(bits(outs["eager"]), bits(outs[k]))
        rec["sites"] = len(report.sites())
        rec["kept"] = report.count(status="kept")
        rec["pointwise_sites"] = report.count("pointwise")
        rec["pointwise_kept"] = report.count("pointwise", status="kept")
        rec["counters"] = report.counters()
        rec["report"] = report.table()
        records.append(rec)
        ind = rec.get("inductor_ms")
        nopw = rec.get("lossless_nopw_ms")
        rows.append([name, f"{rec['eager_ms']:.2f} / {rec['eager_ms_2']:.2f}", f"{ind:.2f}" if ind else "-",
                     f"{nopw:.2f}" if nopw else "-",
                     f"{rec['lossless_ms']:.2f} / {rec['lossless_ms_2']:.2f}",
                     f"{rec['eager_ms'] / rec['lossless_ms']:.3f}", f"{ind / rec['lossless_ms']:.3f}" if ind else "-",
                     f"{rec['kept']}/{rec['sites']} ({rec['pointwise_kept']}/{rec['pointwise_sites']} pointwise)",
                     rec["lossless_equal"], rec["inductor_equal"],
                     f"{rec['lossless_first_call_s']:.1f}", f"{rec.get('inductor_first_call_s', 0):.1f}"])
        print(rec["report"])
        del model, variants, outs
        torch.cuda.empty_cache()
        with open(args.json, "w") as f:  # after every model: a run cut short by its time limit keeps what it measured
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records}, f,
                      indent=2, default=str)
    print(tabulate(rows, headers=["model", "eager ms (2 rounds)", "inductor ms", "lossless w/o pointwise ms",
                                  "lossless ms (2 rounds)",
                                  "eager/lossless", "inductor/lossless", "sites kept", "lossless exact",
                                  "inductor exact", "lossless 1st call s", "inductor 1st call s"]))
    # every variant: GPU time per forward, host time until the call returned, summed kernel time (--profile)
    per = []
    for rec in records:
        for k in ("eager", "inductor", "inductor_cudagraphs", "lossless_nopw", "lossless", "lossless_cudagraphs"):
            if f"{k}_ms" in rec:
                exact = rec.get(f"{k}_equal", True if k == "eager" else None)
                b2b = rec.get(f"{k}_b2b_ms")
                gpu = rec.get(f"{k}_gpu_ms")
                per.append([rec["model"], k, f"{rec[f'{k}_ms']:.2f}", f"{rec[f'{k}_host_ms']:.2f}",
                            f"{gpu:.2f}" if gpu else "-",
                            f"{rec['eager_gpu_ms'] / gpu:.3f}" if gpu and rec.get("eager_gpu_ms") else "-",
                            f"{rec[f'{k}_kernel_ms']:.2f}" if f"{k}_kernel_ms" in rec else "-",
                            f"{rec['eager_ms'] / rec[f'{k}_ms']:.3f}",
                            f"{b2b:.2f}" if b2b else "-",
                            f"{rec['eager_b2b_ms'] / b2b:.3f}" if b2b else "-", exact])
    print(tabulate(per, headers=["model", "variant", "ms", "host ms", "GPU ms (host hidden)", "eager/variant GPU",
                                 "kernel ms", "eager/variant",
                                 "back-to-back ms", "eager/variant b2b", "== eager"]))


if __name__ == "__main__":
    main()
