"""Host time of the lossless tier's runtime rewrites, measured on the CPU (no GPU needed).

A tiny model on the CPU, one thread, does almost no arithmetic: a forward's time is the host's cost of
issuing its ops, what a host-bound model pays on the GPU. Per model (``diffusion_fuse.testing.tiny_models``):

- ``eager``: the module;
- ``aot_eager``: torch's AOTAutograd graph run as traced (``torch.ops.aten.*`` calls), what the lossless tier
  starts from;
- ``aot + runtime rewrites``: that graph after ``fxpasses/recompose_linear.py`` and
  ``fxpasses/python_bindings.py`` (the rewrites the lossless tier's runtime graph gets).

Medians over rounds of 20 forwards, variants interleaved; outputs compared bitwise with eager.

    python benchmarks/bench_host_cpu.py [--models sana,flux,qwen_image,wan21] [--rounds 11]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tabulate import tabulate
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from diffusion_fuse.fxpasses.python_bindings import python_bindings
from diffusion_fuse.fxpasses.recompose_linear import recompose_linear
from diffusion_fuse.testing.tiny_models import build


def _with_runtime_rewrites(gm, _inputs):
    gm, _ = recompose_linear(gm)
    gm, _ = python_bindings(gm)
    return make_boxed_func(gm)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="sana,flux,qwen_image,wan21")
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    rewritten = aot_autograd(fw_compiler=_with_runtime_rewrites, inference_compiler=_with_runtime_rewrites)
    for name in args.models.split(","):
        torch._dynamo.reset()
        model, kw = build(name, torch.bfloat16)
        variants = {"eager": model, "aot_eager": torch.compile(model, backend="aot_eager"),
                    "aot + runtime rewrites": torch.compile(model, backend=rewritten)}
        times: dict[str, list[float]] = {k: [] for k in variants}
        with torch.no_grad():
            ref = model(**kw)[0]
            exact = {k: torch.equal(ref, f(**kw)[0]) for k, f in variants.items()}
            for _ in range(args.rounds):
                for k, f in variants.items():
                    t0 = time.perf_counter()
                    for _ in range(20):
                        f(**kw)
                    times[k].append((time.perf_counter() - t0) / 20 * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append([name, *(f"{med[k]:.3f}" for k in variants), f"{med['eager'] / med['aot + runtime rewrites']:.2f}",
                     all(exact.values())])
    print(tabulate(rows, headers=["tiny model", "eager ms", "aot_eager ms", "aot + runtime rewrites ms",
                                  "eager / rewritten", "all == eager"]))


if __name__ == "__main__":
    main()
