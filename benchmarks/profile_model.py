"""The profile view at real shapes: one model of bench_models.py, compiled whole, through ``diffusion_fuse.profile``.

Random bf16 weights on the GPU and the real input shapes (bench_models.py's configs and inputs); eager, lossless
with and without CUDA graphs, and Inductor's default, each profiled under torch.profiler (diffusion_fuse/profile.py).
Prints the table and writes ``$OUT/profile_<model>.html`` and ``.json``.

    python benchmarks/profile_model.py flux1 [--forwards 3] [--warmup 3]
    python benchmarks/profile_model.py flux --tiny          # the tiny model of the same class, on the CPU
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")


def main() -> int:
    from bench_models import MODELS, build_real

    import diffusion_fuse
    from diffusion_fuse.testing.tiny_models import MODEL_NAMES, build

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help=f"one of {list(MODELS)}; with --tiny one of {MODEL_NAMES}")
    ap.add_argument("--forwards", type=int, default=3, help="profiled forwards per variant")
    ap.add_argument("--warmup", type=int, default=3, help="calls before profiling (CUDA graphs: at least 3)")
    ap.add_argument("--tiny", action="store_true", help="the tiny random-weight model on the CPU (bf16)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="where the HTML and JSON go (default $OUT)")
    args = ap.parse_args()
    notes: list[str] = []
    if args.tiny:
        model, kwargs = build(args.model, torch.bfloat16)
        label = f"tiny {args.model}"
    else:
        spec = MODELS[args.model]
        model = build_real(spec, notes)
        kwargs = spec.inputs(torch.Generator(device="cuda").manual_seed(0))
        label = f"{spec.label}, {spec.shape}"
    report = diffusion_fuse.profile(model, forwards=args.forwards, warmup=args.warmup, **kwargs)
    report.notes[:0] = notes
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"profile_{args.model}{'_tiny' if args.tiny else ''}")
    report.save_html(stem + ".html", title=f"diffusion_fuse profile: {label}")
    report.save(stem + ".json")
    print(f"{label}\n\n{report.table()}\n\nHTML: {stem}.html\nJSON: {stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
