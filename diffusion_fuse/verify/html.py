"""The report as one self-contained HTML file: no scripts, styles or images from elsewhere.

Sections (each element a test or a script may look for has an id or ``data-*`` attributes):

- ``table#summary``: one ``tr.family`` per pattern family (``data-family``, ``data-matched``,
  ``data-kept``, ``data-rejected``, ``data-unverified``, ``data-kernel-hits``,
  ``data-guard-fallbacks``, ``data-kernel-errors``);
- ``table#sites``: one ``tr.site`` per site (``data-site-id``, ``data-pattern``, ``data-op``, ``data-status``,
  ``data-location``, ``data-graph``, and for a mismatch ``data-first-diff-index`` (JSON list),
  ``data-expected``, ``data-got``);
- ``table#near-misses``: one ``tr.near-miss`` per candidate no pattern took (``data-pattern``,
  ``data-anchor``, ``data-location``, ``data-reason``);
- ``table#kernels``: calls per op and path (``tr.kernel-row``: ``data-op``, ``data-path``,
  ``data-calls``);
- per graph ``section.graph`` (``data-graph-id``): per site ``section.site-detail``
  (``data-site-id``, ``data-status``) with the verdict, the node lists (``ul.removed``,
  ``ul.added``, ``ul.edges``), before/after drawings (inline SVG drawn here) and the site's code
  diff (``pre.site-diff``); then the graph's code diff (``pre.code-diff``).
"""

from __future__ import annotations

import html
import json
from typing import Any

import networkx as nx

