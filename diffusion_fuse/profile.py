"""The profile view: where a forward's time goes, eager, compiled by diffusion_fuse and compiled by Inductor.

    report = diffusion_fuse.profile(model, *args, **kwargs)   # -> ProfileReport
    print(report); report.save_html("profile.html"); report.to_dict()
    python -m diffusion_fuse profile --model flux             (a tiny model; or --script my_model.py [args])

Variants, each warmed up (``warmup`` calls: compile, the verifier's first call, CUDA graph recording), then
``forwards`` forwards under ``torch.profiler`` (CUDA activity on a GPU, CPU otherwise; shapes and memory recorded),
each forward in a ``diffusion_fuse.profile::forward`` scope that ends with a device synchronize:

- ``eager``: the model as it is;
- ``diffusion_fuse``: ``torch.compile(model, backend=DiffusionFuseBackend({..., "quality": "lossless"}))``;
- ``diffusion_fuse+cudagraphs``: the same with ``"cudagraphs": True`` (GPU only: CUDA graphs need one);
- ``inductor``: ``torch.compile(model)``, Inductor's default.

Time is device time on a GPU (each instant a kernel, copy or set runs counted once: overlapping streams are not
counted twice) and CPU time on the CPU. Classes:

- ``GEMM``, ``attention``, ``convolution``: the time under an ATen op of that kind (``aten::mm``,
  ``aten::scaled_dot_product_attention``, ``aten::convolution``...), counted under the outermost ATen op;
- ``ours: <family>``: everything that runs inside one of our ops' calls. The runtime graph calls our ops without
  the dispatcher (fxpasses/direct_calls.py), so while a profiler records each call is wrapped in a
  ``diffusion_fuse::<op>`` scope (lowering/profiling.py); the op's family comes from the sites of the compile
  (the report's pattern and op), else from ``patterns.REGISTRY`` (the family whose name starts the op's);
- ``eager ATen ops``: every other ATen op, per op (the outermost ATen op: ``aten::layer_norm``, not its
  ``native_layer_norm``) and per source line of the model;
- ``Inductor kernels``: Inductor's generated kernels (``triton_*``, ``cpp_*``), in the Inductor column;
- ``memcpy/memset``: the device's copy and set activities (those an op of ours, a GEMM, attention or convolution
  launches count for that op), under the ATen op that launched them if one did;
- ``other kernels``: device work under none of the above;
- ``host gaps``: on a GPU, the time the device idles between the forward's first and last kernel; on the CPU,
  the time the forward spends outside every op (Python, the graphs' own code).

The classes sum to the forward's total: its device span on a GPU, its wall time on the CPU. What no fusion took,
eager ATen ops and copies, is the headline share (``ProfileReport.eager_share``; the project's target is 5% of the
forward under CUDA graphs).

Source lines: the runtime graphs of the diffusion_fuse variants are compiled with torch's
``torch.fx.experimental._config.enrich_profiler_metadata``: each graph node runs in a ``## <index> ##`` scope inside
its graph's ``## <file> ##`` scope, and ``torch.fx.traceback`` keeps each node's stack trace, whose innermost frame
is the line reported. (The profiler's own ``with_stack`` records Python frames at function granularity only, the
line where each function starts, so it cannot name the line an op came from.)

Launching op: a kernel's CUDA runtime call (same correlation id) gives its host time; the deepest profiler event
open then, below the op the profiler links the kernel to, is where the kernel comes from (a graph node's scope, or
one of our ops' ranges, which the profiler links kernels to as it does Inductor's kernel markers). A CUDA graph
replay launches its kernels from ``cudaGraphLaunch``, with no op around them: they are matched one by one to the
kernels of the ``diffusion_fuse`` run (the same graphs, without CUDA graphs) by kernel name sequence (``difflib``),
and take their class, op and floor from there; kernels that find no match take the class their name has there, else
``other``.

HBM floor, for our families, eager ATen ops and copies: bytes that must move over the bandwidth of one large
device-to-device copy (on the CPU: a large memcpy), measured once per run. An op's bytes: the storage each tensor
argument spans (a broadcast input counts what it touches) plus what it writes: its outputs (the allocations it
makes and keeps, recorded with ``profile_memory``), or, for an in-place op, its first argument; views move
nothing. Our ops' bytes are their arguments' and outputs' spans, counted by the scope. A source line's floor is
that of its ops fused: inputs from outside the line read once, outputs the rest of the forward keeps (not freed
before the next op, or read by an op of another line) written once; what stays between the line's ops moves
nothing. A class's floor is the sum of its ops' floors (each op on its own). Compute-bound classes (GEMM,
attention, convolution) get none: their floor is compute, not bytes; nor does a family whose op runs a GEMM
(``OpSpec.compute_bound``: linear_cat writes its GEMMs' outputs into a ``cat``), which is sorted with them.

Inductor column: Inductor is compiled with ``torch._inductor.config.trace.provenance_tracking_level = 1``, which
records each generated kernel's source stack traces (``torch._dynamo.utils.get_compilation_metrics()``'s
``inductor_provenance``), and ``cpp.enable_kernel_profile`` (CPU kernels get profiler scopes). For each source
line with eager ops left, the Inductor kernels whose stack traces include that line, and their time. A kernel
that fuses several lines is listed (with its whole time) under each. Kernel names are matched without the
``graph_<n>_`` prefix and the provenance handle: two graphs' kernels of the same name share their lines.

Sorted by what would pay: the time above the floor (host gaps: all of it), then the compute classes by time.

The profiler's own cost per op is host time: host gaps without CUDA graphs are larger than in an unprofiled run;
under CUDA graphs (no host work per kernel) they are not. ``profile`` compiles the model three or four times and
leaves those compiled copies' code cached in Dynamo (one more entry per backend on the model's frames).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import difflib
import json
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from tabulate import tabulate

from .log import error_message, get_logger

_log = get_logger("verify")

FORWARD_SCOPE = "diffusion_fuse.profile::forward"
OUR_PREFIX = "diffusion_fuse::"

EAGER, INDUCTOR, MEMCPY, OTHER, HOST = "eager ATen ops", "Inductor kernels", "memcpy/memset", "other kernels", \
    "host gaps"
GEMM, ATTENTION, CONVOLUTION = "GEMM", "attention", "convolution"
COMPUTE = (GEMM, ATTENTION, CONVOLUTION)
LEFT = (EAGER, MEMCPY)  # what no fusion took: the acceptance's "eager ops left unfused"
OURS = "ours: "

V_EAGER, V_OURS, V_OURS_CG, V_INDUCTOR = "eager", "diffusion_fuse", "diffusion_fuse+cudagraphs", "inductor"

# ATen ops by kind (ATen's names, not the project's)
_GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv", "dot", "vdot",
                       "_scaled_mm", "_int_mm", "_addmm_activation", "_scaled_grouped_mm", "_grouped_mm"})
_CONV_RE = re.compile(r"convolution|conv\d|conv_transpose|conv_tbc|slow_conv")
_INDUCTOR_KERNEL_RE = re.compile(r"^(?:graph_\d+_)?((?:triton|cpp)_[a-z]+_\w+)$")
_RUNTIME_RE = re.compile(r"^(?:cuda|cu|hip)[A-Z]\w*$")
_NODE_SCOPE_RE = re.compile(r"^## (\d+) ##$")
_GRAPH_SCOPE_RE = re.compile(r"^## (.+\.py) ##$")
_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n([^\n]*)')
_OVERWRITE_OPS = frozenset({"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_",
                            "exponential_", "set_", "resize_"})


def _is_copy(device_event: str) -> bool:
    return device_event.startswith(("Memcpy", "Memset"))


def _compute_class(op: str) -> str | None:
    if op in _GEMM_OPS:
        return GEMM
    if "attention" in op:
        return ATTENTION
    if _CONV_RE.search(op):
        return CONVOLUTION
    return None


# ------------------------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ClassRow:
    """One class: ms per forward per variant, its ops' calls per forward, the primary variant's HBM floor."""

    name: str
    kind: str  # compute | ours | eager | copy | inductor | other | host
    ms: dict[str, float]
    calls: dict[str, float] = dataclasses.field(default_factory=dict)
    floor_ms: float | None = None  # None: no bytes floor (compute-bound, or bytes unknown)

    def above_floor(self, variant: str) -> float | None:
        if self.kind == "host":
            return self.ms.get(variant, 0.0)
        if self.floor_ms is None:
            return None
        return max(0.0, self.ms.get(variant, 0.0) - self.floor_ms)


@dataclasses.dataclass
class OpRow:
    """An eager ATen op left unfused, over every source line."""

    op: str
    calls: float  # per forward
    ms: float
    floor_ms: float

    @property
    def above_floor_ms(self) -> float:
        return max(0.0, self.ms - self.floor_ms)


@dataclasses.dataclass
class LineRow:
    """The eager ATen ops left on one source line, and what Inductor made of that line."""

    location: str  # path:line (function)
    code: str
    ops: dict[str, float]  # op -> calls per forward
    ms: float
    floor_ms: float  # the line's ops fused
    inductor: list[tuple[str, float]] = dataclasses.field(default_factory=list)  # (kernel, ms per forward)
    inductor_ms: float | None = None  # None: no Inductor kernel carries this line

    @property
    def above_floor_ms(self) -> float:
        return max(0.0, self.ms - self.floor_ms)


@dataclasses.dataclass
class ProfileReport:
    """What ``diffusion_fuse.profile`` measured. Times are ms per forward (device time on a GPU, CPU time on the
    CPU); ``primary`` is the variant the floors, shares and sorting refer to (diffusion_fuse with CUDA graphs on a
    GPU, diffusion_fuse on the CPU); ``detail`` is the variant the per-op and per-line tables come from
    (diffusion_fuse without CUDA graphs, whose every kernel has its launching op)."""

    device: str
    time_kind: str  # "GPU" | "CPU"
    forwards: int
    variants: list[str]
    primary: str
    detail: str
    totals_ms: dict[str, float]
    classes: list[ClassRow]
    eager_ops: list[OpRow]
    lines: list[LineRow]
    copy_bandwidth: float  # bytes per second (read + write) of the large copy the floors use
    sites: dict[str, int] = dataclasses.field(default_factory=dict)  # family -> sites the verifier kept
    notes: list[str] = dataclasses.field(default_factory=list)

    # --- queries -------------------------------------------------------------------------------------------------
    def row(self, name: str) -> ClassRow | None:
        return next((r for r in self.classes if r.name == name), None)

    def eager_share(self, variant: str | None = None) -> float:
        """The fraction of ``variant``'s (default: the primary's) forward spent in eager ATen ops and copies left
        unfused: neither GEMM, attention, convolution nor one of our ops."""
        v = variant or self.primary
        total = self.totals_ms.get(v, 0.0)
        left = sum(r.ms.get(v, 0.0) for r in self.classes if r.name in LEFT)
        return left / total if total > 0 else 0.0

    def families(self) -> list[str]:
        return [r.name[len(OURS):] for r in self.classes if r.kind == "ours"]

    # --- rendering -----------------------------------------------------------------------------------------------
    def class_table(self) -> str:
        headers = ["class"] + [f"{v} ms" for v in self.variants] + ["floor ms", "above floor ms", f"% {self.primary}"]
        total = self.totals_ms.get(self.primary, 0.0)
        rows = []
        for r in self.classes:
            above = r.above_floor(self.primary)
            share = 100.0 * r.ms.get(self.primary, 0.0) / total if total else 0.0
            rows.append([r.name] + [_ms(r.ms.get(v)) for v in self.variants]
                        + [_ms(r.floor_ms), _ms(above), f"{share:.1f}"])
        rows.append(["(total)"] + [_ms(self.totals_ms.get(v)) for v in self.variants] + ["", "", "100.0"])
        return tabulate(rows, headers=headers, disable_numparse=True,
                        colalign=("left",) + ("right",) * (len(headers) - 1))

    def ops_table(self, limit: int | None = 20) -> str:
        rows = [[o.op, f"{o.calls:g}", _ms(o.ms), _ms(o.floor_ms), _ms(o.above_floor_ms)]
                for o in self.eager_ops[:limit]]
        return tabulate(rows, headers=["eager ATen op", "calls", "ms", "floor ms", "above floor ms"],
                        disable_numparse=True, colalign=("left", "right", "right", "right", "right"))

    def lines_table(self, limit: int | None = 15) -> str:
        rows = []
        for ln in self.lines[:limit]:
            ind = ", ".join(f"{_short(k, 36)} {_ms(t)}" for k, t in ln.inductor[:2])
            ind += f" (+{len(ln.inductor) - 2} more)" if len(ln.inductor) > 2 else ""
            rows.append([ln.location, ln.code, " ".join(f"{op}×{n:g}" for op, n in ln.ops.items()), _ms(ln.ms),
                         _ms(ln.floor_ms), _ms(ln.above_floor_ms), _ms(ln.inductor_ms), ind or "(none)"])
        return tabulate(rows, headers=["source line", "code", "eager ATen ops", "ms", "floor ms", "above floor ms",
                                       "inductor ms", "Inductor kernels (ms)"],
                        maxcolwidths=[36, 36, 30, None, None, None, None, 44], disable_numparse=True)

    def headline(self) -> str:
        return (f"eager ATen ops and copies left unfused (not GEMM, attention, convolution or ours): "
                f"{100 * self.eager_share():.1f}% of the {self.primary} forward's {self.time_kind} time "
                f"(target ≤ 5%)")

    def table(self) -> str:
        head = (f"diffusion_fuse profile: {self.device}, {self.forwards} forward(s) per variant, {self.time_kind} "
                f"time in ms per forward; floors at {self.copy_bandwidth / 1e9:.1f} GB/s (one large copy, read + "
                f"write); sorted by time above the floor on {self.primary}")
        out = [head, "", self.class_table(), "", self.headline()]
        if self.eager_ops:
            out += ["", f"eager ATen ops left by {self.detail}, per op:", self.ops_table()]
        if self.lines:
            out += ["", (f"eager ATen ops left by {self.detail}, per source line (floor: the line's ops fused), "
                         "and Inductor's kernels for the same line:"), self.lines_table()]
        if self.notes:
            out += [""] + [f"note: {n}" for n in self.notes]
        return "\n".join(out)

    __str__ = table

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["eager_share"] = self.eager_share()
        for r, rd in zip(self.classes, d["classes"]):
            rd["above_floor_ms"] = r.above_floor(self.primary)
        return d

    def save(self, path: str) -> None:
        """``.json``: ``to_dict``; ``.html``/``.htm``: ``save_html``; anything else: ``table``."""
        if path.endswith((".html", ".htm")):
            self.save_html(path)
            return
        text = json.dumps(self.to_dict(), indent=2) if path.endswith(".json") else self.table()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")

    def to_html(self, title: str = "diffusion_fuse profile") -> str:
        return _render_html(self, title)

    def save_html(self, path: str, title: str = "diffusion_fuse profile") -> None:
        """One self-contained HTML file: the class table as bars (one per class and variant), then the tables."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_html(title))


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v:.3f}"


