"""The lossless tier's graphs: the rewritten ATen graph, its rebuilds without rejected sites, what runs in its place,
and the report records of its sites.

``prepare`` runs the pass pipeline once on AOTAutograd's inference graph and returns the ``VerifiedGraph`` that
judges it on the first real call (verify/verifier.py); the verifier asks ``LosslessPipeline`` for rebuilds.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any

import torch.fx as fx

from .config import Options
from .fxpasses import PassManager
from .fxpasses.base import written_args
from .fxpasses.fuse_patterns import ref_name, site_check
from .log import artifact_logger, get_logger, trace_artifact
from .patterns.match_utils import describe, source_location
from .patterns.registry import REGISTRY, Site
from .verify.agree import Agreement, collectives
from .verify.graph_diff import graph_data, op_counts, value_str
from .verify.report import GraphReport, NearMissRecord, Report, SiteRecord
from .verify.verifier import VerifiedGraph

_log = get_logger("backend")
_graphs = artifact_logger("backend", "diffusion_fuse_graphs")


class LosslessPipeline:
    """``build(exclude)``: ``ref`` rewritten by the pass pipeline without the sites in ``exclude``;
    ``runtime(gm)``: the callable that runs in place of ``gm``, with what its runtime rewrites changed."""

    def __init__(self, ref: fx.GraphModule, options: Options) -> None:
        self.ref, self.pm = ref, PassManager(options)

    def build(self, exclude: frozenset[str]) -> fx.GraphModule:
        return self.pm.rewrite(self.ref, exclude)[0]

    def runtime(self, gm: fx.GraphModule, rewrite: bool = True) -> tuple[Callable[..., Any], dict[str, int]]:
        return PassManager.runtime(gm, rewrite)


def site_record(site: Site, tier: str) -> SiteRecord:
    def shape(n: fx.Node) -> str:
        return value_str(n.meta.get("val")) or "?"

    return SiteRecord(
        id=site.id,
        pattern=site.pattern,
        tier=tier,
        exact=site.exact,
        location=source_location(site.located_at),
        before=describe(site.nodes),
        after=site.op,
        shapes=" ".join(shape(n) for n in site.inputs[:1] + site.outputs),
        ops=site.n_ops if site.n_ops is not None else len(site.outputs),
        nodes=[n.name for n in site.nodes],
        input_nodes=[ref_name(n) for n in site.inputs],
        output_nodes=[ref_name(n) for n in site.outputs],
        input_shapes=[shape(n) for n in site.inputs],
        output_shapes=[shape(n) for n in site.outputs],
    )


def mutated_placeholders(gm: fx.GraphModule) -> list[int]:
    """Indices of the graph inputs some node writes in place."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index = {n: i for i, n in enumerate(phs)}
    return sorted({index[t] for n in gm.graph.nodes for t in written_args(n) if t in index})


def prepare(ref: fx.GraphModule, options: Options, graph_report: GraphReport, report: Report) -> VerifiedGraph:
    """Rewrite ``ref``, record its sites and near misses in ``graph_report``, and return its ``VerifiedGraph``."""
    pipeline = LosslessPipeline(ref, options)
    fused, ctx = pipeline.pm.rewrite(ref)
    status = "matched" if options.verify else "unverified"
    created: dict[str, list[str]] = collections.defaultdict(list)
    for n in fused.graph.nodes:
        if "diffusion_fuse_site" in n.meta:
            created[n.meta["diffusion_fuse_site"]].append(n.name)
    for s in ctx.sites:
        rec = site_record(s, "lossless" if s.exact else "high")
        rec.status = status
        rec.created = created.get(s.id, [])
        graph_report.sites[s.id] = rec
    graph_report.notes.extend(ctx.notes)
    for m in ctx.near_misses:
        graph_report.near_misses.append(
            NearMissRecord(m.pattern, m.anchor.name, source_location(m.anchor), m.reason,
                           target=describe([m.anchor])[0], shape=value_str(m.anchor.meta.get("val"))))
    # What the before/after diff needs, as plain data (verify/graph_diff.py, verify/html.py).
    graph_report.families = [f.name for f in REGISTRY.searched(options)]
    graph_report.ref_graph, graph_report.fused_graph = graph_data(ref), graph_data(fused)
    graph_report.ref_code, graph_report.fused_code = ref.code, fused.code
    sites = ctx.sites
    if sites and collectives(fused) != collectives(ref):
        # Every rank must issue the collectives the others do, in the same order: a rewrite may not change them.
        note = "the rewritten graph's collectives differ from the traced graph's: every site put back"
        _log.warning("graph %d: %s", graph_report.graph_id, note)
        graph_report.notes.append(note)
        for s in sites:
            graph_report.sites[s.id].status = "rejected"
            graph_report.sites[s.id].reason = "the rewrite changed the graph's collectives"
        fused, sites = ref, []
    if not sites:
        graph_report.final_code, graph_report.final_ops = ref.code, op_counts(ref)
    elif not options.verify:
        graph_report.final_code, graph_report.final_ops = fused.code, op_counts(fused)
    _log.info("graph %d: %d site(s) rewritten, %d near miss(es)", graph_report.graph_id, len(ctx.sites),
              len(ctx.near_misses))
    if _graphs.isEnabledFor(logging.DEBUG):
        _graphs.debug("graph %d: the ATen graph as traced:\n%s", graph_report.graph_id, ref.code)
        _graphs.debug("graph %d: rewritten (%d site(s)):\n%s", graph_report.graph_id, len(sites), fused.code)
    trace_artifact("diffusion_fuse_graph_before", lambda: ref.code)
    trace_artifact("diffusion_fuse_graph_after", lambda: fused.code)
    agreement = Agreement.of(ref) if options.verify else None
    if agreement is not None:
        graph_report.notes.append(f"collectives in the graph: the verifier's decisions are shared by the ranks of "
                                  f"{agreement.describe()}")
        _log.info("graph %d: collectives over %s; verdicts shared across ranks", graph_report.graph_id,
                  agreement.describe())
    return VerifiedGraph(ref, fused, [site_check(s) for s in sites], mutated_placeholders(ref), pipeline, options,
                         graph_report, report, agreement)
