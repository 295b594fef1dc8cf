"""Cold vs warm start: the first call of a compiled model in a fresh process, then in a second process that finds
the first one's caches (``options={"warm_start": True}``: stored verdicts; generated kernels; Triton's cache).

Per model, two subprocesses share one new cache folder (``DIFFUSION_FUSE_CACHE_DIR``, ``TRITON_CACHE_DIR``), so
the first is cold and the second warm. Each builds the model, runs eager once, compiles the whole model with
``backend="diffusion_fuse"`` and times its first call (compile, verification or the stored verdicts, the forward)
and the verifier's share of it (the report's ``seconds``), and checks the output against eager bit for bit.
``--inductor`` adds Inductor's cold first call (``torch.compile(model)``) in a third process with caches of its
own; ``--cudagraphs`` compiles ours with ``mode="reduce-overhead"``'s CUDA graphs.

    python benchmarks/warm_start.py --tiny [--models flux,wan21]      # tiny models on the CPU
    python benchmarks/warm_start.py [--models flux1,wan21_14b]        # bench_models.py's models on the GPU
    python benchmarks/warm_start.py --models sana --cudagraphs --inductor
"""

from __future__ import annotations

import argparse
import json
import os
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
    bitwise = bool(torch.equal(ref, out)) if variant != "inductor" else None
    return {"first_call_s": round(first, 3), "verifier_s": round(sum(e.get("seconds", 0) for e in entries), 3),
            "graphs": len(entries), "warm": sorted({e.get("warm_start", "") for e in entries}),
            "sites": len(report.sites()), "kept": report.count(status="kept"), "bitwise": bitwise}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=None, help="comma-separated (tiny_models names with --tiny, else "
                    "bench_models.py's)")
    ap.add_argument("--tiny", action="store_true", help="tiny models on the CPU")
    ap.add_argument("--cudagraphs", action="store_true", help="ours with CUDA graphs (mode=\"reduce-overhead\")")
    ap.add_argument("--inductor", action="store_true", help="Inductor's cold first call too, in its own process")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="plain", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.tiny, args.variant)))
        return
    models = (args.models or ("flux,wan21" if args.tiny else "flux1,wan21_14b")).split(",")
    print(f"{'model':<12} {'start':<14} {'first call s':>12} {'verifier s':>10} {'sites kept':>10}  bitwise  verdicts")
    ours = "cudagraphs" if args.cudagraphs else "plain"
    for name in models:
        runs = [("cold", ours), ("warm", ours)] + ([("inductor cold", "inductor")] if args.inductor else [])
        cold = {}
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as inductor_cache:
            for start, variant in runs:
                root = inductor_cache if variant == "inductor" else cache
                env = {**os.environ, "DIFFUSION_FUSE_CACHE_DIR": root, "TRITON_CACHE_DIR": os.path.join(root, "triton"),
                       "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),
                       "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
                cmd = [sys.executable, __file__, "--child", name, "--variant", variant] + (["--tiny"] * args.tiny)
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if proc.returncode != 0:
                    print(f"{name:<12} {start:<14} failed: {proc.stderr.strip().splitlines()[-1:]}")
                    break
                r = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
                for ln in proc.stderr.splitlines():  # the verifier's timings, where TORCH_LOGS asks for them
                    if "diffusion_fuse_timings] graph" in ln:
                        print(f"    {ln.split('] ')[-1]}")
                cold.setdefault(variant, r["first_call_s"])
                print(f"{name:<12} {start:<14} {r['first_call_s']:>12.3f} {r['verifier_s']:>10.3f} "
                      f"{r['kept']:>4}/{r['sites']:<5}  {str(r['bitwise']):<7}  {','.join(r['warm'])}")
        if "inductor" in cold and ours in cold:
            print(f"{name:<12} cold first call, ours / Inductor's: {cold[ours] / cold['inductor']:.2f}x")


if __name__ == "__main__":
    main()