def _short(name: str, n: int) -> str:
    """``name`` in at most ``n`` characters: its start and its end (an Inductor kernel's name lists every op)."""
    return name if len(name) <= n else name[:n - 13] + "…" + name[-12:]


# ------------------------------------------------------------------------------------------------------------------
# the profiler's event tree
# ------------------------------------------------------------------------------------------------------------------
_TORCH_OP = torch._C._profiler._EventType.TorchOp
_ALLOCATION = torch._C._profiler._EventType.Allocation


@dataclasses.dataclass
class _IO:
    """What one op instance reads, makes and writes (by the profiler's allocation ids), in bytes."""

    reads: dict[Any, int] = dataclasses.field(default_factory=dict)
    produced: dict[Any, int] = dataclasses.field(default_factory=dict)  # allocations made and kept
    written: dict[Any, int] = dataclasses.field(default_factory=dict)  # in-place targets


@dataclasses.dataclass
class _Inst:
    """One op instance of one forward: what its time and bytes are counted under."""

    cls: str
    name: str
    fwd: int
    ev: Any = None  # the attributing profiler event (None: a device event under no op)
    ns: int = 0
    start: int = 0
    end: int = 0
    location: str = ""
    code: str = ""
    nbytes: int | None = None  # the op's own floor bytes
    io: _IO | None = None


