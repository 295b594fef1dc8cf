"""Before/after diffs of a rewritten graph: structural (networkx) and textual (difflib).

The verifier stores each graph as plain data (``graph_data``) when it builds the rewritten
graph: the reference ATen graph and the graph with every matched site rewritten. From that:

- ``structural_diff`` builds one ``networkx.DiGraph`` per side (nodes keyed by name; FX keeps
  the names of untouched nodes when it copies a graph, and never reuses a name) and finds the
  nodes removed and added, grouped per site: added nodes carry the site id the rewrite put in
  ``meta["diffusion_fuse_site"]``; removed nodes are the site's matched nodes, plus the nodes the
  cleanup pass dropped because only those fed them (e.g. an ``unsqueeze(1 + scale)`` the
  replacement re-emits), attributed to the site they flowed into.
- each site's group holds its before/after subgraph (the removed/added nodes, the nodes that
  feed them and the nodes that read them, with edges) and a unified diff of their code lines;
- ``code_diff`` is a unified diff of the whole graph code (``ref.code`` vs the code of the
  graph that runs).
"""

from __future__ import annotations

import collections
import difflib
import operator
from collections.abc import Iterable, Mapping
from typing import Any

import networkx as nx
import torch
import torch.fx as fx

MAX_LINE = 240  # code lines longer than this are cut in the per-site diffs


# --- graph → plain data -------------------------------------------------------------------
def target_name(node: fx.Node) -> str:
    """``aten.mul.Tensor``, ``diffusion_fuse.norm_modulate.default``, ``getitem``, ``output``..."""
    t = node.target
    if node.op in ("placeholder", "output"):
        return node.op
    if node.op == "get_attr":
        return f"self.{t}"
    if t is operator.getitem:
        return "getitem"
    if isinstance(t, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(t)
    return getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or str(t)


def op_counts(gm: fx.GraphModule) -> dict[str, int]:
    """Calls per op (``target_name``) in ``gm``: the census reads them from ``GraphReport.final_ops``."""
    return dict(collections.Counter(target_name(n) for n in gm.graph.nodes if n.op == "call_function"))


def value_str(v: Any) -> str:
    """``bfloat16[1, 16, 32]`` for a tensor, ``(a, b)`` for tuples, ``int`` for a SymInt, else ''."""
    if isinstance(v, torch.Tensor):
        return f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}"
    if isinstance(v, (list, tuple)):
        parts = [value_str(x) for x in v]
        return "(" + ", ".join(p or "-" for p in parts) + ")" if any(parts) else ""
    if isinstance(v, (torch.SymInt, int)) and not isinstance(v, bool):
        return "int"
    return ""


def _arg_str(a: Any) -> str:
    if isinstance(a, fx.Node):
        return a.name
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_arg_str(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {_arg_str(v)}" for k, v in a.items()) + "}"
    return repr(a)


def code_line(node: fx.Node) -> str:
    """One readable line per node: ``mul = aten.mul.Tensor(getitem, add)``."""
    if node.op == "placeholder":
        return f"{node.name} = input"
    if node.op == "output":
        return f"return {_arg_str(node.args[0])}"
    if node.op == "get_attr":
        return f"{node.name} = self.{node.target}"
    args = [_arg_str(a) for a in node.args] + [f"{k}={_arg_str(v)}" for k, v in node.kwargs.items()]
    return f"{node.name} = {target_name(node)}({', '.join(args)})"


def graph_data(gm: fx.GraphModule | fx.Graph) -> dict[str, list]:
    """``{"nodes": [{name, op, target, value, code, site?}], "edges": [[src, dst], ...]}``."""
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    nodes, edges = [], []
    for n in graph.nodes:
        d = {"name": n.name, "op": n.op, "target": target_name(n), "value": value_str(n.meta.get("val")),
             "code": code_line(n)}
        site = n.meta.get("diffusion_fuse_site")
        if site is not None:
            d["site"] = site
        nodes.append(d)
        edges.extend([a.name, n.name] for a in n.all_input_nodes)
    return {"nodes": nodes, "edges": edges}


def to_networkx(data: Mapping[str, list]) -> nx.DiGraph:
    """The graph as a DiGraph keyed by node name; node attributes are those of ``graph_data``."""
    g = nx.DiGraph()
    for i, d in enumerate(data["nodes"]):
        g.add_node(d["name"], order=i, **{k: v for k, v in d.items() if k != "name"})
    g.add_edges_from(tuple(e) for e in data["edges"])
    return g


# --- structural diff ----------------------------------------------------------------------
UNATTRIBUTED = "(no site)"


def _same(g0: nx.DiGraph, g1: nx.DiGraph, n: str) -> bool:
    return n in g1 and g0.nodes[n]["target"] == g1.nodes[n]["target"]


def _subgraph(g: nx.DiGraph, core: Iterable[str]) -> dict[str, list]:
    """``core`` with the nodes feeding it and reading it; edges with an endpoint in ``core``."""
    core = set(core)
    inputs = {p for n in core for p in g.predecessors(n)} - core
    readers = {s for n in core for s in g.successors(n)} - core
    members = sorted(core | inputs | readers, key=lambda n: g.nodes[n]["order"])
    role = {n: "input" if n in inputs else "reader" if n in readers else "core" for n in members}
    nodes = [{"name": n, "role": role[n], **{k: v for k, v in g.nodes[n].items() if k != "order"}}
             for n in members]
    edges = [[u, v] for u, v in g.edges(members) if (u in core or v in core) and v in role]
    return {"nodes": nodes, "edges": edges}


