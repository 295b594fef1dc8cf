"""Pass: find every enabled pattern's sites and replace them with their ops.

All sites are matched on the graph as it comes in, then applied in graph order, so a
site's decision never depends on a rewrite done before it and the site ids (pattern @
anchor node name) are the same in every rebuild: the verifier can exclude one and rebuild.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from ..log import error_message, get_logger
from ..lowering.spec import static_check
from ..lowering.user_ops import GuardedReplacement
from ..patterns.match_utils import source_location
from ..patterns.registry import REGISTRY, NearMiss, Site
from ..verify.verifier import SiteCheck
from .base import GraphPass, PassContext, register_pass, source_digest

_log = get_logger("fxpasses")


def _check_closed(site: Site) -> str | None:
    """A site may only be read from outside through its outputs."""
    inside = set(site.nodes)
    outs = set(site.outputs)
    for n in site.nodes:
        if n in outs:
            continue
        for user in n.users:
            if user not in inside:
                return f"{n.name} is also used by {user.name}, outside the site"
    return None


def _assign_keys(sites: list[Site]) -> None:
    """``pattern@file:line#k``: the k-th site of that pattern at that source line, in graph order.

    The same model traced again (another tier, a rebuild) gives the same keys, so verdicts
    carry over; with no stack trace the anchor name stands in for the line.
    """
    seen: dict[str, int] = {}
    for site in sites:
        loc = source_location(site.located_at)
        base = f"{site.pattern}@{loc if loc != '?' else site.anchor.name}"
        k = seen.get(base, 0)
        seen[base] = k + 1
        site.key = f"{base}#{k}"


def _propagate_fake(nodes: list[fx.Node]) -> None:
    """Fill ``meta['val']`` of new nodes by running them on the fake values of their inputs."""
    vals = [a.meta.get("val") for n in nodes for a in n.all_input_nodes]
    fake_mode = torch._guards.detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    if fake_mode is None:
        return
    with fake_mode:
        for n in nodes:
            if any(a.meta.get("val") is None for a in n.all_input_nodes):
                return
            args, kwargs = fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta["val"])
            n.meta["val"] = n.target(*args, **kwargs)


def static_problem(site: Site) -> str:
    """Why an op the site becomes could never run its kernel, by the op's static guard on the inputs' fake values
    (lowering/spec.py), or ''. Without fake values the guard decides at run time."""
    vals = [n.meta.get("val") for n in site.inputs]
    if any(v is None for v in vals):
        return ""
    g = fx.Graph()
    phs = []
    for i, v in enumerate(vals):
        ph = g.placeholder(f"in_{i}")
        ph.meta["val"] = v
        phs.append(ph)
    try:
        site.emit(g, phs)
        calls = [n for n in g.nodes if n.op == "call_function"]
        _propagate_fake(calls)
    except Exception:  # noqa: BLE001 - a site that cannot be emitted is apply_site's to report
        return ""
    for n in calls:
        if all(a.meta.get("val") is not None for a in n.all_input_nodes):
            why = static_check(n.target, fx.node.map_arg(n.args, lambda a: a.meta["val"]))
            if why:
                return why
    return ""


REF_NAME = "diffusion_fuse_ref"
SITE_ID = "diffusion_fuse_site"  # meta of the nodes a site's replacement made


def ref_name(node: fx.Node) -> str:
    """The name of the reference-graph node whose value ``node`` holds."""
    return node.meta.get(REF_NAME, node.name)


def has_reference(node: fx.Node) -> bool:
    """Whether the reference graph holds ``node``'s value: a node of the traced graph, or a site's output."""
    return REF_NAME in node.meta or SITE_ID not in node.meta


def site_check(site: Site) -> SiteCheck:
    """What the verifier needs to judge ``site`` on the reference graph: its replacement as a small graph, and the
    reference-graph names of the values it reads and replaces."""
    g = fx.Graph()
    phs = [g.placeholder(f"in_{i}") for i in range(len(site.inputs))]
    g.output(tuple(site.emit(g, phs)))
    return SiteCheck(id=site.id, inputs=[ref_name(n) for n in site.inputs], outputs=[ref_name(n) for n in site.outputs],
                     replacement=fx.GraphModule(torch.nn.Module(), g), exact=site.exact, diagnose=site.diagnose)


def _last_in_order(nodes: list[fx.Node]) -> fx.Node:
    order = {n: i for i, n in enumerate(nodes[0].graph.nodes)}
    return max(nodes, key=order.__getitem__)


def apply_site(graph: fx.Graph, site: Site, mapping: dict[fx.Node, fx.Node]) -> list[fx.Node]:
    """Emit ``site``'s replacement before its last node and reroute its outputs."""
    inputs = [mapping.get(n, n) for n in site.inputs]
    before = set(graph.nodes)
    try:
        where = site.insert_before if site.insert_before is not None else _last_in_order(site.nodes)
        with graph.inserting_before(where):
            new_outs = list(site.emit(graph, inputs))
        created = [n for n in graph.nodes if n not in before]
        trace = site.located_at.meta.get("stack_trace")
        for n in created:
            n.meta["stack_trace"] = trace
            n.meta[SITE_ID] = site.id
        _propagate_fake(created)
    except Exception:
        for n in reversed([n for n in graph.nodes if n not in before]):  # nothing outside reads them yet
            graph.erase_node(n)
        raise
    for old, new in zip(site.outputs, new_outs):
        old.replace_all_uses_with(new)
        mapping[old] = new
        # The verifier runs sites on the reference graph: a later site reading this value
        # names it by the node it replaced there.
        new.meta[REF_NAME] = ref_name(old)
    for n in reversed(site.nodes):
        if not n.users:
            graph.erase_node(n)
    return new_outs