def _tensor_span(t: Any) -> int:
    sizes, strides = list(t.sizes), list(t.strides)
    if any(s == 0 for s in sizes):
        return 0
    n = 1
    for s in sizes:
        n *= s
    span = 1 + sum((s - 1) * abs(st) for s, st in zip(sizes, strides)) if len(strides) == len(sizes) else n
    try:
        item = t.dtype.itemsize
    except Exception:  # noqa: BLE001 - an exotic dtype: count one byte an element
        item = 1
    return min(n, span) * item


def _tensors(inputs: Iterable[Any]) -> Iterable[Any]:
    for v in inputs:
        if isinstance(v, list):
            yield from (x for x in v if hasattr(x, "sizes"))
        elif hasattr(v, "sizes") and hasattr(v, "allocation_id"):
            yield v


def _tensor_key(t: Any) -> Any:
    aid = getattr(t, "allocation_id", None)
    return ("a", aid) if aid is not None else ("p", t.storage_data_ptr)


class _Tree:
    """The profiler's event tree, indexed: forward scopes, TorchOps by correlation id, sorted children."""

    def __init__(self, roots: list[Any]) -> None:
        self.forwards: list[Any] = []
        self.by_corr: dict[int, Any] = {}
        self._kids: dict[int, tuple[list[int], list[Any]]] = {}
        stack = list(roots)
        while stack:
            e = stack.pop()
            if e.tag == _TORCH_OP:
                self.by_corr.setdefault(e.correlation_id, e)
                if e.name == FORWARD_SCOPE:
                    self.forwards.append(e)
            stack.extend(e.children)
        self.forwards.sort(key=lambda e: e.start_time_ns)
        self._fwd_starts = [e.start_time_ns for e in self.forwards]

    def forward_at(self, t: int) -> int | None:
        i = bisect.bisect_right(self._fwd_starts, t) - 1
        if i >= 0 and t <= self.forwards[i].end_time_ns:
            return i
        return None

    def forward_of(self, e: Any) -> int | None:
        while e is not None:
            if e.tag == _TORCH_OP and e.name == FORWARD_SCOPE:
                return self.forward_at(e.start_time_ns)
            e = e.parent
        return None

    def kids(self, e: Any) -> tuple[list[int], list[Any]]:
        got = self._kids.get(e.id)
        if got is None:
            ks = sorted((c for c in e.children if c.tag != _ALLOCATION), key=lambda c: c.start_time_ns)
            got = ([c.start_time_ns for c in ks], ks)
            self._kids[e.id] = got
        return got

    def deepest(self, e: Any, t: int) -> Any:
        """The deepest event below ``e`` (or ``e``) open at time ``t``."""
        while True:
            starts, ks = self.kids(e)
            i = bisect.bisect_right(starts, t) - 1
            if i < 0 or ks[i].end_time_ns < t:
                return e
            e = ks[i]


def _chain(e: Any, stop: Any) -> list[Any]:
    """TorchOps from ``e`` up to (not including) ``stop``, innermost first."""
    out = []
    while e is not None and e.id != stop.id:
        if e.tag == _TORCH_OP:
            out.append(e)
        e = e.parent
    return out


