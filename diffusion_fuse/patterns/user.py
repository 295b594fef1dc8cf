"""User patterns: ``diffusion_fuse.register_pattern(name, search, replacement, example_inputs)``.

``search`` and ``replacement`` are plain functions of tensors. Both are traced to ATen
(``make_fx``, no decompositions) on ``example_inputs``; every occurrence of the search graph
in a model's ATen graph (scalars must be equal, intermediate values must have no user
outside the match) is replaced by the replacement graph. The verifier judges each site
like any built-in one: bitwise in tier "lossless", within tolerance in tier "high" when
``exact=False``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.utils.matcher_utils import InternalMatch, SubgraphMatcher

from .registry import REGISTRY, TIERS, PatternFamily, Site


def _trace(fn: Callable, example_inputs: Sequence[torch.Tensor]) -> fx.Graph:
    gm = make_fx(fn, tracing_mode="real")(*example_inputs)
    gm.graph.eliminate_dead_code()
    return gm.graph


class TracedPattern(PatternFamily):
    """A family built from a traced search function and a traced replacement function."""

    def __init__(self, name: str, search: Callable, replacement: Callable, example_inputs: Sequence[torch.Tensor],
                 tier: str = "lossless", exact: bool = True, description: str = "") -> None:
        if tier not in TIERS:
            raise ValueError(f"register_pattern: tier={tier!r} is not allowed; allowed: {list(TIERS)}")
        if tier == "lossless" and not exact:
            raise ValueError("register_pattern: exact=False needs tier='high' (lossless sites must be bit-exact)")
        self.name = name
        self.tier = tier
        self.exact = exact
        self.description = description or f"user pattern {name}"
        self.search_graph = _trace(search, example_inputs)
        self.replacement_graph = _trace(replacement, example_inputs)
        outs = self.search_graph.output_node().args[0]
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        if len(outs) != 1 or not isinstance(outs[0], fx.Node) or outs[0].op != "call_function":
            raise ValueError(f"register_pattern {name!r}: the search function must return one computed tensor")
        self.anchors = (outs[0].target,)
        self.variants = (str(self.search_graph).strip(),)
        self._matcher = SubgraphMatcher(self.search_graph, match_output=False, match_placeholder=False,
                                        remove_overlapping_matches=True, ignore_literals=False)
        self._cache: weakref.WeakKeyDictionary[fx.Graph, dict[fx.Node, InternalMatch]] = weakref.WeakKeyDictionary()
        op_nodes = [n for n in self.replacement_graph.nodes if n.op == "call_function"]
        self._op_name = str(op_nodes[-1].target) if op_nodes else "?"

    def _matches(self, graph: fx.Graph) -> dict[fx.Node, InternalMatch]:
        if graph not in self._cache:
            self._cache[graph] = {m.returning_nodes[0]: m for m in self._matcher.match(graph)}
        return self._cache[graph]

    def match(self, node: fx.Node) -> Site | None:
        m = self._matches(node.graph).get(node)
        if m is None:
            return None
        inputs = list(m.placeholder_nodes)
        nodes = [gn for pn, gn in m.nodes_map.items() if pn.op == "call_function"]
        order = {n: i for i, n in enumerate(node.graph.nodes)}
        nodes.sort(key=order.__getitem__)
        repl = self.replacement_graph

        def emit(graph: fx.Graph, ins):
            phs = [n for n in repl.nodes if n.op == "placeholder"]
            out = graph.graph_copy(repl, dict(zip(phs, ins)))
            return list(out) if isinstance(out, (list, tuple)) else [out]

        return Site(pattern=self.name, anchor=node, nodes=nodes, inputs=inputs, outputs=[node], emit=emit,
                    op=self._op_name, exact=self.exact)


def register_pattern(
    name: str | PatternFamily,
    search: Callable | None = None,
    replacement: Callable | None = None,
    example_inputs: Sequence[torch.Tensor] | None = None,
    *,
    tier: str = "lossless",
    exact: bool = True,
    replace: bool = False,
) -> PatternFamily:
    """Add a pattern to the registry; returns the family (``unregister_pattern(name)`` removes it).

    Either pass a ``PatternFamily`` instance, or ``name, search, replacement, example_inputs``.
    """
    if isinstance(name, PatternFamily):
        return REGISTRY.add(name, replace=replace)
    if search is None or replacement is None or example_inputs is None:
        raise TypeError("register_pattern(name, search, replacement, example_inputs, *, tier='lossless', exact=True)")
    return REGISTRY.add(TracedPattern(name, search, replacement, example_inputs, tier=tier, exact=exact),
                        replace=replace)


def unregister_pattern(name: str) -> None:
    REGISTRY.remove(name)
