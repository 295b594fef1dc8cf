"""What copying a forward's inputs into a CUDA graph's buffers costs, on the GPU and on the host.

Before each replay, cudagraph trees copies every input that is not a parameter or buffer into the graph's own
input buffers with one ``torch._foreach_copy_`` over all of them. The FLUX inputs mix bf16 and fp32, so that
call takes its per-tensor path: one ``cudaMemcpyAsync`` each (the profiles show seven "Memcpy DtoD" with idle GPU
between them before every FLUX forward). This probe times, for the FLUX stack's seven inputs at 1024²:

- ``per_tensor``: ``dst.copy_(src)`` for each (what that path does);
- ``foreach_mixed``: the tree's call as it is;
- ``foreach_by_dtype``: one ``_foreach_copy_`` per dtype (each takes the fused multi-tensor kernel).

GPU ms: the copies queued behind a 2 ms GPU sleep, CUDA events around them (the host's issue time hidden). Host
ms: the time to issue them. Medians of ``--reps``.

    python benchmarks/probe_input_copies.py [--reps 50] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from tabulate import tabulate


def flux_inputs():
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    return [torch.randn(1, 4096, 64, generator=g, device="cuda").to(torch.bfloat16),
            torch.randn(1, 512, 4096, generator=g, device="cuda").to(torch.bfloat16),
            torch.randn(1, 768, generator=g, device="cuda").to(torch.bfloat16),
            torch.tensor([0.5], **bf), torch.zeros(4096, 3, device="cuda"), torch.zeros(512, 3, device="cuda"),
            torch.tensor([3.5], **bf)]


def modes(dsts, srcs):
    by_dtype: dict[torch.dtype, tuple[list, list]] = {}
    for d, s in zip(dsts, srcs):
        by_dtype.setdefault(d.dtype, ([], []))
        by_dtype[d.dtype][0].append(d)
        by_dtype[d.dtype][1].append(s)

    def per_tensor():
        for d, s in zip(dsts, srcs):
            d.copy_(s)

    def foreach_mixed():
        torch._foreach_copy_(dsts, srcs)

    def foreach_by_dtype():
        for d, s in by_dtype.values():
            torch._foreach_copy_(d, s)

    return {"per_tensor": per_tensor, "foreach_mixed": foreach_mixed, "foreach_by_dtype": foreach_by_dtype}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "probe_input_copies.json"))
    args = ap.parse_args()
    srcs = flux_inputs()
    dsts = [torch.empty_like(s) for s in srcs]
    out, rows = {}, []
    cycles = int(2e-3 * torch.cuda.get_device_properties(0).clock_rate * 1e3)  # ~2 ms at the nominal clock
    for name, fn in modes(dsts, srcs).items():
        fn()
        torch.cuda.synchronize()
        assert all(torch.equal(d, s) for d, s in zip(dsts, srcs))
        gpu, host = [], []
        for _ in range(args.reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(cycles)
            e0.record()
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e3)
            e1.record()
            torch.cuda.synchronize()
            gpu.append(e0.elapsed_time(e1))
        out[name] = {"gpu_ms": statistics.median(gpu), "host_ms": statistics.median(host)}
        rows.append([name, f"{out[name]['gpu_ms'] * 1e3:.1f}", f"{out[name]['host_ms'] * 1e3:.1f}"])
    with open(args.json, "w") as f:
        json.dump({"inputs": [[list(s.shape), str(s.dtype)] for s in srcs], "modes": out}, f, indent=1)
    print(f"FLUX stack inputs ({len(srcs)} tensors), medians of {args.reps}:")
    print(tabulate(rows, headers=["copies", "GPU µs (host hidden)", "host µs to issue"]))


if __name__ == "__main__":
    main()