def _classify(chain: list[Any]) -> tuple[str | None, str, Any]:
    """(class, name, attributing event) of work done under ``chain`` (innermost first); (None, "", None): none."""
    ours = ind = outer_aten = None
    compute = None
    for e in chain:  # innermost first: the last match is the outermost
        n = e.name
        if n.startswith(OUR_PREFIX):
            ours = e
        elif _INDUCTOR_KERNEL_RE.match(n):
            ind = e
        elif n.startswith("aten::"):
            outer_aten = e
            compute = _compute_class(n[6:]) or compute
    if ours is not None:
        return "ours", ours.name[len(OUR_PREFIX):], ours
    if ind is not None:
        return INDUCTOR, _INDUCTOR_KERNEL_RE.match(ind.name).group(1), ind
    if outer_aten is not None:
        return (compute or EAGER), outer_aten.name[6:], outer_aten
    return None, "", None


def _io(e: Any, ours: bool) -> _IO:
    """What op event ``e`` reads, makes and writes (for ours on the CPU: what its reference path's ops read)."""
    io = _IO()
    made: set[Any] = set()
    freed: set[Any] = set()
    tensors_in: list[Any] = []
    stack = [e]
    while stack:
        x = stack.pop()
        if x.tag == _ALLOCATION:
            f = x.extra_fields
            key = ("a", f.allocation_id)
            if f.alloc_size > 0:
                made.add(key)
                io.produced[key] = io.produced.get(key, 0) + f.alloc_size
            else:
                freed.add(key)
        elif x.tag == _TORCH_OP and (x.id == e.id or (ours and x.name.startswith("aten::"))):
            tensors_in.extend(_tensors(getattr(x.extra_fields, "inputs", None) or []))
        stack.extend(x.children)
    for k in freed:
        io.produced.pop(k, None)
    name = e.name[6:] if e.name.startswith("aten::") else ""
    inplace = None
    if name.endswith("_"):
        inplace = next(iter(_tensors(getattr(e.extra_fields, "inputs", None) or [])), None)
        if inplace is not None:
            io.written[_tensor_key(inplace)] = _tensor_span(inplace)
    if not ours and not io.produced and inplace is None:
        return io  # a view (or an op that moves nothing the profiler can see)
    skip = _tensor_key(inplace) if inplace is not None and name in _OVERWRITE_OPS else None  # not read, only written
    for t in tensors_in:
        k = _tensor_key(t)
        if k == skip:
            continue
        if k not in made:
            io.reads[k] = max(io.reads.get(k, 0), _tensor_span(t))
    return io


class _ForwardCtx:
    """Per forward: when each allocation is freed, who reads it, where each op instance starts (group floors)."""

    def __init__(self, end: int) -> None:
        self.end = end
        self.freed_at: dict[Any, int] = {}
        self.readers: dict[Any, set[int]] = collections.defaultdict(set)
        self.starts: list[tuple[int, int]] = []  # (start, id(inst))

    def group_bytes(self, members: list[_Inst]) -> int:
        ids = {id(m) for m in members}
        produced: dict[Any, int] = {}
        written: dict[Any, int] = {}
        for m in members:
            if m.io is not None:
                produced.update(m.io.produced)
                written.update(m.io.written)
        reads: dict[Any, int] = {}
        for m in members:
            if m.io is not None:
                for k, b in m.io.reads.items():
                    if k not in produced:
                        reads[k] = max(reads.get(k, 0), b)
        last = max(m.end for m in members)
        boundary = self.end
        i = bisect.bisect_left(self.starts, (last, -1))
        while i < len(self.starts):
            if self.starts[i][1] not in ids:
                boundary = self.starts[i][0]
                break
            i += 1
        out = 0
        for k, b in produced.items():
            t = self.freed_at.get(k)
            if t is None or t > boundary or (self.readers.get(k, set()) - ids):
                out += b
        return sum(reads.values()) + out + sum(written.values())


# ------------------------------------------------------------------------------------------------------------------
# one variant's trace
# ------------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Trace:
    forwards: int
    totals_ns: list[int]
    insts: list[_Inst]
    host_ns: int
    device_seq: list[list[tuple[str, _Inst | None, int]]]  # per forward: device events in order (name, op, ns)
    notes: list[str]
    ctxs: list[_ForwardCtx]


def _node_location(e: Any, registry: dict[str, Any]) -> tuple[str, str]:
    """The source line of the graph node whose scope encloses ``e``, from the FX metadata registry."""
    idx = None
    while e is not None:
        if e.tag == _TORCH_OP:
            if idx is None:
                m = _NODE_SCOPE_RE.match(e.name)
                if m:
                    idx = int(m.group(1))
            else:
                m = _GRAPH_SCOPE_RE.match(e.name)
                if m:
                    meta = registry.get(m.group(1))
                    node = (meta or {}).get("node_metadata", {}).get(idx) if meta else None
                    trace = (node or {}).get("stack_trace") or ""
                    return _innermost_frame(trace) if trace else ("(graph node without a stack trace)", "")
        e = e.parent
    return "(outside the compiled graphs)", ""


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    parts = path.split("/")
    return "/".join(parts[-3:]) if len(parts) > 3 else path


def _innermost_frame(stack_trace: str) -> tuple[str, str]:
    frames = _FRAME_RE.findall(stack_trace)
    if not frames:
        return "(no source line)", ""
    path, line, fn, code = frames[-1]
    return f"{_short_path(path)}:{line} ({fn})", code.strip()


