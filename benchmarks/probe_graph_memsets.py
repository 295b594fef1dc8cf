"""Probe: do cuBLAS's memset nodes cost a CUDA graph the gap before each GEMM, and does hoisting them remove it?

FLUX.1-dev's CUDA-graph forward (results/h200-2026-12-01b/run4/profile_flux1_lossless-cudagraphs.txt) has 362
``Memset`` nodes, one before each of cuBLAS's cooperative ``nvjet`` GEMMs (and its split-K ones), and 282 gaps of
2-5 µs (0.70 ms), nearly all "Memset -> nvjet ... coop". Eager and Inductor have the same memsets. A memset node
depends on the node before it in stream order, so the GEMM waits for kernel -> memset -> GEMM, two transitions. If
the memset instead depended on what that kernel depends on (and the GEMM on both), it could run while the kernel
runs, and the GEMM would follow the kernel directly. That is only safe when the kernel before it does not use cuBLAS's workspace (the
memset zeroes part of it): here the kernel before each GEMM is an elementwise one, as our norm and pointwise
kernels are in the model.

For each GEMM shape: a graph of ``REPEATS`` x (elementwise kernel -> GEMM) is captured with
``torch.cuda.CUDAGraph(keep_graph=True)``; variant "as captured" is instantiated unchanged, variant "memsets
hoisted" after rewiring every memset node whose one dependency is a kernel node that itself follows no memset (the
elementwise kernel) to that kernel's dependencies, through the CUDA runtime's graph API (ctypes). Both are replayed
interleaved; medians of CUDA-event times per replay; outputs compared bitwise.

    python benchmarks/probe_graph_memsets.py [--json PATH]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics

import torch
from tabulate import tabulate

REPEATS = 24
SHAPES = [  # (M, K, N): FLUX.1-dev linears whose cuBLAS kernel is cooperative (a memset before it)
    (4096, 3072, 3072),  # double block image q/k/v: nvjet 256x128 coopA
    (4608, 3072, 3072),  # single block q/k/v: nvjet 192x192 coopB
    (4608, 3072, 12288),  # single block proj_mlp
]
KERNEL, MEMSET = 0, 2  # cudaGraphNodeType


def _cudart() -> ctypes.CDLL:
    """The CUDA runtime torch loaded (found in this process's mappings)."""
    with open("/proc/self/maps") as f:
        paths = {ln.split()[-1] for ln in f if "libcudart.so" in ln}
    if not paths:
        raise RuntimeError("libcudart is not loaded")
    return ctypes.CDLL(sorted(paths)[0])


class GraphEdit:
    """The few CUDA runtime graph calls the probe needs; CUDA 13 takes an edge-data argument (NULL here) that
    CUDA 12's calls of the same name do not."""

    def __init__(self) -> None:
        self.rt = _cudart()
        v = ctypes.c_int()
        self._check(self.rt.cudaRuntimeGetVersion(ctypes.byref(v)), "cudaRuntimeGetVersion")
        self.version = v.value
        self.edge_data = self.version >= 13000

    @staticmethod
    def _check(err: int, what: str) -> None:
        if err:
            raise RuntimeError(f"{what} failed with cudaError {err}")

    def nodes(self, graph: int) -> list[int]:
        n = ctypes.c_size_t()
        self._check(self.rt.cudaGraphGetNodes(ctypes.c_void_p(graph), None, ctypes.byref(n)), "cudaGraphGetNodes")
        arr = (ctypes.c_void_p * n.value)()
        self._check(self.rt.cudaGraphGetNodes(ctypes.c_void_p(graph), arr, ctypes.byref(n)), "cudaGraphGetNodes")
        return [a or 0 for a in arr]

    def node_type(self, node: int) -> int:
        t = ctypes.c_int()
        self._check(self.rt.cudaGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t)), "cudaGraphNodeGetType")
        return t.value

    def edges(self, graph: int) -> list[tuple[int, int]]:
        n = ctypes.c_size_t()
        args = (None,) if self.edge_data else ()
        self._check(self.rt.cudaGraphGetEdges(ctypes.c_void_p(graph), None, None, *args, ctypes.byref(n)),
                    "cudaGraphGetEdges")
        a, b = (ctypes.c_void_p * n.value)(), (ctypes.c_void_p * n.value)()
        self._check(self.rt.cudaGraphGetEdges(ctypes.c_void_p(graph), a, b, *args, ctypes.byref(n)),
                    "cudaGraphGetEdges")
        return [(x or 0, y or 0) for x, y in zip(a, b)]

    def _edge_call(self, name: str, graph: int, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        a = (ctypes.c_void_p * len(pairs))(*[p[0] for p in pairs])
        b = (ctypes.c_void_p * len(pairs))(*[p[1] for p in pairs])
        args = (None,) if self.edge_data else ()
        self._check(getattr(self.rt, name)(ctypes.c_void_p(graph), a, b, *args, ctypes.c_size_t(len(pairs))), name)

    def remove_edges(self, graph: int, pairs: list[tuple[int, int]]) -> None:
        self._edge_call("cudaGraphRemoveDependencies", graph, pairs)

    def add_edges(self, graph: int, pairs: list[tuple[int, int]]) -> None:
        self._edge_call("cudaGraphAddDependencies", graph, pairs)


def hoist_memsets(edit: GraphEdit, graph: int) -> int:
    """Rewire each memset whose one dependency is a kernel that follows no memset to that kernel's own
    dependencies; returns how many were moved."""
    types = {n: edit.node_type(n) for n in edit.nodes(graph)}
    deps: dict[int, list[int]] = {}
    users: dict[int, list[int]] = {}
    for a, b in edit.edges(graph):
        deps.setdefault(b, []).append(a)
        users.setdefault(a, []).append(b)
    moved = 0
    for m, t in types.items():
        if t != MEMSET or len(deps.get(m, [])) != 1:
            continue
        (k,) = deps[m]
        if types.get(k) != KERNEL or any(types.get(d) == MEMSET for d in deps.get(k, [])):
            continue  # the kernel before it may be cuBLAS's (it would share the workspace): leave it
        edit.remove_edges(graph, [(k, m)])
        edit.add_edges(graph, [(d, m) for d in deps.get(k, [])])
        # what followed the memset (the GEMM) followed the kernel through it: it must still wait for the kernel
        edit.add_edges(graph, [(k, g) for g in users.get(m, [])])
        moved += 1
    return moved


def _program(x, w, b):
    # an elementwise kernel, then cuBLAS, REPEATS times (each from x: any GEMM shape)
    return [torch.nn.functional.linear(x * (1 + i / 1024), w, b) for i in range(REPEATS)]


def _capture(x, w, b, edit: GraphEdit, hoist: bool):
    g = torch.cuda.CUDAGraph(keep_graph=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _program(x, w, b)  # warm-up: cuBLAS picks its kernels outside the capture
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        outs = _program(x, w, b)
    graph = g.raw_cuda_graph()
    n_memsets = sum(edit.node_type(n) == MEMSET for n in edit.nodes(graph))
    moved = hoist_memsets(edit, graph) if hoist else 0
    g.instantiate()
    return g, outs, n_memsets, moved


def _time(g, reps=30) -> float:
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "probe_graph_memsets.json"))
    args = ap.parse_args()
    edit = GraphEdit()
    rows = []
    for M, K, N in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(M + N)
        x = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
        w = (torch.randn(N, K, device="cuda", generator=gen) / K ** 0.5).bfloat16()
        bias = torch.randn(N, device="cuda", generator=gen).bfloat16()
        plain, out_a, n_memsets, _ = _capture(x, w, bias, edit, hoist=False)
        hoisted, out_b, _, moved = _capture(x, w, bias, edit, hoist=True)
        plain.replay()
        hoisted.replay()
        torch.cuda.synchronize()
        same = all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(out_a, out_b))
        ta, tb = [], []
        for _ in range(4):  # interleaved
            ta.append(_time(plain))
            tb.append(_time(hoisted))
        a_us, b_us = statistics.median(ta), statistics.median(tb)
        del plain, hoisted, out_a, out_b
        rows.append({"shape": [M, K, N], "gemms": REPEATS, "memset_nodes": n_memsets, "moved": moved,
                     "as_captured_us": a_us, "hoisted_us": b_us, "saved_per_gemm_us": (a_us - b_us) / REPEATS,
                     "bitwise_equal": same})
    print(f"CUDA runtime {edit.version}; {REPEATS} x (elementwise -> GEMM) per graph")
    print(tabulate([[f"{r['shape']}", r["memset_nodes"], r["moved"], f"{r['as_captured_us']:.1f}",
                     f"{r['hoisted_us']:.1f}", f"{r['saved_per_gemm_us']:.2f}", r["bitwise_equal"]] for r in rows],
                   headers=["GEMM [M, K, N]", "memset nodes", "hoisted", "as captured µs", "memsets hoisted µs",
                            "saved per GEMM µs", "== as captured"]))
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda_runtime": edit.version,
                   "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
