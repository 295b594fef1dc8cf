"""Verdicts the ranks share: a graph with collectives in it runs in lockstep on every rank of its process groups.

Under context parallelism (diffusers' ``enable_parallelism``) each rank traces and verifies its own shard; the sites
are the same on every rank, their data are not, so a site can be bitwise equal on one rank and not on another. Every
decision the verifier makes on a first call (which sites go back, whether the runtime rewrites stay, whether the
whole graph goes back) is therefore shared before it takes effect: each rank's decision is gathered over the process
groups the graph's collectives use, and the union is what every rank does. All ranks then run the same graph, issue
the same collectives in the same order, and no rank runs a graph again while another waits in a collective.

A graph without collectives, or a process without ``torch.distributed`` initialized, has no ``Agreement``: nothing
to share, nothing communicated. The sharing costs one ``all_gather_object`` per decision and group, on first calls
only. It assumes what collectives in a graph already require: every rank of the group calls the graph on the same
calls (a rank that sees a new input signature alone, as uneven shards can make it, would verify alone).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
import torch.fx as fx

from ..log import get_logger

_log = get_logger("verify")

COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional", "c10d")
WORLD = ""  # the group of a collective whose schema names none


def _namespace(target: object) -> str:
    return getattr(target, "namespace", "") if isinstance(target, torch._ops.OpOverload) else ""


def collective_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The graph's collective ops (functional or not) and their waits, in graph order."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and _namespace(n.target) in COLLECTIVE_NAMESPACES]


def _group_name(node: fx.Node) -> str | None:
    """The process group a collective node names, ``WORLD`` where its schema names none, None for a wait."""
    schema = node.target._schema
    names = [a.name for a in schema.arguments]
    if "group_name" in names:
        i = names.index("group_name")
        value = node.args[i] if i < len(node.args) else node.kwargs.get("group_name")
        return str(value)
    return None if "wait" in schema.name else WORLD


def collectives(gm: fx.GraphModule) -> list[tuple[str, str | None]]:
    """``(op, group)`` for every collective of ``gm`` in graph order: what a rewrite must leave as it found it."""
    return [(str(n.target), _group_name(n)) for n in collective_nodes(gm)]


def group_names(gm: fx.GraphModule) -> tuple[str, ...]:
    return tuple(sorted({g for _, g in collectives(gm) if g is not None}))


def _resolve(name: str) -> dist.ProcessGroup:
    if name == WORLD:
        return dist.group.WORLD
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


class Agreement:
    """The process groups of one graph's collectives, and the union of the ranks' decisions over them.

    The decisions travel over one group when one can carry them: a group of the graph that holds every rank the
    graph's groups hold (diffusers' flattened mesh, which gathers the output), else the default group when those
    ranks are all of them (a ring and a Ulysses mesh in one graph). Otherwise over each group in turn, ordered by
    their ranks, as many rounds as there are groups: after k rounds a rank knows what every rank within k groups of
    it holds.
    """

    def __init__(self, groups: tuple[str, ...]) -> None:
        self.groups = groups
        self.rank = dist.get_rank()
        ranks = {g: tuple(dist.get_process_group_ranks(_resolve(g))) for g in groups}
        every = set().union(*ranks.values())
        cover = [g for g in groups if set(ranks[g]) == every]
        if cover:
            self.rounds = [cover[0]]
        elif every == set(range(dist.get_world_size())):
            self.rounds = [WORLD]
        else:
            order = sorted(groups, key=lambda g: ranks[g])
            self.rounds = order * len(order)

    @classmethod
    def of(cls, gm: fx.GraphModule) -> Agreement | None:
        """The agreement ``gm`` needs: None when it holds no collective or torch.distributed is not initialized."""
        if not (dist.is_available() and dist.is_initialized()):
            return None
        groups = group_names(gm)
        return cls(groups) if groups else None

    def union(self, ids: Iterable[str]) -> dict[str, list[int]]:
        """Every id some rank holds, with the (global) ranks holding it; ``ids`` are this rank's."""
        held = {i: {self.rank} for i in ids}
        for name in self.rounds:
            group = _resolve(name)
            gathered: list[dict[str, set[int]] | None] = [None] * dist.get_world_size(group)
            dist.all_gather_object(gathered, held, group=group)
            for other in gathered:
                for i, ranks in (other or {}).items():
                    held.setdefault(i, set()).update(ranks)
        return {i: sorted(r) for i, r in sorted(held.items())}

    def ranks_where(self, flag: bool) -> list[int]:
        """The ranks where ``flag`` holds (this one's is ``flag``)."""
        return self.union(["flag"] if flag else []).get("flag", [])

    def describe(self) -> str:
        via = sorted(set(self.rounds))
        return f"group(s) {', '.join(repr(g or 'WORLD') for g in via)}"