def _analyze(kr: Any, cuda: bool, family_of: Callable[[str], str], records: list[tuple[str, int, int]] | None,
             registry: dict[str, Any]) -> _Trace:
    tree = _Tree(kr.experimental_event_tree())
    notes: list[str] = []
    nf = len(tree.forwards)
    insts: dict[Any, _Inst] = {}

    def inst_for(fwd: int, chain: list[Any], name: str, copy: bool = False) -> _Inst | None:
        """The op instance work under ``chain`` counts for (None: under no op); ``copy``: a device copy or set,
        its own instance (its bytes those of its launching op) unless one of our ops or a GEMM, attention or
        convolution launched it (then it is part of that op's time)."""
        cls, op, ev = _classify(chain)
        if cls == "ours":
            cls = OURS + family_of(op)
        copy = copy and (cls is None or cls == EAGER)
        if copy:
            cls, op, key = MEMCPY, (op or name), ("copy", ev.id if ev is not None else (fwd, name))
        if cls is None:
            return None
        if not copy:
            key = ev.id
        inst = insts.get(key)
        if inst is None:
            inst = insts[key] = _Inst(cls=cls, name=op, fwd=fwd, ev=ev, start=ev.start_time_ns if ev else 0,
                                      end=ev.end_time_ns if ev else 0)
        return inst

    totals = [0] * nf
    host = 0
    device_seq: list[list[tuple[str, _Inst | None, int]]] = [[] for _ in range(nf)]
    if not cuda:
        for fi, fwd in enumerate(tree.forwards):
            totals[fi] = fwd.duration_time_ns
            excl = {fwd.id: fwd.duration_time_ns}
            event_of: dict[int, Any] = {}
            stack = [(c, fwd) for c in fwd.children]
            while stack:
                e, owner = stack.pop()
                if e.tag == _TORCH_OP:
                    excl[owner.id] = excl.get(owner.id, 0) - e.duration_time_ns
                    excl[e.id] = excl.get(e.id, 0) + e.duration_time_ns
                    event_of[e.id] = e
                    owner = e
                stack.extend((c, owner) for c in e.children)
            host += max(0, excl.pop(fwd.id))
            for eid, ns in excl.items():
                inst = inst_for(fi, _chain(event_of[eid], fwd), event_of[eid].name)
                if inst is None:
                    host += max(0, ns)
                else:
                    inst.ns += max(0, ns)
    else:
        from torch.autograd import DeviceType

        events = kr.events()
        runtime = {e.correlation_id(): e for e in events
                   if e.device_type() == DeviceType.CPU and _RUNTIME_RE.match(e.name())}
        fwd_of_linked: dict[int, int | None] = {}
        per_fwd: list[list[tuple[int, int, str, _Inst | None]]] = [[] for _ in range(nf)]
        unplaced = outside = 0
        for d in events:
            if d.device_type() != DeviceType.CUDA:
                continue
            r = runtime.get(d.correlation_id())
            t = r.start_ns() if r is not None else None
            lid = d.linked_correlation_id()
            linked = tree.by_corr.get(lid) if lid else None
            if linked is not None and lid not in fwd_of_linked:
                fwd_of_linked[lid] = tree.forward_of(linked)
            fi = fwd_of_linked.get(lid) if linked is not None else None
            if fi is None and t is not None:
                fi = tree.forward_at(t)
                linked = None
            if fi is None:
                unplaced += 1
                continue
            fwd = tree.forwards[fi]
            if linked is not None and t is not None and not linked.start_time_ns <= t <= linked.end_time_ns:
                outside += 1  # the launch's host time is not inside its linked op: the clocks disagree
            start = linked if linked is not None else fwd
            deep = tree.deepest(start, t) if t is not None else start
            name = d.name()
            inst = inst_for(fi, _chain(deep, fwd), name, copy=_is_copy(name))
            per_fwd[fi].append((d.start_ns(), d.end_ns(), name, inst))
        if unplaced:
            notes.append(f"{unplaced} device event(s) outside the profiled forwards left out")
        if outside:
            notes.append(f"{outside} launch(es) whose CUDA runtime call lies outside its linked op: those kernels "
                         "are placed under the linked op, without the scopes inside it")
        for fi, evs in enumerate(per_fwd):
            if not evs:
                continue
            evs.sort(key=lambda x: x[0])
            covered = first = evs[0][0]
            busy = 0
            for s, e, name, inst in evs:
                ns = max(0, e - max(s, covered))
                covered = max(covered, e)
                busy += ns
                device_seq[fi].append((name, inst if inst is not None and inst.ev is not None else None, ns))
                if inst is None:
                    inst = insts.setdefault(("none", fi, name), _Inst(cls=OTHER, name=name, fwd=fi))
                inst.ns += ns
            totals[fi] = covered - first
            host += totals[fi] - busy
    # bytes: our ops from the scopes' records, the rest from the tree
    ours = sorted((i for i in insts.values() if i.cls.startswith(OURS) and i.ev is not None), key=lambda i: i.start)
    if records is not None and ours:
        by_op: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        for op, rb, wb in records:
            by_op[op].append(rb + wb)
        counts = collections.Counter(i.name for i in ours)
        if all(len(by_op[op]) == n for op, n in counts.items()):
            for i in ours:
                i.nbytes = by_op[i.name].popleft()
        else:
            notes.append("our ops' calls and their profiler scopes differ in number: their floors come from the "
                         "profiler's shapes instead")
    ctxs = [_ForwardCtx(f.end_time_ns) for f in tree.forwards]
    for fi, fwd in enumerate(tree.forwards):
        stack = [fwd]
        while stack:
            x = stack.pop()
            if x.tag == _ALLOCATION and x.extra_fields.alloc_size < 0:
                ctxs[fi].freed_at[("a", x.extra_fields.allocation_id)] = x.start_time_ns
            stack.extend(x.children)
    for inst in insts.values():
        if inst.ev is None:
            continue
        inst.io = _io(inst.ev, inst.cls.startswith(OURS))
        if inst.cls in LEFT:
            inst.location, inst.code = _node_location(inst.ev.parent, registry)
        ctx = ctxs[inst.fwd]
        ctx.starts.append((inst.start, id(inst)))
        for k in inst.io.reads:
            ctx.readers[k].add(id(inst))
    for ctx in ctxs:
        ctx.starts.sort()
    for inst in insts.values():
        if inst.ev is not None and inst.nbytes is None and inst.cls != INDUCTOR and inst.cls not in COMPUTE:
            inst.nbytes = ctxs[inst.fwd].group_bytes([inst])
    return _Trace(forwards=nf, totals_ns=totals, insts=list(insts.values()), host_ns=host, device_seq=device_seq,
                  notes=notes, ctxs=ctxs)


def _align_cudagraph(trace: _Trace, template: _Trace) -> None:
    """Give the kernels a CUDA graph replay launched (no op around them) the class, op and bytes of the same kernel
    in ``template`` (the run without CUDA graphs), matched by kernel name sequence; by name alone where the sequence
    does not match."""
    if not template.device_seq or not template.device_seq[0]:
        return
    ref = template.device_seq[0]
    ref_names = [n for n, _, _ in ref]
    by_name: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for n, inst, _ in ref:
        if inst is not None:
            by_name[n][(inst.cls, inst.name)] += 1
    trace.insts = [i for i in trace.insts if i.ev is not None]  # the loose ones are placed again below
    new: dict[Any, _Inst] = {}
    matched = total = 0
    for fi, seq in enumerate(trace.device_seq):
        loose = [(name, ns) for name, inst, ns in seq if inst is None]
        total += len(loose)
        sm = difflib.SequenceMatcher(None, ref_names, [n for n, _ in loose], autojunk=False)
        assigned: dict[int, _Inst] = {}
        for a, b, size in sm.get_matching_blocks():
            for k in range(size):
                tmpl = ref[a + k][1]
                if tmpl is not None:
                    assigned[b + k] = tmpl
        for j, (name, ns) in enumerate(loose):
            tmpl = assigned.get(j)
            if tmpl is not None:
                matched += 1
                key: Any = (fi, id(tmpl))
                if key not in new:
                    new[key] = _Inst(cls=tmpl.cls, name=tmpl.name, fwd=fi, location=tmpl.location, code=tmpl.code,
                                     nbytes=tmpl.nbytes)
            else:
                guess = by_name.get(name)
                cls, op = guess.most_common(1)[0][0] if guess else (MEMCPY if _is_copy(name) else OTHER, name)
                key = (fi, "name", cls, op)
                if key not in new:
                    new[key] = _Inst(cls=cls, name=op, fwd=fi)
            new[key].ns += ns
    trace.insts += list(new.values())
    if total:
        trace.notes.append(f"CUDA graph replay: {matched} of {total} kernels matched to the run without CUDA graphs "
                           "by kernel sequence; the rest classed by kernel name")


