"""The report: what the backend did, per graph and per site, and which kernels ran.

Printable as tables (tabulate), serialisable to JSON, renderable as one self-contained HTML
file (``save_html``; verify/html.py). Everything in it is plain data (strings, numbers,
lists, dicts): the graph-level data the before/after diff needs (verify/graph_diff.py) is
stored as node lists, edges and code strings, never as GraphModules.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any

from tabulate import tabulate

from ..log import current_compile_id
from ..lowering import counters

# Fallback reasons that mean "the kernel failed" rather than "the guard sent it to the reference".
KERNEL_ERROR_PREFIXES = ("kernel error", "kernel disabled after error")


def is_kernel_error(reason: str) -> bool:
    return reason.startswith(KERNEL_ERROR_PREFIXES)


@dataclasses.dataclass
class SiteRecord:
    id: str
    pattern: str
    tier: str
    exact: bool
    location: str
    before: list[str]  # ATen ops the site replaced
    after: str  # the op it became
    shapes: str
    ops: int = 1  # ops the site became (an LN read by two modulates becomes two)
    status: str = "matched"  # matched | kept | rejected | unverified | excluded
    reason: str = ""
    # Graph-level detail (node names are those of the reference ATen graph, ``created`` those of
    # the rewritten graph whose nodes carry ``meta["diffusion_fuse_site"] == id``).
    nodes: list[str] = dataclasses.field(default_factory=list)  # matched nodes, removed by the rewrite
    input_nodes: list[str] = dataclasses.field(default_factory=list)
    output_nodes: list[str] = dataclasses.field(default_factory=list)
    input_shapes: list[str] = dataclasses.field(default_factory=list)  # "bfloat16[1, 16, 32]", per input
    output_shapes: list[str] = dataclasses.field(default_factory=list)
    created: list[str] = dataclasses.field(default_factory=list)
    verdict: str = ""  # "bitwise equal" | "within tolerance" | the first difference | "" (not judged)
    first_diff: dict | None = None  # {"output", "index", "expected", "got", "count", "numel"} of a mismatch


@dataclasses.dataclass
class NearMissRecord:
    pattern: str
    anchor: str
    location: str
    reason: str
    target: str = ""  # the anchor's op
    shape: str = ""  # the anchor's output shape(s)


@dataclasses.dataclass
class GraphReport:
    graph_id: int
    quality: str
    kind: str = "inference"  # inference | training (no rewrites)
    sites: dict[str, SiteRecord] = dataclasses.field(default_factory=dict)
    near_misses: list[NearMissRecord] = dataclasses.field(default_factory=list)
    verifications: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    inductor_sites: list[str] = dataclasses.field(default_factory=list)  # tier high: applied inside Inductor
    families: list[str] = dataclasses.field(default_factory=list)  # the families searched for in this graph
    # Before/after, as plain data (graph_diff.graph_data): {"nodes": [...], "edges": [[src, dst], ...]}
    ref_graph: dict | None = None  # the ATen graph as traced
    fused_graph: dict | None = None  # with every matched site rewritten
    ref_code: str = ""
    fused_code: str = ""
    final_code: str = ""  # the graph that runs after the verifier put back rejected sites ("" until judged)
    final_ops: dict[str, int] = dataclasses.field(default_factory=dict)  # that graph's calls per op (target_name)
    cudagraphs: str = ""  # "" (not asked for) | "on" | "not applied: <torch's reason>" (diffusion_fuse/cudagraphs.py)
    compile_id: str = ""  # torch's compile id ("0/1"), as TORCH_LOGS and tlparse show it
    kernel_sources: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # op -> its kernels' source files
    graph_file: str = ""  # where the graph that runs was written (DIFFUSION_FUSE_DUMP_DIR), or ""


def _fmt_before_after(s: SiteRecord) -> str:
    return f"{' '.join(s.before)} → {s.after.split('::')[-1]}" + (f" ×{s.ops}" if s.ops > 1 else "")


def _fmt_shapes(s: SiteRecord) -> str:
    if s.input_shapes or s.output_shapes:
        return f"{s.input_shapes[0] if s.input_shapes else '?'} → {', '.join(s.output_shapes)}"
    return s.shapes


def _fmt_verdict(s: SiteRecord) -> str:
    if s.status == "rejected":
        return s.reason
    return s.verdict or {"unverified": "not verified (verify=False)", "matched": "not judged yet"}.get(s.status, "")


class Report:
    """Accumulates GraphReports; counters are reported relative to when it was made."""

    def __init__(self) -> None:
        self.graphs: list[GraphReport] = []
        self._lock = threading.Lock()
        self._counters_start = counters.snapshot()

    def new_graph(self, quality: str, kind: str = "inference") -> GraphReport:
        with self._lock:
            cid = current_compile_id()
            g = GraphReport(graph_id=len(self.graphs), quality=quality, kind=kind,
                            compile_id=str(cid) if cid is not None else "")
            self.graphs.append(g)
        _compiled(self, g)
        return g

    @classmethod
    def combined(cls, reports: list[Report]) -> Report:
        """One report over the graphs of ``reports`` (the same records), counters since the first was made."""
        out = cls()
        out.graphs = [g for r in reports for g in r.graphs]
        if reports:
            out._counters_start = reports[0]._counters_start
        return out

    # --- queries -------------------------------------------------------------------------
    def sites(self, status: str | None = None) -> list[SiteRecord]:
        return [s for g in self.graphs for s in g.sites.values() if status is None or s.status == status]

    def count(self, pattern: str | None = None, status: str | None = None) -> int:
        return sum(1 for s in self.sites(status) if pattern is None or s.pattern == pattern)

    def counters(self) -> dict:
        return counters.diff(counters.snapshot(), self._counters_start)

    def families(self) -> list[str]:
        """Families searched for in any graph, then any other pattern a site came from, in order."""
        names: dict[str, None] = {}
        for g in self.graphs:
            names.update(dict.fromkeys(g.families))
        for s in self.sites():
            names.setdefault(s.pattern, None)
        return list(names)

    SUMMARY_HEADERS = ["family", "matched", "kept", "rejected", "unverified", "kernel hits", "guard fallbacks",
                       "kernel errors"]

    def summary_rows(self) -> list[list[Any]]:
        """Per family: sites matched / kept / rejected / unverified, then the calls of its op(s)
        that ran the kernel, took the reference path because a guard said so, or because the
        kernel failed (counted since the report was made, verifier checks included)."""
        ctr = self.counters()
        rows = []
        for p in self.families():
            sites = [s for s in self.sites() if s.pattern == p]
            ops = sorted({s.after.split("::")[-1] for s in sites})
            fb = {r: n for op in ops for r, n in ctr["fallback"].get(op, {}).items()}
            rows.append([
                p,
                len(sites),
                sum(s.status == "kept" for s in sites),
                sum(s.status == "rejected" for s in sites),
                sum(s.status == "unverified" for s in sites),
                sum(ctr["kernel"].get(op, 0) for op in ops),
                sum(n for r, n in fb.items() if not is_kernel_error(r)),
                sum(n for r, n in fb.items() if is_kernel_error(r)),
            ])
        return rows

    def summary(self) -> list[dict[str, Any]]:
        """``summary_rows`` as dicts keyed by ``SUMMARY_HEADERS``."""
        return [dict(zip(self.SUMMARY_HEADERS, row)) for row in self.summary_rows()]

    # --- rendering -----------------------------------------------------------------------
    def total_row(self) -> list[Any]:
        rows = self.summary_rows()
        return ["(total)"] + [sum(r[i] for r in rows) for i in range(1, len(self.SUMMARY_HEADERS))]

    def table(self) -> str:
        rows = self.summary_rows()
        out = [tabulate(rows + ([self.total_row()] if len(rows) > 1 else []), headers=self.SUMMARY_HEADERS)]
        # a site id is one per graph: where several graphs hold it (a recompile), each row names its graph
        label = (lambda g, s: f"{s.id} (graph {g.graph_id})") if len(self.graphs) > 1 else (lambda g, s: s.id)
        site_rows = [[label(g, s), s.status, _fmt_before_after(s), _fmt_shapes(s), _fmt_verdict(s)]
                     for g in self.graphs for s in g.sites.values()]
        if site_rows:
            out.append(tabulate(site_rows, headers=["site (pattern@source#n)", "status", "ATen ops → op",
                                                    "in → out", "verdict"],
                                maxcolwidths=[None, None, 44, 44, 60]))
        src_rows = sorted({(g.sites[sid].after.split("::")[-1], ", ".join(files) or "(generated on a first launch)")
                           for g in self.graphs for sid, files in g.kernel_sources.items() if sid in g.sites})
        if src_rows:
            out.append(tabulate(src_rows, headers=["op", "kernel source"]))
        files = [f"graph {g.graph_id}: the graph that runs is {g.graph_file}" for g in self.graphs if g.graph_file]
        if files:
            out.append("\n".join(files))
        fb_rows = [[op, reason, n] for op, rs in self.counters()["fallback"].items() for reason, n in rs.items()]
        if fb_rows:
            out.append(tabulate(fb_rows, headers=["op", "reference path because", "calls"]))
        nm_rows = [[m.pattern, m.anchor, m.location, m.reason] for g in self.graphs for m in g.near_misses]
        if nm_rows:
            out.append(tabulate(nm_rows, headers=["near miss", "anchor", "source", "why not"]))
        notes = [f"graph {g.graph_id}: {n}" for g in self.graphs for n in g.notes]
        if notes:
            out.append("\n".join(notes))
        return "\n\n".join(out)

    __str__ = table

    def to_dict(self) -> dict:
        return {
            "summary": self.summary(),
            "graphs": [dataclasses.asdict(g) for g in self.graphs],
            "counters": self.counters(),
        }

    def to_html(self, title: str = "diffusion_fuse report") -> str:
        from .html import render

        return render(self, title=title)

    def save_html(self, path: str, title: str = "diffusion_fuse report") -> None:
        """One self-contained HTML file: summary, sites, near misses, kernel calls, per-site diffs."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_html(title))

    def save(self, path: str) -> None:
        """``.json``: ``to_dict``; ``.html``/``.htm``: ``save_html``; anything else: ``table``. With several ranks
        (``torch.distributed`` initialized), each writes its own file: ``report.json`` becomes ``report.rank1.json``."""
        path = rank_path(path, *_rank_and_world())
        if path.endswith((".html", ".htm")):
            self.save_html(path)
            return
        text = json.dumps(self.to_dict(), indent=2, default=str) if path.endswith(".json") else self.table()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")


