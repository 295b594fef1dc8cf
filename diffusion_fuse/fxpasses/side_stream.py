"""Runtime rewrite: run a block's small branch on a second CUDA stream, beside the large one.

Dual-stream DiT blocks (FLUX / FLUX.2 double blocks, SD3.5, Qwen-Image) carry the text tokens (512 rows at
1024²) beside the image tokens (4096 rows) through their own linears, norms and feed-forward; Wan's cross
attention projects its 512 context tokens beside 32k video tokens. A GEMM of 512 rows fills a fraction of an
H200's 132 SMs, and eager runs it after the image branch's GEMMs, alone. This pass puts that branch on a side
stream so that its kernels fill the SMs the image branch's kernels leave idle (their last waves).

Every kernel is the one the graph ran before, with the same inputs: only when it runs changes, so the result
is bitwise what the single-stream graph gives (the verifier still checks the rewritten graph end to end).
What the rewrite must get right is ordering and memory:

* which nodes: computing nodes whose output has more than ``VECTOR_ROWS`` rows (a per-sample vector such as
  a timestep embedding stays on the main stream) and at most the graph's largest GEMM row count divided by
  ``SMALL_FRACTION``, grouped into branches (connected through each other); a branch without a GEMM stays on
  the main stream (a few small kernels are not worth two synchronizations). Views and ``getitem`` follow
  the stream of the tensor they read. A graph with any op that writes in place stays on one stream.
* order: side nodes are moved to just after the last node they read (their relative order kept), so the host
  issues them before the main branch's next kernels.
* synchronization: the side stream first waits for the main stream (work queued before the graph); a side
  node that reads a main-stream tensor made after the last such wait waits for the main stream again (an
  event recorded there and then), and symmetrically; before the graph returns, the main stream waits for the
  side stream. Waits are for everything the other stream had queued at that point, so they are never late.
* memory: a tensor made on one stream and read on the other is marked with ``Tensor.record_stream`` for the
  reader's stream, so the caching allocator does not hand its memory out again before the reader ran.
  Outputs made on the side stream are marked for the main stream.
* the current stream is put back if the graph raises (``SideStreamGraph``).

Under CUDA graphs the side stream joins the capture through its first wait (fork) and is joined back by the
last one, the pattern ``torch.cuda.graphs`` documents; the graph then holds the two branches as parallel
paths. Applied to CUDA graphs on one device only, when ``options={"side_stream": True}``.

Measured on an H200 (BENCHMARKS.md, session 6): the FLUX-dev-sized stack's GPU time 11.95 ms with it, 11.99
without; FLUX.1-dev 132.3 / 132.0 ms per forward issued back to back. cuBLAS's GEMMs here are persistent
kernels that hold every SM until their last tile, which leaves the side stream little room; the host issues
more calls (record_stream, stream switches). Off by default for that reason.
"""

from __future__ import annotations

import copy
import dataclasses
import operator

import torch
import torch.fx as fx

from ..log import get_logger

aten = torch.ops.aten
_log = get_logger("side_stream")

SMALL_FRACTION = 4
VECTOR_ROWS = 16
GEMMS = {aten.linear.default, aten.addmm.default, aten.mm.default, aten.bmm.default, aten.baddbmm.default}
VIEWS = {aten.view.default, aten._unsafe_view.default, aten.t.default, aten.permute.default, aten.expand.default,
         aten.slice.Tensor, aten.select.int, aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int,
         aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
         aten.transpose.int, aten.alias.default, aten.chunk.default, aten.reshape.default, operator.getitem}


def _val(n):
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def _tensors(v) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors(x)]
    return []