# ------------------------------------------------------------------------------------------------------------------
# running the variants
# ------------------------------------------------------------------------------------------------------------------
def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second (read + write) of the best of a few copies of one large buffer on ``device``."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        n = int(min(1 << 30, max(1 << 24, free // 8)))
    else:
        n = 1 << 27
    src = torch.empty(n, dtype=torch.uint8, device=device)
    src.fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(5):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t)
    return 2 * n / best


def _device_of(model: torch.nn.Module, args: tuple, kwargs: dict) -> torch.device:
    for t in list(args) + list(kwargs.values()):
        if isinstance(t, torch.Tensor):
            return t.device
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _profile_forwards(fn: Callable[[], Any], cuda: bool, forwards: int, collect: bool
                      ) -> tuple[Any, list[tuple[str, int, int]] | None]:
    from torch.profiler import ProfilerActivity, record_function

    from .lowering import profiling

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if collect:
        profiling.records = []
    try:
        with torch.profiler.profile(activities=acts, record_shapes=True, profile_memory=True) as prof:
            for _ in range(forwards):
                with record_function(FORWARD_SCOPE):
                    out = fn()
                    if cuda:
                        torch.cuda.synchronize()
                del out
        records = profiling.records
    finally:
        profiling.records = None
    return prof.profiler.kineto_results, records


def _inductor_lines(metrics: list[Any]) -> dict[str, set[str]]:
    """Inductor kernel name -> the source lines (``path:line (function)``) its provenance names."""
    out: dict[str, set[str]] = collections.defaultdict(set)
    for m in metrics:
        for blob in getattr(m, "inductor_provenance", None) or ():
            try:
                table = json.loads(blob)
            except (TypeError, ValueError):
                continue
            for key, traces in table.items():
                name = key.rsplit(":", 1)[0]
                if not _INDUCTOR_KERNEL_RE.match(name):
                    continue  # an extern kernel (cuBLAS, attention): not a kernel Inductor generated
                for tr in traces or ():
                    loc, _ = _innermost_frame(tr)
                    out[name].add(loc)
    return out


_RECENT: list[ProfileReport] = []  # every report profile() made in this process (the CLI's --script reads them)


def profile(model: torch.nn.Module, *args: Any, options: dict[str, Any] | None = None, forwards: int = 3,
            warmup: int = 3, **kwargs: Any) -> ProfileReport:
    """Profile ``model(*args, **kwargs)``: eager, compiled by diffusion_fuse (lossless; with and without CUDA graphs
    on a GPU) and compiled by Inductor; where each variant's time goes, per class (module docstring).

    ``options``: the diffusion_fuse options (``quality`` is lossless; ``cudagraphs`` is set per variant).
    ``forwards``: profiled forwards per variant (the report gives their mean). ``warmup``: calls before profiling
    (at least 3 with CUDA graphs: verification, warm-up, recording). Runs under ``torch.no_grad()``.
    """
    import torch._dynamo.utils as dynamo_utils
    import torch._inductor.config as inductor_config
    import torch.fx.experimental._config as fx_config
    from torch.fx.traceback import _FX_METADATA_REGISTRY

    from . import DiffusionFuseBackend, Report
    from .patterns import REGISTRY

    base = getattr(model, "_orig_mod", model)
    device = _device_of(base, args, kwargs)
    cuda = device.type == "cuda"
    forwards, warmup = max(1, int(forwards)), max(1 if not cuda else 3, int(warmup))
    notes: list[str] = []
    report, report_cg = Report(), Report()  # the compiles without and with CUDA graphs
    op_family: dict[str, str] = {}
    families = sorted(REGISTRY.names(), key=len, reverse=True)

    def family_of(op: str) -> str:
        fam = op_family.get(op)
        if fam is None:
            op_family.update({s.after.split("::")[-1]: s.pattern for s in report.sites() + report_cg.sites()})
            fam = op_family.get(op) or next((f for f in families if op.startswith(f)), op)
            op_family[op] = fam
        return fam

    def call(fn: Callable[..., Any]) -> Callable[[], Any]:
        return lambda: fn(*args, **kwargs)

    opts = {k: v for k, v in (options or {}).items() if k not in ("quality", "cudagraphs", "mode")}
    variants: list[tuple[str, Callable[[], Callable[..., Any]], Callable[[], Any] | None]] = [
        (V_EAGER, lambda: base, None)]
    def fx_patch() -> Any:
        return fx_config.patch(enrich_profiler_metadata=True)

    variants.append((V_OURS, lambda: torch.compile(base, backend=DiffusionFuseBackend(
        {**opts, "quality": "lossless", "cudagraphs": False}, report)), fx_patch))
    if cuda:
        variants.append((V_OURS_CG, lambda: torch.compile(base, backend=DiffusionFuseBackend(
            {**opts, "quality": "lossless", "cudagraphs": True}, report_cg)), fx_patch))
    else:
        notes.append("no CUDA device: the diffusion_fuse+cudagraphs variant is not run")
    def ind_patch() -> Any:
        return inductor_config.patch({"trace.provenance_tracking_level": 1, "cpp.enable_kernel_profile": True})

    variants.append((V_INDUCTOR, lambda: torch.compile(base), ind_patch))

    bw = copy_bandwidth(device)
    traces: dict[str, _Trace] = {}
    inductor_lines: dict[str, set[str]] = {}
    with torch.no_grad():
        for name, make, patch in variants:
            before = {id(m) for m in dynamo_utils.get_compilation_metrics()}
            try:
                fn = make()
                with patch() if patch is not None else contextlib.nullcontext():
                    for _ in range(warmup):
                        call(fn)()
                if cuda:
                    torch.cuda.synchronize()
                if name == V_INDUCTOR:
                    inductor_lines = _inductor_lines([m for m in dynamo_utils.get_compilation_metrics()
                                                      if id(m) not in before])
                kr, records = _profile_forwards(call(fn), cuda, forwards, collect=name in (V_OURS, V_OURS_CG))
                traces[name] = _analyze(kr, cuda, family_of, records, _FX_METADATA_REGISTRY)
            except Exception as e:  # noqa: BLE001 - one variant that fails leaves the others' profile standing
                msg = error_message(e)
                _log.warning("profile: the %s variant failed and is left out: %s", name, msg)
                notes.append(f"{name}: failed and left out: {msg}")
                continue
            if traces[name].forwards != forwards:
                notes.append(f"{name}: {traces[name].forwards} of {forwards} forward scopes found in the trace")
    if V_OURS_CG in traces and V_OURS in traces:
        _align_cudagraph(traces[V_OURS_CG], traces[V_OURS])
    if report.sites() and not report.sites("kept"):
        notes.append("no diffusion_fuse site was kept (the verifier rejected every site, or verification is off)")
    if V_INDUCTOR in traces and not inductor_lines:
        notes.append("Inductor recorded no kernel provenance: the Inductor column is empty")
    if not traces:
        raise RuntimeError("diffusion_fuse.profile: every variant failed: " + "; ".join(notes))
    primary = next(v for v in (V_OURS_CG, V_OURS, V_INDUCTOR, V_EAGER) if v in traces)
    detail = V_OURS if V_OURS in traces else primary
    result = _assemble(device, cuda, forwards, traces, primary, detail, bw, inductor_lines, notes)
    result.sites = dict(collections.Counter(s.pattern for s in report.sites("kept")))
    _RECENT.append(result)
    return result