def in_order(graph: fx.Graph) -> bool:
    """Whether every node comes after its inputs."""
    seen: set[fx.Node] = set()
    for n in graph.nodes:
        if not seen.issuperset(n.all_input_nodes):
            return False
        seen.add(n)
    return True


def stable_topological_sort(graph: fx.Graph) -> None:
    """Move any node that comes before one of its inputs after it; otherwise keep the order.

    Walked in graph order: a node whose inputs are all placed goes right after the last placed node, then whatever
    waited for it; one that is not waits for the first input it lacks. (Inductor's pattern matcher has such a sort;
    importing it costs 1.5 to 2.5 s of the first call.)"""
    if in_order(graph):  # the usual case
        return
    placed: set[fx.Node] = set()
    waiting: dict[fx.Node, list[fx.Node]] = {}
    last: fx.Node | None = None
    for node in list(graph.nodes):
        ready = [node]
        while ready:
            n = ready.pop()
            lacking = next((a for a in n.all_input_nodes if a not in placed), None)
            if lacking is not None:
                waiting.setdefault(lacking, []).append(n)
                continue
            placed.add(n)
            if last is not None and last.next is not n:
                last.append(n)
            last = n
            ready.extend(reversed(waiting.pop(n, [])))
    if waiting:
        raise RuntimeError(f"graph has a cycle through {next(iter(waiting))}")


@register_pass
class FusePatternsPass(GraphPass):
    name = "fuse_patterns"
    after = ("cat_of_slices",)

    def config_key(self) -> str:
        # The uuid must change when the set of families or their code changes.
        parts = []
        for fam in sorted(REGISTRY.families(), key=lambda f: f.name):
            parts.append(f"{fam.name}:{fam.tier}:{source_digest(type(fam))}")
        return "|".join(parts)

    def __call__(self, graph: fx.Graph, ctx: PassContext) -> None:
        searched = REGISTRY.searched(ctx.options)
        _note_unsearched_user_patterns(ctx, searched)
        by_anchor = REGISTRY.by_anchor(searched)
        if not by_anchor:
            return
        claimed: set[fx.Node] = set()
        chosen: list[Site] = []
        names = {f.name for f in searched}
        for node in list(graph.nodes):
            if node.op != "call_function" or node in claimed:
                continue  # an anchor inside a site chosen before (a quantizer a norm site took) is not tried
            misses: list[NearMiss] = []
            for fam in by_anchor.get(node.target, ()):
                try:
                    res = None if fam.yields_to in names and fam.yields(node) else fam.match(node)
                except Exception as e:  # noqa: BLE001 - a broken matcher must not break compilation
                    res = NearMiss(fam.name, node, f"matcher raised {type(e).__name__}: {e}")
                if res is None:
                    continue
                if isinstance(res, NearMiss):
                    misses.append(res)
                    continue
                problem = _check_closed(res)
                if problem is None and claimed.intersection(res.nodes):
                    problem = "overlaps a site matched before it"
                if problem is None:
                    problem = static_problem(res) or None
                if problem is not None:
                    misses.append(NearMiss(fam.name, node, problem))
                    continue
                claimed.update(res.nodes)
                chosen.append(guarded(res) if res.user is not None and not ctx.inline_user_sites else res)
                misses = []  # an anchor a family took is no near miss of the families tried before it
                break
            ctx.near_misses.extend(misses)
        apply_sites(graph, ctx, chosen)
        found = {s.pattern for s in chosen}
        for fam in searched:
            if fam.user and fam.name not in found:
                ctx.notes.append(f"user pattern {fam.name!r}: no site in this graph")


def _note_unsearched_user_patterns(ctx: PassContext, searched: list) -> None:
    """A user pattern the options leave out without the user asking (a tier-high one under tier lossless) is noted
    and logged: a registered pattern is never silently unused."""
    names = {f.name for f in searched}
    for fam in REGISTRY.families():
        if fam.user and fam.name not in names and fam.name not in ctx.options.patterns:
            why = (f"user pattern {fam.name!r} (tier {fam.tier}) is not searched in tier {ctx.options.quality}"
                   + (" (options={'quality': 'high'} searches it)" if fam.tier == "high" else ""))
            if not ctx.exclude:  # once per graph, not again in the verifier's rebuilds
                _log.warning(why)
            ctx.notes.append(why)


def guarded(site: Site) -> Site:
    """``site`` (a user pattern's) emitting one guarded call: its replacement, or its reference when that raises
    (lowering/user_ops.py)."""
    replacement, reference = site.user
    op = GuardedReplacement(site.pattern, replacement, reference)

    def emit(graph: fx.Graph, ins):
        return [graph.call_function(op, tuple(ins))]

    return dataclasses.replace(site, emit=emit)


def apply_sites(graph: fx.Graph, ctx: PassContext, sites: list[Site]) -> None:
    """Key ``sites``, skip those the verifier excluded, rewrite the rest in order; record both in ``ctx``."""
    _assign_keys(sites)
    ctx.skipped.extend(s for s in sites if s.id in ctx.exclude)
    sites = [s for s in sites if s.id not in ctx.exclude]
    mapping: dict[fx.Node, fx.Node] = {}
    applied = []
    for site in sites:
        try:
            apply_site(graph, site, mapping)
        except Exception as e:  # noqa: BLE001 - a site that cannot be emitted stays as traced, not a failed compile
            why = f"rewrite failed ({error_message(e)}); left as traced"
            ctx.near_misses.append(NearMiss(site.pattern, site.anchor, why))
            _log.warning("site %s: %s", site.id, why)
            continue
        applied.append(site)
    ctx.sites.extend(applied)
    if applied:
        stable_topological_sort(graph)
