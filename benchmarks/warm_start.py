"""Cold vs warm start: the first call of a compiled model in a fresh process, then in a second process that finds
the first one's caches (``options={"warm_start": True}``: stored verdicts; generated kernels; Triton's cache).

Per model, two subprocesses share one new cache folder (``DIFFUSION_FUSE_CACHE_DIR``, ``TRITON_CACHE_DIR``), so
the first is cold and the second warm. Each builds the model, runs eager once, compiles the whole model with
``backend="diffusion_fuse"`` and times its first call (compile, verification or the stored verdicts, the forward)
and the verifier's share of it (the report's ``seconds``), and checks the output against eager bit for bit.
``--inductor`` adds Inductor's cold first call (``torch.compile(model)``) in a third process with caches of its
own; ``--cudagraphs`` compiles ours with ``mode="reduce-overhead"``'s CUDA graphs. ``--rounds N`` repeats the cold
first calls N times, alternating which goes first (the host's speed drifts between processes), and gives the ratio
of the medians. "trace s" is Dynamo's bytecode tracing, "backend s" the backend's compile (AOTAutograd and our passes,
or Inductor's); under ``TORCH_LOGS="+diffusion_fuse,diffusion_fuse_timings"`` the passes' and the verifier's steps
are printed too.

    python benchmarks/warm_start.py --tiny [--models flux,wan21]      # tiny models on the CPU
    python benchmarks/warm_start.py [--models flux1,wan21_14b]        # bench_models.py's models on the GPU
    python benchmarks/warm_start.py --models sana --cudagraphs --inductor --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(name: str, tiny: bool, variant: str) -> dict:
    import torch

    import diffusion_fuse

    torch.manual_seed(0)
    if tiny:
        from diffusion_fuse.testing.tiny_models import build

        model, kwargs = build(name)
    else:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import bench_models

        spec = bench_models.MODELS[name]
        model = bench_models.build_real(spec, [])
        kwargs = spec.inputs(torch.Generator("cuda").manual_seed(1))
    cuda = next(model.parameters()).is_cuda
    report = diffusion_fuse.Report()
    if variant == "inductor":
        compiled = torch.compile(model, dynamic=False)
    else:
        options = {"warm_start": True, "cudagraphs": variant == "cudagraphs"}
        compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(options, report), dynamic=False)
    with torch.no_grad():
        ref = model(**kwargs)[0]
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = compiled(**kwargs)[0]
        if cuda:
            torch.cuda.synchronize()
        first = time.perf_counter() - start
    entries = [e for g in report.graphs for e in g.verifications]
    names, values = torch._dynamo.utils.compile_times(repr="csv", aggregate=True)
    phases = dict(zip(names, (float(v) for v in values)))
    bitwise = bool(torch.equal(ref, out)) if variant != "inductor" else None
    return {"first_call_s": round(first, 3), "verifier_s": round(sum(e.get("seconds", 0) for e in entries), 3),
            "trace_s": round(phases.get("bytecode_tracing", 0.0), 3),
            "backend_s": round(phases.get("OutputGraph.call_user_compiler", 0.0), 3),
            "graphs": len(entries), "warm": sorted({e.get("warm_start", "") for e in entries}),
            "sites": len(report.sites()), "kept": report.count(status="kept"), "bitwise": bitwise}


def run_child(name: str, variant: str, root: str, tiny: bool) -> dict | str:
    """One first call in a fresh process whose caches live under ``root``: its result, or why it failed. The
    passes' and the verifier's timings are printed where TORCH_LOGS asks for them."""
    env = {**os.environ, "DIFFUSION_FUSE_CACHE_DIR": root, "TRITON_CACHE_DIR": os.path.join(root, "triton"),
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, __file__, "--child", name, "--variant", variant] + (["--tiny"] * tiny)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return f"failed: {proc.stderr.strip().splitlines()[-1:]}"
    passes: dict[str, float] = {}
    for ln in proc.stderr.splitlines():
        if "diffusion_fuse_timings] graph" in ln:
            print(f"    {ln.split('] ')[-1]}")
        elif "diffusion_fuse_timings] pass " in ln:
            pass_name, seconds = ln.split("] pass ")[-1].split(":")[:2]
            passes[pass_name] = passes.get(pass_name, 0.0) + float(seconds.split()[0])
    if passes:
        top = sorted(passes.items(), key=lambda kv: -kv[1])[:4]
        print(f"    passes: {sum(passes.values()):.3f} s (" + ", ".join(f"{k} {v:.2f}" for k, v in top) + ")")
    return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=None, help="comma-separated (tiny_models names with --tiny, else "
                    "bench_models.py's)")
    ap.add_argument("--tiny", action="store_true", help="tiny models on the CPU")
    ap.add_argument("--cudagraphs", action="store_true", help="ours with CUDA graphs (mode=\"reduce-overhead\")")
    ap.add_argument("--inductor", action="store_true", help="Inductor's cold first call too, in its own process")
    ap.add_argument("--rounds", type=int, default=1, help="cold first calls per variant, in alternating order "
                    "(ours then Inductor, then Inductor then ours), each with new caches; the ratio is of medians")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="plain", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.tiny, args.variant)))
        return
    models = (args.models or ("flux,wan21" if args.tiny else "flux1,wan21_14b")).split(",")
    print(f"{'model':<12} {'start':<14} {'first call s':>12} {'trace s':>8} {'backend s':>9} {'verifier s':>10} "
          f"{'sites kept':>10}  bitwise  verdicts")
    ours = "cudagraphs" if args.cudagraphs else "plain"
    for name in models:
        # The host's speed drifts between processes, so cold runs alternate: ours, Inductor, Inductor, ours, ...
        runs: list[tuple[str, str]] = []
        for r in range(max(1, args.rounds)):
            pair = [("cold", ours)] + ([("inductor cold", "inductor")] if args.inductor else [])
            runs += pair if r % 2 == 0 else pair[::-1]
            if r == 0:
                runs.insert(1, ("warm", ours))  # finds the first cold run's caches
        cold: dict[str, list[float]] = {}
        with tempfile.TemporaryDirectory() as tmp:
            first_cache = ""
            for k, (start, variant) in enumerate(runs):
                root = first_cache if start == "warm" else os.path.join(tmp, str(k))
                first_cache = first_cache or root
                r = run_child(name, variant, root, args.tiny)
                if isinstance(r, str):
                    print(f"{name:<12} {start:<14} {r}")
                    break
                if start != "warm":
                    cold.setdefault(variant, []).append(r["first_call_s"])
                print(f"{name:<12} {start:<14} {r['first_call_s']:>12.3f} {r['trace_s']:>8.3f} {r['backend_s']:>9.3f} "
                      f"{r['verifier_s']:>10.3f} {r['kept']:>4}/{r['sites']:<5}  {str(r['bitwise']):<7}  "
                      f"{','.join(r['warm'])}")
        if "inductor" in cold and ours in cold:
            a, b = statistics.median(cold[ours]), statistics.median(cold["inductor"])
            print(f"{name:<12} cold first call (median of {len(cold[ours])}), ours / Inductor's: {a:.3f} / {b:.3f} s "
                  f"= {a / b:.2f}x")


if __name__ == "__main__":
    main()