def _assemble(device: torch.device, cuda: bool, forwards: int, traces: dict[str, _Trace], primary: str, detail: str,
              bw: float, inductor_lines: dict[str, set[str]], notes: list[str]) -> ProfileReport:
    from .lowering.spec import SPECS

    variants = list(traces)
    ms = 1e-6  # ns -> ms
    totals = {v: ms * sum(t.totals_ns) / max(1, t.forwards) for v, t in traces.items()}
    rows: dict[str, ClassRow] = {}

    def kind_of(cls: str) -> str:
        if cls in COMPUTE:
            return "compute"
        if cls.startswith(OURS):
            return "ours"
        return {EAGER: "eager", MEMCPY: "copy", INDUCTOR: "inductor", HOST: "host"}.get(cls, "other")

    floor_bytes: dict[str, float] = collections.defaultdict(float)
    floor_known: dict[str, bool] = {}
    gemm_ops = {name for name, spec in SPECS.items() if spec.compute_bound}
    for v, t in traces.items():
        n = max(1, t.forwards)
        for inst in t.insts:
            r = rows.setdefault(inst.cls, ClassRow(inst.cls, kind_of(inst.cls), {}, {}))
            r.ms[v] = r.ms.get(v, 0.0) + ms * inst.ns / n
            r.calls[v] = r.calls.get(v, 0.0) + 1.0 / n
            if v == primary and r.kind in ("ours", "eager", "copy") and inst.name not in gemm_ops:
                if inst.nbytes is None:
                    floor_known[inst.cls] = False
                else:
                    floor_bytes[inst.cls] += inst.nbytes / n
                    floor_known.setdefault(inst.cls, True)
        r = rows.setdefault(HOST, ClassRow(HOST, "host", {}, {}))
        r.ms[v] = ms * t.host_ns / n
    for cls, b in floor_bytes.items():
        rows[cls].floor_ms = 1e3 * b / bw
    for cls, known in floor_known.items():
        if not known and rows[cls].floor_ms is not None:
            notes.append(f"{cls}: the floor leaves out ops whose bytes are unknown")
    for r in rows.values():
        if r.kind == "host":
            r.floor_ms = 0.0

    def sort_key(r: ClassRow) -> tuple:
        above = r.above_floor(primary)
        return (0, -above) if above is not None else (1, -r.ms.get(primary, 0.0))

    classes = sorted(rows.values(), key=sort_key)
    # eager ops left by the detail variant: per op and per source line
    t = traces.get(detail)
    eager_ops: list[OpRow] = []
    lines: list[LineRow] = []
    if t is not None:
        n = max(1, t.forwards)
        eager = [i for i in t.insts if i.cls in LEFT and i.ev is not None]
        by_op: dict[str, list[_Inst]] = collections.defaultdict(list)
        for i in eager:
            by_op[i.name].append(i)
        for op, xs in by_op.items():
            eager_ops.append(OpRow(op, len(xs) / n, ms * sum(i.ns for i in xs) / n,
                                   1e3 * sum(i.nbytes or 0 for i in xs) / n / bw))
        eager_ops.sort(key=lambda o: -o.above_floor_ms)
        by_line: dict[str, list[_Inst]] = collections.defaultdict(list)
        for i in eager:
            by_line[i.location].append(i)
        ind = traces.get(V_INDUCTOR)
        ind_ms: dict[str, float] = collections.defaultdict(float)
        if ind is not None:
            for i in ind.insts:
                if i.cls == INDUCTOR:
                    ind_ms[i.name] += ms * i.ns / max(1, ind.forwards)
        line_kernels: dict[str, list[str]] = collections.defaultdict(list)
        for k, locs in inductor_lines.items():
            for loc in locs:
                line_kernels[loc].append(k)
        ctxs = t.ctxs
        for loc, xs in by_line.items():
            per_fwd: dict[int, list[_Inst]] = collections.defaultdict(list)
            for i in xs:
                per_fwd[i.fwd].append(i)
            nbytes = sum(ctxs[f].group_bytes(m) for f, m in per_fwd.items()) / n if ctxs else 0.0
            ops = collections.Counter(i.name for i in xs)
            kern = sorted(((k, ind_ms.get(k, 0.0)) for k in line_kernels.get(loc, ())), key=lambda x: -x[1])
            lines.append(LineRow(loc, xs[0].code, {op: c / n for op, c in ops.most_common()},
                                 ms * sum(i.ns for i in xs) / n, 1e3 * nbytes / bw, kern,
                                 sum(k[1] for k in kern) if kern else None))
        lines.sort(key=lambda ln: -ln.above_floor_ms)
    for v, tr in traces.items():
        notes.extend(f"{v}: {x}" for x in tr.notes)
        classed = sum(r.ms.get(v, 0.0) for r in rows.values())
        if totals[v] > 0 and abs(classed - totals[v]) > 1e-3 * totals[v] + 1e-3:
            notes.append(f"{v}: the classes sum to {classed:.3f} ms of {totals[v]:.3f} ms")
    name = torch.cuda.get_device_name(device) if cuda else "CPU"
    return ProfileReport(device=name, time_kind="GPU" if cuda else "CPU", forwards=forwards, variants=variants,
                         primary=primary, detail=detail, totals_ms=totals, classes=classes, eager_ops=eager_ops,
                         lines=lines, copy_bandwidth=bw, notes=notes)