from . import graph_diff
from .report import Report, SiteRecord, is_kernel_error

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1d2330;max-width:1400px}
h1{font-size:22px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #d8dce4;padding-bottom:4px}
h3{font-size:16px} h4{font-size:14px;margin:0 0 6px 0;font-family:ui-monospace,monospace}
table{border-collapse:collapse;margin:8px 0} th,td{border:1px solid #d8dce4;padding:3px 8px;text-align:left;
vertical-align:top} th{background:#f2f4f8} td.num{text-align:right;font-variant-numeric:tabular-nums}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
pre{background:#f7f8fa;border:1px solid #e3e6ec;padding:8px;overflow-x:auto;white-space:pre}
.st-kept{color:#11772f;font-weight:600} .st-rejected{color:#b3261e;font-weight:600}
.st-unverified,.st-matched{color:#8a6d00;font-weight:600}
.site-detail{border:1px solid #d8dce4;border-radius:6px;padding:10px 12px;margin:12px 0}
.site-detail.rejected{border-color:#e8a39e;background:#fffafa}
.figs{display:flex;gap:16px;flex-wrap:wrap;align-items:flex-start} figure{margin:0}
figcaption{font-size:12px;color:#5b6270} .lists{display:flex;gap:24px;flex-wrap:wrap}
.lists ul{margin:4px 0;padding-left:18px} .del{color:#b3261e} .add{color:#11772f} .hunk{color:#6a4fb3}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px;margin:6px 0} dt{color:#5b6270}
dd{margin:0} .dim{color:#6b7280}
"""

_FILL = {"input": "#eef0f4", "reader": "#eef0f4", "removed": "#fde2e0", "added": "#dcf3e3"}
_STROKE = {"input": "#9aa1ad", "reader": "#9aa1ad", "removed": "#b3261e", "added": "#11772f"}


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _attrs(**kw: Any) -> str:
    return "".join(f' data-{k.replace("_", "-")}="{_e(v)}"' for k, v in kw.items() if v is not None)


def _status(s: str) -> str:
    return f'<span class="st-{_e(s)}">{_e(s)}</span>'


# --- SVG ------------------------------------------------------------------------------------
_svg_count = 0


def _short(target: str) -> str:
    """``aten.native_layer_norm.default`` → ``native_layer_norm``; ``aten.mul.Tensor`` → ``mul.Tensor``."""
    parts = target.split(".")
    if len(parts) >= 3 and parts[0] in ("aten", "prims", "diffusion_fuse"):
        return parts[1] if parts[-1] == "default" else ".".join(parts[1:])
    return target


def svg_graph(sub: dict[str, list], core_role: str, title: str) -> str:
    """A layered drawing of a site subgraph: inputs at the top, then the core nodes, then readers."""
    global _svg_count
    _svg_count += 1
    marker = f"arrow{_svg_count}"
    g = nx.DiGraph()
    info = {d["name"]: d for d in sub["nodes"]}
    g.add_nodes_from(info)
    g.add_edges_from(tuple(e) for e in sub["edges"] if e[0] in info and e[1] in info)
    # Layers: longest path from the top, then every node that has readers pulled down to just
    # above its first reader (inputs sit next to the op they feed instead of all at the top).
    order = list(nx.topological_sort(g))
    layer: dict[str, int] = {}
    for n in order:
        layer[n] = max((layer[p] + 1 for p in g.predecessors(n)), default=0)
    for n in reversed(order):
        succ = [layer[s] for s in g.successors(n)]
        if succ:
            layer[n] = min(succ) - 1
    base = min(layer.values(), default=0)
    rows: dict[int, list[str]] = {}
    for n in sub["nodes"]:
        rows.setdefault(layer[n["name"]] - base, []).append(n["name"])
    box_h, gap_y, gap_x, char_w, pad = 36, 26, 14, 6.6, 10

    def label(d: dict) -> tuple[str, str]:
        top = _short(d["target"]) if d["op"] == "call_function" else d["op"]
        return top, f'{d["name"]}  {d.get("value", "")}'.strip()

    widths = {n: max(len(t) for t in label(info[n])) * char_w + 2 * pad for n in info}
    row_w = {r: sum(widths[n] for n in ns) + gap_x * (len(ns) - 1) for r, ns in rows.items()}
    total_w = max(row_w.values(), default=100) + 20
    pos: dict[str, tuple[float, float]] = {}
    for r in sorted(rows):
        # Order a row by where its nodes' inputs are (fewer crossings), inputs-less nodes first.
        def centre(n: str) -> float:
            xs = [pos[p][0] + widths[p] / 2 for p in g.predecessors(n) if p in pos]
            return sum(xs) / len(xs) if xs else -1.0

        rows[r].sort(key=centre)
        x = 10 + (total_w - 20 - row_w[r]) / 2
        y = 10 + r * (box_h + gap_y)
        for n in rows[r]:
            pos[n] = (x, y)
            x += widths[n] + gap_x
    total_h = 20 + (max(rows, default=0) + 1) * (box_h + gap_y) - gap_y
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0f}" height="{total_h:.0f}" '
             f'viewBox="0 0 {total_w:.0f} {total_h:.0f}" role="img" aria-label="{_e(title)}">',
             f'<defs><marker id="{marker}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
             f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#6b7280"/></marker></defs>']
    for u, v in g.edges:
        x1, y1 = pos[u][0] + widths[u] / 2, pos[u][1] + box_h
        x2, y2 = pos[v][0] + widths[v] / 2, pos[v][1]
        my = (y1 + y2) / 2 if y2 - y1 <= box_h + gap_y else y1 + gap_y / 2
        parts.append(f'<path d="M{x1:.1f},{y1:.1f} C{x1:.1f},{my:.1f} {x2:.1f},{y2 - gap_y / 2:.1f} {x2:.1f},{y2:.1f}" '
                     f'fill="none" stroke="#6b7280" stroke-width="1.2" marker-end="url(#{marker})"/>')
    for n, d in info.items():
        role = core_role if d["role"] == "core" else d["role"]
        x, y = pos[n]
        top, bottom = label(d)
        dash = ' stroke-dasharray="4 3"' if role in ("input", "reader") else ""
        parts.append(f'<g class="node {role}" data-node="{_e(n)}"><title>{_e(d.get("code", n))}</title>'
                     f'<rect x="{x:.1f}" y="{y:.1f}" width="{widths[n]:.1f}" height="{box_h}" rx="5" '
                     f'fill="{_FILL[role]}" stroke="{_STROKE[role]}"{dash}/>'
                     f'<text x="{x + pad:.1f}" y="{y + 15:.1f}" font-family="monospace" font-size="11" '
                     f'font-weight="600">{_e(top)}</text>'
                     f'<text x="{x + pad:.1f}" y="{y + 29:.1f}" font-family="monospace" font-size="10" '
                     f'fill="#4b5563">{_e(bottom)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


# --- pieces -----------------------------------------------------------------------------------
def _diff_pre(text: str, cls: str, **data: Any) -> str:
    lines = []
    for ln in text.splitlines():
        c = ("del" if ln.startswith("-") and not ln.startswith("---") else
             "add" if ln.startswith("+") and not ln.startswith("+++") else
             "hunk" if ln.startswith("@@") else "")
        lines.append(f'<span class="{c}">{_e(ln)}</span>' if c else _e(ln))
    return f'<pre class="{cls}"{_attrs(**data)}>' + "\n".join(lines) + "</pre>"


def _table(headers: list[str], rows: list[str], table_id: str) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _summary(report: Report) -> str:
    rows = []
    for d in report.summary():
        keys = {k.replace(" ", "_"): v for k, v in d.items()}
        cells = "".join(f"<td>{_e(v)}</td>" if i == 0 else f'<td class="num">{_e(v)}</td>'
                        for i, v in enumerate(d.values()))
        rows.append(f'<tr class="family"{_attrs(**keys)}>{cells}</tr>')
    total = report.total_row()
    keys = {k.replace(" ", "_"): v for k, v in zip(Report.SUMMARY_HEADERS[1:], total[1:])}
    cells = "".join(f"<th>{_e(v)}</th>" if i == 0 else f'<th class="num">{_e(v)}</th>' for i, v in enumerate(total))
    rows.append(f'<tr class="total"{_attrs(**keys)}>{cells}</tr>')
    return _table(Report.SUMMARY_HEADERS, rows, "summary")


def _verdict_text(s: SiteRecord) -> str:
    if s.status == "rejected":
        return s.reason
    return s.verdict or ("not verified (verify=False)" if s.status == "unverified" else "not judged yet")


def _diff_attrs(s: SiteRecord) -> dict[str, Any]:
    fd = s.first_diff
    if not fd:
        return {}
    return {"first_diff_index": json.dumps(fd["index"]), "first_diff_output": fd.get("output"),
            "expected": repr(fd["expected"]), "got": repr(fd["got"]), "differing": fd["count"]}


def _site_anchor(graph_id: int, sid: str) -> str:
    return "site-" + str(graph_id) + "-" + "".join(c if c.isalnum() else "-" for c in sid)


def _sites(report: Report) -> str:
    rows = []
    for g in report.graphs:
        for s in g.sites.values():
            first = s.first_diff
            diff_cell = (f"{_e(first['index'])}: expected {_e(repr(first['expected']))}, got {_e(repr(first['got']))}"
                         if first else "")
            rows.append(
                '<tr class="site"' + _attrs(site_id=s.id, pattern=s.pattern, op=s.after, status=s.status,
                                            location=s.location, graph=g.graph_id, **_diff_attrs(s)) + '>'
                f'<td class="mono"><a href="#{_site_anchor(g.graph_id, s.id)}">{_e(s.id)}</a></td>'
                f"<td>{_status(s.status)}</td><td class=\"mono\">{_e(s.location)}</td>"
                f'<td class="mono">{_e(" ".join(s.before))}</td><td class="mono">{_e(s.after)}'
                f'{f" ×{s.ops}" if s.ops > 1 else ""}</td>'
                f'<td class="mono">{_e(", ".join(s.input_shapes) or s.shapes)}</td>'
                f'<td class="mono">{_e(", ".join(s.output_shapes))}</td>'
                f"<td>{_e(_verdict_text(s))}</td><td class=\"mono\">{diff_cell}</td></tr>")
    return _table(["site", "status", "source", "ATen ops before", "op after", "inputs", "outputs", "verdict",
                   "first differing element"], rows, "sites")


def _near_misses(report: Report) -> str:
    rows = ['<tr class="near-miss"' + _attrs(pattern=m.pattern, anchor=m.anchor, location=m.location,
                                             reason=m.reason, graph=g.graph_id) + '>'
            f"<td>{_e(m.pattern)}</td><td class=\"mono\">{_e(m.anchor)}</td><td class=\"mono\">{_e(m.target)}</td>"
            f"<td class=\"mono\">{_e(m.shape)}</td><td class=\"mono\">{_e(m.location)}</td><td>{_e(m.reason)}</td></tr>"
            for g in report.graphs for m in g.near_misses]
    if not rows:
        return '<p id="near-misses-none">No near misses: every candidate anchor was matched or not a candidate.</p>'
    return _table(["pattern", "anchor", "op", "shape", "source", "why not"], rows, "near-misses")


def _kernels(report: Report) -> str:
    ctr = report.counters()
    rows = []
    for op, n in sorted(ctr["kernel"].items()):
        rows.append(f'<tr class="kernel-row"{_attrs(op=op, path="kernel", calls=n)}><td class="mono">{_e(op)}</td>'
                    f'<td>kernel</td><td></td><td class="num">{n}</td></tr>')
    for op, reasons in sorted(ctr["fallback"].items()):
        for reason, n in reasons.items():
            path = "kernel error" if is_kernel_error(reason) else "reference (guard)"
            rows.append(f'<tr class="kernel-row"{_attrs(op=op, path=path, reason=reason, calls=n)}>'
                        f'<td class="mono">{_e(op)}</td><td>{_e(path)}</td><td>{_e(reason)}</td>'
                        f'<td class="num">{n}</td></tr>')
    if not rows:
        return '<p id="kernels-none">No diffusion_fuse op ran.</p>'
    return _table(["op", "path", "because", "calls"], rows, "kernels")


def _node_list(nodes: list[dict], names: list[str], cls: str) -> str:
    by = {d["name"]: d for d in nodes}
    items = []
    for n in names:
        d = by.get(n, {})
        value = f' <span class="dim">→ {_e(d["value"])}</span>' if d.get("value") else ""
        items.append(f'<li class="mono" data-node="{_e(n)}">{_e(d.get("code", n))}{value}</li>')
    return f'<ul class="{cls}">{"".join(items) or "<li>-</li>"}</ul>'


def _edge_list(sub: dict[str, list], cls: str) -> str:
    items = [f'<li class="mono" data-src="{_e(u)}" data-dst="{_e(v)}">{_e(u)} → {_e(v)}</li>' for u, v in sub["edges"]]
    return f'<ul class="edges {cls}">{"".join(items) or "<li>-</li>"}</ul>'


def _site_detail(g: Any, sid: str, grp: dict[str, Any] | None) -> str:
    s: SiteRecord | None = g.sites.get(sid)
    status = s.status if s else "?"
    out = [f'<section class="site-detail {_e(status)}" id="{_site_anchor(g.graph_id, sid)}"'
           f'{_attrs(site_id=sid, status=status, graph=g.graph_id, **(_diff_attrs(s) if s else {}))}>',
           f"<h4>{_e(sid)}</h4>"]
    if s is not None:
        fields = [("status", _status(s.status)), ("verdict", _e(_verdict_text(s))), ("source", _e(s.location)),
                  ("pattern", _e(f"{s.pattern} (tier {s.tier}, {'exact' if s.exact else 'within tolerance'})")),
                  ("before", f'<span class="mono">{_e(" ".join(s.before))}</span>'),
                  ("after", f'<span class="mono">{_e(s.after)}{f" ×{s.ops}" if s.ops > 1 else ""}</span>'),
                  ("inputs", "<br>".join(f'<span class="mono">{_e(n)}: {_e(v)}</span>'
                                         for n, v in zip(s.input_nodes, s.input_shapes))),
                  ("outputs", "<br>".join(f'<span class="mono">{_e(n)}: {_e(v)}</span>'
                                          for n, v in zip(s.output_nodes, s.output_shapes)))]
        out.append("<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in fields) + "</dl>")
    if grp is not None:
        out.append('<div class="figs">'
                   f'<figure class="before"><figcaption>before: ATen nodes removed (red), with the nodes that feed '
                   f'and read them</figcaption>{svg_graph(grp["before"], "removed", sid + " before")}</figure>'
                   f'<figure class="after"><figcaption>after: nodes the rewrite created (green)</figcaption>'
                   f'{svg_graph(grp["after"], "added", sid + " after")}</figure></div>')
        out.append('<details><summary>node lists and edges</summary><div class="lists">'
                   f'<div><b>removed</b>{_node_list(grp["before"]["nodes"], grp["removed"], "removed")}'
                   f'<b>edges before</b>{_edge_list(grp["before"], "before")}</div>'
                   f'<div><b>added</b>{_node_list(grp["after"]["nodes"], grp["added"], "added")}'
                   f'<b>edges after</b>{_edge_list(grp["after"], "after")}</div></div></details>')
        if grp["code_diff"]:
            out.append(_diff_pre(grp["code_diff"], "site-diff", site_id=sid))
    out.append("</section>")
    return "".join(out)


def _kernel_sources(g: Any) -> str:
    """Per kept site, the source files of its kernels, and the graph that runs' file if written (as paths: the page
    is self-contained)."""
    rows = "".join(
        f'<li{_attrs(site=sid)}><span class="mono">{_e(sid)}</span>: '
        + (", ".join(f'<span class="mono kernel-source">{_e(f)}</span>' for f in files) or "no kernel generated")
        + "</li>"
        for sid, files in g.kernel_sources.items() if sid in g.sites and g.sites[sid].status != "rejected")
    dump = (f'<p>The graph that runs: <span class="mono graph-file">{_e(g.graph_file)}</span></p>'
            if g.graph_file else "")
    return f'<details class="kernel-sources"><summary>kernel sources</summary>{dump}<ul>{rows}</ul></details>'


def _graph_section(g: Any) -> str:
    d = graph_diff.graph_diff(g)
    attrs = _attrs(graph_id=g.graph_id, kind=g.kind, quality=g.quality)
    head = f'<section class="graph" id="graph-{g.graph_id}"{attrs}>'
    title = f"<h2>Graph {g.graph_id} ({_e(g.kind)}, tier {_e(g.quality)})</h2>"
    if d is None:
        notes = "".join(f"<li>{_e(n)}</li>" for n in g.notes)
        return f"{head}{title}<p>No graph data (nothing rewritten).</p><ul>{notes}</ul></section>"
    out = [head, title,
           f'<p class="graph-stats"{_attrs(removed=len(d["removed"]), added=len(d["added"]))}>'
           f'{len(g.ref_graph["nodes"])} nodes before, {len(g.fused_graph["nodes"])} after every site is rewritten: '
           f'{len(d["removed"])} removed, {len(d["added"])} added; {d["edges_removed"]} edges removed, '
           f'{d["edges_added"]} added. Families searched: {_e(", ".join(g.families) or "-")}.</p>']
    if g.notes:
        out.append("<ul class=\"notes\">" + "".join(f"<li>{_e(n)}</li>" for n in g.notes) + "</ul>")
    if g.kernel_sources:
        out.append(_kernel_sources(g))
    for sid in g.sites:
        out.append(_site_detail(g, sid, d["sites"].get(sid)))
    if d["unattributed"]:
        u = d["unattributed"]
        out.append(f'<section class="unattributed"><h4>changes no site accounts for</h4>'
                   f'removed {_node_list(u["before"]["nodes"], u["removed"], "removed")}'
                   f'added {_node_list(u["after"]["nodes"], u["added"], "added")}</section>')
    text = graph_diff.code_diff(g)
    runs = ("graph that runs" if g.quality == "lossless"
            else "the verifier's ATen view (Inductor compiles the same sites)")
    out.append(f"<details><summary>graph code diff (ATen graph → {runs})</summary>"
               f"{_diff_pre(text or '(no change)', 'code-diff', graph=g.graph_id)}</details>")
    out.append("</section>")
    return "".join(out)


def render(report: Report, title: str = "diffusion_fuse report") -> str:
    sites = report.sites()
    n_rej = sum(s.status == "rejected" for s in sites)
    n_nm = sum(len(g.near_misses) for g in report.graphs)
    body = [
        f"<h1>{_e(title)}</h1>",
        f'<p id="overview"{_attrs(graphs=len(report.graphs), sites=len(sites), rejected=n_rej, near_misses=n_nm)}>'
        f"{len(report.graphs)} graph(s), {len(sites)} site(s) matched, "
        f"{sum(s.status == 'kept' for s in sites)} kept, {n_rej} rejected, {n_nm} near miss(es).</p>",
        "<h2>Summary per pattern family</h2>",
        "<p>Sites per family and the calls of its ops since the report was made (the verifier's checks "
        "included): kernel, reference path chosen by a guard, reference path after a kernel error.</p>",
        _summary(report),
        "<h2>Sites</h2>", _sites(report) if sites else '<p id="sites-none">No site matched.</p>',
        "<h2>Near misses</h2>", _near_misses(report),
        "<h2>Kernel calls</h2>", _kernels(report),
    ]
    notes = [f"graph {g.graph_id}: {n}" for g in report.graphs for n in g.notes]
    if notes:
        body.append("<h2>Notes</h2><ul id=\"notes\">" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    body.extend(_graph_section(g) for g in report.graphs)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
