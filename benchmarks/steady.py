"""Steady-state kernel timing: the way a kernel runs inside a model, next to ``triton.testing.do_bench``.

``do_bench`` clears the L2 cache before every timed call by zeroing a 256 MB buffer. That leaves the L2 full
of the memset's dirty lines, and the timed kernel pays for writing them back to HBM: up to the L2's size
(50 MB on an H100/H200) of traffic that is not its own. For a kernel that moves 56 MB this is most of a second
kernel's worth of writes; for a 1 GB copy (the bandwidth the floor is computed from) it is noise. So a
do_bench time of a tens-of-µs kernel is not comparable with a floor taken from a large copy's bandwidth.

``steady_us`` measures instead what the large copy measures: calls issued back to back inside one CUDA graph
(no host launch cost, ~1 µs between kernels), cycling through enough distinct input sets that no input is
still in L2 when it is read again, and keeping every output alive so that each call writes fresh memory.
Each call then reads its inputs from HBM and its writes are written back once, as in a model where the
producer's output has left L2. Same method for eager, Inductor, ours and a copy of the same bytes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import torch

L2_CLEAR_BYTES = 1 << 28  # bytes of distinct inputs cycled through: 5x the L2 of an H100/H200


def clone_keep_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in new memory with the same sizes, strides and storage offset (strided slices stay strided)."""
    st = t.untyped_storage()
    new = torch.empty(st.nbytes(), dtype=torch.uint8, device=t.device)
    new.copy_(torch.empty(0, dtype=torch.uint8, device=t.device).set_(st))
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(new.untyped_storage(), t.storage_offset(),
                                                                t.size(), t.stride())


def input_sets(args: Sequence, bytes_per_call: int) -> list[tuple]:
    """``args`` and enough copies of its tensors that cycling through them reads ``L2_CLEAR_BYTES`` of distinct data.
    Workloads that move more than that per call need no copy (their own traffic evicts the L2)."""
    n = max(1, math.ceil(L2_CLEAR_BYTES / max(bytes_per_call, 1)))
    sets = [tuple(args)]
    for _ in range(n - 1):
        sets.append(tuple(clone_keep_layout(a) if isinstance(a, torch.Tensor) else a for a in args))
    return sets


def steady_us(calls: Sequence[Callable[[], object]], rounds: int = 4, replays: int = 15) -> float:
    """Median µs per call of ``calls`` (one per input set) run ``rounds`` times back to back in one CUDA graph.

    Every call is made once first (compiles, autotunes, Dynamo guards) and once more on a side stream, as graph
    capture needs. Outputs are kept until the graph is gone, so each call writes memory of its own.
    """
    for c in calls:
        c()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    keep: list[object] = []
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(rounds):
            for c in calls:
                keep.append(c())
    graph.replay()  # first replay uploads the graph
    torch.cuda.synchronize()
    n, times = rounds * len(calls), []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / n)
    del graph, keep
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write counted): the bandwidth the floors divide by."""
    from triton.testing import do_bench

    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * n / (do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median") * 1e-3)


def steady_copy_us(nbytes: int) -> float:
    """µs per device copy moving ``nbytes`` (half read, half written), timed as ``steady_us`` times kernels.

    Inside a CUDA graph ``copy_`` is a memcpy node, which runs slower than a copy kernel outside a graph, so this
    ceiling may be looser than an SM copy kernel's: ``steady_sm_copy_us``."""
    pairs = []
    for _ in range(max(1, math.ceil(L2_CLEAR_BYTES / max(nbytes, 1)))):
        a = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        pairs.append((a, torch.empty_like(a)))
    return steady_us([lambda a=a, b=b: b.copy_(a) for a, b in pairs])


def _sm_copy_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def sm_copy(src, dst, n, BLOCK: tl.constexpr):
        # int32 words, 16-byte vectors per thread: a plain streaming copy run on the SMs (not a memcpy node)
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=m, eviction_policy="evict_first"), mask=m)

    return sm_copy


SM_COPY_CONFIGS = ((1024, 4), (2048, 4), (4096, 8), (8192, 8))  # (int32 words per program, warps)


def steady_sm_copy_us(nbytes: int) -> dict[str, float]:
    """µs per SM copy kernel moving ``nbytes`` (half read, half written), timed as ``steady_us`` times kernels,
    for each of ``SM_COPY_CONFIGS``; ``best`` is the fastest (the ceiling a kernel of that size can reach)."""
    import triton

    kernel = _sm_copy_kernel()
    words = nbytes // 2 // 4
    pairs = []
    for _ in range(max(1, math.ceil(L2_CLEAR_BYTES / max(nbytes, 1)))):
        a = torch.empty(words, dtype=torch.int32, device="cuda")
        pairs.append((a, torch.empty_like(a)))
    out = {}
    for block, warps in SM_COPY_CONFIGS:
        grid = (triton.cdiv(words, block),)

        def call(a, b, block=block, warps=warps, grid=grid):
            kernel[grid](a, b, words, BLOCK=block, num_warps=warps)
            return b

        out[f"{block * 4 // 1024}KB/{warps}w"] = steady_us([lambda a=a, b=b: call(a, b) for a, b in pairs])
    out["best"] = min(out.values())
    return out


def timed_back_to_back(fn: Callable[[], object], calls: int) -> float:
    """ms per call when ``calls`` calls are issued back to back (no sync between them, as a denoising loop
    issues its steps): the host's work for a call overlaps the GPU's work on the previous one, so a call's
    host latency before its first kernel no longer counts."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / calls