def _lines(sub: Mapping[str, list], roles: tuple[str, ...]) -> list[str]:
    out = []
    for d in sub["nodes"]:
        if d["role"] in roles:
            line = d["code"]
            out.append(line if len(line) <= MAX_LINE else line[:MAX_LINE - 1] + "…")
    return out


def unified(before: list[str], after: list[str], label_before: str, label_after: str, context: int = 3) -> str:
    return "\n".join(difflib.unified_diff(before, after, label_before, label_after, n=context, lineterm=""))


def structural_diff(ref_data: Mapping[str, list], fused_data: Mapping[str, list],
                    site_nodes: Mapping[str, Iterable[str]]) -> dict[str, Any]:
    """What the rewrite removed and added, grouped per site.

    ``site_nodes``: site id → the names of its matched nodes in the reference graph.
    Returns ``{"removed": [...], "added": [...], "edges_removed": n, "edges_added": n,
    "sites": {site id: group}, "unattributed": group or None}``; a group is
    ``{"removed", "added", "before", "after", "code_diff"}`` with ``before``/``after`` the
    subgraphs of ``_subgraph`` (nodes with a ``role``: input, core, reader).
    """
    g0, g1 = to_networkx(ref_data), to_networkx(fused_data)
    removed = [n for n in g0 if not _same(g0, g1, n)]
    added = [n for n in g1 if not _same(g1, g0, n)]
    owner: dict[str, str] = {}
    for sid, names in site_nodes.items():
        for n in names:
            if n in g0 and n not in g1:
                owner[n] = sid
    # Dead code dropped after a rewrite belongs to the site its values flowed into.
    gone = g0.subgraph(removed)
    for n in removed:
        if n not in owner:
            sids = {owner[d] for d in nx.descendants(gone, n) if d in owner}
            if len(sids) == 1:
                owner[n] = sids.pop()
    added_owner = {n: g1.nodes[n].get("site", UNATTRIBUTED) for n in added}

    groups: dict[str, dict[str, Any]] = {}
    order = list(site_nodes) + [UNATTRIBUTED]
    for sid in order:
        rm = [n for n in removed if owner.get(n, UNATTRIBUTED) == sid]
        ad = [n for n in added if added_owner[n] == sid]
        if not rm and not ad and sid == UNATTRIBUTED:
            continue
        before, after = _subgraph(g0, rm), _subgraph(g1, ad)
        groups[sid] = {
            "removed": rm,
            "added": ad,
            "before": before,
            "after": after,
            "code_diff": unified(_lines(before, ("core", "reader")), _lines(after, ("core", "reader")),
                                 f"{sid} before", f"{sid} after"),
        }
    return {
        "removed": removed,
        "added": added,
        "edges_removed": sum(1 for e in g0.edges if not g1.has_edge(*e)),
        "edges_added": sum(1 for e in g1.edges if not g0.has_edge(*e)),
        "sites": {k: v for k, v in groups.items() if k != UNATTRIBUTED},
        "unattributed": groups.get(UNATTRIBUTED),
    }


def graph_diff(greport: Any) -> dict[str, Any] | None:
    """``structural_diff`` of a ``GraphReport`` (None when it holds no graph data)."""
    if greport.ref_graph is None or greport.fused_graph is None:
        return None
    return structural_diff(greport.ref_graph, greport.fused_graph,
                           {sid: rec.nodes for sid, rec in greport.sites.items()})


def code_diff(greport: Any, context: int = 2) -> str:
    """Unified diff of the reference graph's code and the code of the graph that runs."""
    after = greport.final_code or greport.fused_code
    label = "graph that runs" if greport.final_code else "rewritten graph (not judged yet)"
    return unified(greport.ref_code.splitlines(), after.splitlines(), f"graph {greport.graph_id}: ATen graph",
                   f"graph {greport.graph_id}: {label}", context)


# --- text rendering -------------------------------------------------------------------------
def format_text(report: Any, code: bool = True) -> str:
    """Per graph: per-site removed → added nodes with their code diff, then the graph code diff."""
    out: list[str] = []
    for g in report.graphs:
        d = graph_diff(g)
        if d is None:
            continue
        out.append(f"=== graph {g.graph_id} ({g.quality}): {len(d['removed'])} node(s) removed, "
                   f"{len(d['added'])} added, {d['edges_removed']} edge(s) removed, {d['edges_added']} added")
        for sid, grp in d["sites"].items():
            rec = g.sites.get(sid)
            status = f" [{rec.status}]" if rec is not None else ""
            out.append(f"--- {sid}{status}")
            if rec is not None:
                out.append(f"    source: {rec.location}")
            out.append(f"    removed: {', '.join(grp['removed']) or '-'}")
            out.append(f"    added:   {', '.join(grp['added']) or '-'}")
            if grp["code_diff"]:
                out.extend("    " + ln for ln in grp["code_diff"].splitlines())
        if d["unattributed"]:
            u = d["unattributed"]
            out.append(f"--- {UNATTRIBUTED}: removed {u['removed']}, added {u['added']}")
        if code:
            text = code_diff(g)
            if text:
                out.append(text)
    return "\n".join(out)