# ------------------------------------------------------------------------------------------------------------------
# HTML
# ------------------------------------------------------------------------------------------------------------------
_BAR_CSS = """
.chart{display:grid;grid-template-columns:minmax(180px,max-content) 1fr;gap:6px 14px;align-items:center;margin:12px 0}
.chart .label{font-family:ui-monospace,monospace;font-size:12px} .bars{display:flex;flex-direction:column;gap:2px}
.bar{height:14px;border-radius:2px;position:relative;min-width:1px} .bar span{position:absolute;left:100%;
padding-left:6px;font-size:11px;white-space:nowrap;color:#4b5563} .floor{position:absolute;top:-2px;bottom:-2px;
border-left:2px dashed #1d2330} .legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px;border-radius:2px}
"""
_COLOURS = ["#9aa1ad", "#3b82c4", "#11772f", "#c2410c", "#6a4fb3", "#b3261e"]


def _render_html(r: ProfileReport, title: str) -> str:
    from .verify.html import _CSS
    from .verify.html import _e as e
    colour = {v: _COLOURS[i % len(_COLOURS)] for i, v in enumerate(r.variants)}
    top = max([max(c.ms.values(), default=0.0) for c in r.classes] + [1e-9])
    legend = "".join(f'<span><i style="background:{colour[v]}"></i>{e(v)}</span>' for v in r.variants)
    chart = []
    for c in r.classes:
        bars = []
        for v in r.variants:
            t = c.ms.get(v, 0.0)
            floor = ""
            if v == r.primary and c.floor_ms is not None and c.kind != "host" and t > 0:
                floor = f'<div class="floor" style="left:{100 * min(c.floor_ms, t) / t:.2f}%" title="floor"></div>'
            bars.append(f'<div class="bar" data-variant="{e(v)}" data-ms="{t:.6f}" style="width:{100 * t / top:.2f}%;'
                        f'background:{colour[v]}" title="{e(v)}: {t:.3f} ms">{floor}<span>{t:.3f}</span></div>')
        above = c.above_floor(r.primary)
        chart.append(f'<div class="label class-bars-label">{e(c.name)}</div>'
                     f'<div class="bars class-bars" data-class="{e(c.name)}" data-kind="{e(c.kind)}"'
                     f' data-floor-ms="{"" if c.floor_ms is None else f"{c.floor_ms:.6f}"}"'
                     f' data-above-floor-ms="{"" if above is None else f"{above:.6f}"}">{"".join(bars)}</div>')

    def table(headers: list[str], rows: list[list[Any]], tid: str, cls: str, attrs: list[dict[str, Any]]) -> str:
        head = "".join(f"<th>{e(h)}</th>" for h in headers)
        body = []
        for row, a in zip(rows, attrs):
            data = "".join(f' data-{k.replace("_", "-")}="{e(v)}"' for k, v in a.items())
            cells = "".join(f'<td class="num">{e(x)}</td>' if isinstance(x, (int, float)) or _is_num(x)
                            else f'<td class="mono">{e(x)}</td>' for x in row)
            body.append(f'<tr class="{cls}"{data}>{cells}</tr>')
        return f'<table id="{tid}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'

    total = r.totals_ms.get(r.primary, 0.0)
    class_rows = [[c.name] + [_ms(c.ms.get(v)) for v in r.variants] + [_ms(c.floor_ms), _ms(c.above_floor(r.primary)),
                  f"{100 * c.ms.get(r.primary, 0.0) / total:.1f}" if total else ""] for c in r.classes]
    class_rows.append(["(total)"] + [_ms(r.totals_ms.get(v)) for v in r.variants] + ["", "", "100.0"])
    class_attrs = [{"class": c.name, "kind": c.kind} for c in r.classes] + [{"class": "(total)", "kind": "total"}]
    op_rows = [[o.op, f"{o.calls:g}", _ms(o.ms), _ms(o.floor_ms), _ms(o.above_floor_ms)] for o in r.eager_ops]
    line_rows = [[ln.location, ln.code, " ".join(f"{op}×{n:g}" for op, n in ln.ops.items()), _ms(ln.ms),
                  _ms(ln.floor_ms), _ms(ln.above_floor_ms), _ms(ln.inductor_ms),
                  ", ".join(f"{k} {_ms(t)}" for k, t in ln.inductor) or "(none)"] for ln in r.lines]
    body = [
        f"<h1>{e(title)}</h1>",
        (f'<p id="overview" data-device="{e(r.device)}" data-primary="{e(r.primary)}" '
         f'data-eager-share="{r.eager_share():.6f}">{e(r.device)}: {r.forwards} forward(s) per variant, '
         f"{e(r.time_kind)} time in ms per forward; floors at {r.copy_bandwidth / 1e9:.1f} GB/s (one large copy, "
         f"read + write). {e(r.headline())}.</p>"),
        "<h2>Time per class</h2>",
        f'<p class="legend">{legend} <span>dashed line: the {e(r.primary)} floor</span></p>',
        f'<div class="chart" id="chart">{"".join(chart)}</div>',
        table(["class"] + [f"{v} ms" for v in r.variants] + ["floor ms", "above floor ms", f"% {r.primary}"],
              class_rows, "classes", "class-row", class_attrs),
    ]
    if r.eager_ops:
        body += [f"<h2>Eager ATen ops left by {e(r.detail)}, per op</h2>",
                 table(["eager ATen op", "calls", "ms", "floor ms", "above floor ms"], op_rows, "eager-ops", "op-row",
                       [{"op": o.op} for o in r.eager_ops])]
    if r.lines:
        body += [f"<h2>Eager ATen ops left by {e(r.detail)}, per source line, and Inductor's kernels for it</h2>",
                 table(["source line", "code", "eager ATen ops", "ms", "floor ms (fused)", "above floor ms",
                        "inductor ms", "Inductor kernels (ms)"], line_rows, "lines", "line-row",
                       [{"location": ln.location} for ln in r.lines])]
    if r.notes:
        body.append('<h2>Notes</h2><ul id="notes">' + "".join(f"<li>{e(n)}</li>" for n in r.notes) + "</ul>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{e(title)}</title><style>{_CSS}{_BAR_CSS}</style></head><body>\n" + "\n".join(body)
            + "\n</body></html>\n")


def _is_num(x: Any) -> bool:
    try:
        float(x)
        return isinstance(x, str) and x != ""
    except (TypeError, ValueError):
        return False