def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rank_path(path: str, rank: int, world: int) -> str:
    """``path`` with ``.rank<rank>`` before its extension when there are several ranks (one file each)."""
    if world <= 1:
        return path
    stem, dot, ext = path.rpartition(".")
    return f"{stem}.rank{rank}.{ext}" if dot and "/" not in ext else f"{path}.rank{rank}"


_LOCK = threading.Lock()
_PROCESS = Report()  # every graph compiled since the last reset_reports(), whichever report it belongs to
_LAST: Report | None = None  # the report that got the newest graph
_BY_PATH: dict[str, Report] = {}


def _compiled(report: Report, g: GraphReport) -> None:
    global _LAST
    with _LOCK:
        if report is not _PROCESS:
            _PROCESS.graphs.append(g)
        _LAST = report


def last_report() -> Report:
    """The report of the compile that compiled a graph last (``process_report()`` before any)."""
    return _LAST if _LAST is not None else _PROCESS


def process_report() -> Report:
    """Every graph compiled in this process since ``reset_reports()``, each compile's records as they are."""
    return _PROCESS


def reset_reports() -> None:
    """Start the process-wide report afresh (a compile's own report, ``report_of``, keeps its graphs)."""
    global _PROCESS, _LAST
    with _LOCK:
        _PROCESS, _LAST = Report(), None
        _BY_PATH.clear()


def default_report(path: str | None = None) -> Report:
    """The report a backend called by name adds to when torch does not let it have one per compile (see
    ``backend._check_options_at_torch_compile``): per report path, or the process-wide one."""
    if path is None:
        return _PROCESS
    with _LOCK:
        return _BY_PATH.setdefault(path, Report())
