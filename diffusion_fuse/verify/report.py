"""The report: what the backend did, per graph and per site, and which kernels ran.

Printable as tables (tabulate), serialisable to JSON.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any

from tabulate import tabulate

from ..lowering import counters


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


@dataclasses.dataclass
class NearMissRecord:
    pattern: str
    anchor: str
    location: str
    reason: str


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


class Report:
    """Accumulates GraphReports; counters are reported relative to when it was made."""

    def __init__(self) -> None:
        self.graphs: list[GraphReport] = []
        self._lock = threading.Lock()
        self._counters_start = counters.snapshot()

    def new_graph(self, quality: str, kind: str = "inference") -> GraphReport:
        with self._lock:
            g = GraphReport(graph_id=len(self.graphs), quality=quality, kind=kind)
            self.graphs.append(g)
            return g

    # --- queries -------------------------------------------------------------------------
    def sites(self, status: str | None = None) -> list[SiteRecord]:
        return [s for g in self.graphs for s in g.sites.values() if status is None or s.status == status]

    def count(self, pattern: str | None = None, status: str | None = None) -> int:
        return sum(1 for s in self.sites(status) if pattern is None or s.pattern == pattern)

    def counters(self) -> dict:
        return counters.diff(counters.snapshot(), self._counters_start)

    def summary_rows(self) -> list[list[Any]]:
        ctr = self.counters()
        patterns = sorted({s.pattern for s in self.sites()})
        rows = []
        for p in patterns:
            sites = [s for s in self.sites() if s.pattern == p]
            op = sites[0].after.split("::")[-1]
            rows.append([
                p,
                len(sites),
                sum(s.status == "kept" for s in sites),
                sum(s.status == "rejected" for s in sites),
                sum(s.status == "unverified" for s in sites),
                ctr["kernel"].get(op, 0),
                sum(ctr["fallback"].get(op, {}).values()),
            ])
        return rows

    # --- rendering -----------------------------------------------------------------------
    def table(self) -> str:
        out = [tabulate(self.summary_rows(),
                        headers=["pattern", "matched", "kept", "rejected", "unverified", "kernel hits", "fallbacks"])]
        site_rows = [[s.id, s.status, s.shapes, s.reason] for s in self.sites()]
        if site_rows:
            out.append(tabulate(site_rows, headers=["site (pattern@source#n)", "status", "shapes (in, out)", "why"]))
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
            "graphs": [dataclasses.asdict(g) for g in self.graphs],
            "counters": self.counters(),
        }

    def save(self, path: str) -> None:
        text = json.dumps(self.to_dict(), indent=2, default=str) if path.endswith(".json") else self.table()
        with open(path, "w") as f:
            f.write(text + "\n")


_DEFAULT = Report()
_BY_PATH: dict[str, Report] = {}
_BY_PATH_LOCK = threading.Lock()


def default_report(path: str | None = None) -> Report:
    """The report a compile without its own ``Report`` adds to.

    With ``options={"report": path}`` every graph compiled with that path goes to one report
    (the file then holds exactly those graphs); otherwise to the process-wide one.
    """
    if path is None:
        return _DEFAULT
    with _BY_PATH_LOCK:
        return _BY_PATH.setdefault(path, Report())