def _rows(n: fx.Node) -> int | None:
    ts = _tensors(_val(n))
    if not ts or any(t.dim() < 2 for t in ts):
        return None
    try:
        return max(int(t.numel()) // max(int(t.shape[-1]), 1) for t in ts)
    except TypeError:  # symbolic sizes: left alone
        return None


def _cuda_device(gm: fx.GraphModule) -> torch.device | None:
    devs = {t.device for n in gm.graph.nodes for t in _tensors(_val(n))}
    if len(devs) != 1:
        return None
    dev = next(iter(devs))
    return dev if dev.type == "cuda" else None


def _writes_in_place(n: fx.Node) -> bool:
    schema = getattr(n.target, "_schema", None)
    return schema is not None and schema.is_mutable


def plan(gm: fx.GraphModule) -> set[fx.Node]:
    """The nodes to run on the side stream (empty: the graph stays on one stream)."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    if any(_writes_in_place(n) for n in calls):
        # e.g. AOTAutograd's copy_ into a mutated input at the end: a write the other stream could race with
        return set()
    gemm_rows = [r for n in calls if n.target in GEMMS and (r := _rows(n)) is not None]
    if not gemm_rows:
        return set()
    limit = max(gemm_rows) // SMALL_FRACTION
    # ATen and diffusion_fuse ops only (a Python callable's launches are unknown)
    small = {n for n in calls if n.target not in VIEWS and getattr(n.target, "_schema", None) is not None
             and (r := _rows(n)) is not None and VECTOR_ROWS < r <= limit}
    if not small:
        return set()
    # views of small nodes belong to them (same data); grow through chains of views
    side = set(small)
    for n in calls:
        if n.target in VIEWS and n.args and isinstance(n.args[0], fx.Node) and n.args[0] in side:
            side.add(n)
    # branches: connected components of side nodes; keep those with a GEMM
    parent = {n: n for n in side}

    def find(x):
        while parent[x] is not x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for n in side:
        for a in n.all_input_nodes:
            if a in side:
                parent[find(a)] = find(n)
    with_gemm = {find(n) for n in side if n.target in GEMMS}
    return {n for n in side if find(n) in with_gemm}


# --------------------------------------------------------------------------------------------------
# runtime helpers the rewritten graph calls
# --------------------------------------------------------------------------------------------------
_SIDE: dict[tuple[int, int], torch.cuda.Stream] = {}


@dataclasses.dataclass
class Streams:
    main: torch.cuda.Stream
    side: torch.cuda.Stream


def streams_begin(device_index: int) -> Streams:
    """The calling stream as the main one, a side stream that waits for it, and the main stream current."""
    main = torch.cuda.current_stream(device_index)
    key = (device_index, main.cuda_stream)
    side = _SIDE.get(key)
    if side is None:
        side = _SIDE[key] = torch.cuda.Stream(device_index)
    side.wait_stream(main)
    return Streams(main, side)


def use_side(s: Streams) -> None:
    torch.cuda.set_stream(s.side)


def use_main(s: Streams) -> None:
    torch.cuda.set_stream(s.main)


def side_waits_main(s: Streams) -> None:
    s.side.wait_stream(s.main)


def main_waits_side(s: Streams) -> None:
    s.main.wait_stream(s.side)


def record_on(s: Streams, stream_name: str, *values) -> None:
    stream = s.side if stream_name == "side" else s.main
    for t in _tensors(list(values)):
        t.record_stream(stream)


class SideStreamGraph:
    """Calls the rewritten graph; the calling stream is current again whatever happens inside."""

    def __init__(self, gm: fx.GraphModule, device_index: int) -> None:
        self.gm, self.device_index = gm, device_index

    def __call__(self, *args):
        main = torch.cuda.current_stream(self.device_index)
        try:
            return self.gm(*args)
        finally:
            torch.cuda.set_stream(main)


# --------------------------------------------------------------------------------------------------
# the rewrite
# --------------------------------------------------------------------------------------------------
def side_stream(gm: fx.GraphModule) -> tuple[fx.GraphModule, int, int]:
    """``gm`` with its small branches on a side stream, how many nodes moved there and the CUDA device's
    index; ``(gm, 0, -1)`` when none did (wrap the runnable graph in ``SideStreamGraph`` otherwise)."""
    dev = _cuda_device(gm)
    if dev is None:
        return gm, 0, -1
    side = plan(gm)
    if not side:
        return gm, 0, -1
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    nodes = list(gm.graph.nodes)
    on_side = side  # every other value is made on the main stream

    # order: main nodes as they were; each side node (their relative order kept) and each view (it launches
    # nothing) right after the last node it reads
    order: list[fx.Node] = []
    done: set[fx.Node] = set()
    pending = [n for n in nodes if n in on_side]
    views = [n for n in nodes if n not in on_side and n.op == "call_function" and n.target in VIEWS]
    k = 0

    def ready(n: fx.Node) -> bool:
        return all(a in done for a in n.all_input_nodes)

    def flush() -> None:
        nonlocal k, views
        progress = True
        while progress:
            progress = False
            for v in [v for v in views if ready(v)]:
                order.append(v)
                done.add(v)
                progress = True
            views = [v for v in views if v not in done]
            while k < len(pending) and ready(pending[k]):
                order.append(pending[k])
                done.add(pending[k])
                k += 1
                progress = True

    for n in nodes:
        if n in on_side or n in done or (n.op == "call_function" and n.target in VIEWS):
            continue
        if n.op == "output":
            flush()
            if k < len(pending) or views:
                raise RuntimeError("side stream: a node could not be scheduled")
        order.append(n)
        done.add(n)
        if n.op != "output":
            flush()

    graph = fx.Graph()
    graph._codegen = copy.deepcopy(gm.graph._codegen)
    env: dict[fx.Node, fx.Node] = {}
    state = None
    current = "main"
    # the position (in ``order``) of the last wait each stream made for the other
    synced = {"main": -1, "side": -1}
    made_at: dict[fx.Node, int] = {}
    recorded: set[tuple[fx.Node, str]] = set()
    last_side_work = -1
    moved = 0
    for i, n in enumerate(order):
        if n.op == "placeholder":
            env[n] = graph.node_copy(n, env.__getitem__)
            made_at[n] = -1
            continue
        if state is None:
            state = graph.call_function(streams_begin, (index,))
        want = "side" if n in on_side else "main"
        if n.op == "output":
            if last_side_work > synced["main"]:
                if current != "main":
                    graph.call_function(use_main, (state,))
                    current = "main"
                graph.call_function(main_waits_side, (state,))
            for a in n.all_input_nodes:
                if a in on_side:
                    graph.call_function(record_on, (state, "main", env[a]))
            env[n] = graph.node_copy(n, env.__getitem__)
            continue
        reads_other = [a for a in n.all_input_nodes if (a in on_side) != (want == "side") and a.op != "placeholder"]
        if any(made_at[a] > synced[want] for a in reads_other):
            # the other stream's tensors this node reads: wait for everything it has queued so far
            graph.call_function(side_waits_main if want == "side" else main_waits_side, (state,))
            synced[want] = i
        if want != current:
            graph.call_function(use_side if want == "side" else use_main, (state,))
            current = want
        env[n] = graph.node_copy(n, env.__getitem__)
        # a view's data is ready when its base's is
        made_at[n] = (made_at[n.args[0]] if n.target in VIEWS and isinstance(n.args[0], fx.Node)
                      and (n.args[0] in on_side) == (want == "side") else i)
        if want == "side":
            moved += 1
            last_side_work = i
        for a in n.all_input_nodes:
            if (a in on_side) != (want == "side") and (a, want) not in recorded:
                if n.target in VIEWS:
                    continue  # a view launches nothing: the reader of the view records
                recorded.add((a, want))
                graph.call_function(record_on, (state, want, env[a]))
    out = fx.GraphModule(gm, graph)
    out.meta.update(gm.meta)
    _log.info("side stream: %d nodes (%d GEMMs) of %d", moved, sum(n.target in GEMMS for n in on_side), len(nodes))
    return out, moved, index
