"""User patterns: ``diffusion_fuse.register_pattern(name, search, replacement, example_inputs)``.

``search`` and ``replacement`` are plain functions of tensors. Both are traced to ATen
(``make_fx``, no decompositions) on fake tensors made from ``example_inputs`` (no kernel runs; real ones only
where an op has no fake impl); every occurrence of the search graph
in a model's ATen graph (scalars must be equal, intermediate values must have no user
outside the match) is replaced by the replacement graph. The verifier judges each site
like any built-in one: bitwise in tier "lossless", within tolerance in tier "high" when
``exact=False``. At run time a site's replacement is guarded (lowering/user_ops.py): if it raises, the reference
runs for that call (logged, counted as a kernel error). A user pattern a compile does not search (a tier-"high"
one under tier "lossless") or that matched nothing in a graph is noted in that graph's report.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.utils.matcher_utils import InternalMatch, SubgraphMatcher

from .registry import REGISTRY, TIERS, PatternFamily, Site


def _trace(fn: Callable, example_inputs: Sequence[torch.Tensor]) -> fx.GraphModule:
    """``fn`` traced to ATen on fake tensors (no kernel runs: a CUDA-only op with a fake impl traces from CPU
    example inputs); on real ones where fake tracing fails (an op without a fake impl)."""
    try:
        gm = make_fx(fn, tracing_mode="fake")(*example_inputs)
    except Exception:  # noqa: BLE001 - an op without a fake impl: its real kernel gives the trace
        gm = make_fx(fn, tracing_mode="real")(*example_inputs)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


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
        self.search_module = _trace(search, example_inputs)
        self.replacement_module = _trace(replacement, example_inputs)
        self.search_graph, self.replacement_graph = self.search_module.graph, self.replacement_module.graph
        self.user = True
        outs = self.search_graph.output_node().args[0]
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        if len(outs) != 1 or not isinstance(outs[0], fx.Node) or outs[0].op != "call_function":
            raise ValueError(f"register_pattern {name!r}: the search function must return one computed tensor")
        repl_outs = self.replacement_graph.output_node().args[0]
        if isinstance(repl_outs, (list, tuple)) and len(repl_outs) != 1:
            raise ValueError(f"register_pattern {name!r}: the replacement function must return one tensor")
        self.anchors = (outs[0].target,)
        self.variants = (str(self.search_graph).strip(),)
        self._matcher = SubgraphMatcher(self.search_graph, match_output=False, match_placeholder=False,
                                        remove_overlapping_matches=True, ignore_literals=False)
        self._cache: weakref.WeakKeyDictionary[fx.Graph, dict[fx.Node, InternalMatch]] = weakref.WeakKeyDictionary()

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
                    op=f"user::{self.name}", exact=self.exact, user=(self._replacement, self._reference))

    def _replacement(self, *args: torch.Tensor) -> torch.Tensor:
        return _one(self.replacement_module(*args))

    def _reference(self, *args: torch.Tensor) -> torch.Tensor:
        return _one(self.search_module(*args))


def _one(out: object) -> torch.Tensor:
    return out[0] if isinstance(out, (list, tuple)) else out  # type: ignore[return-value]


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
        name.user = True
        return REGISTRY.add(name, replace=replace)
    if search is None or replacement is None or example_inputs is None:
        raise TypeError("register_pattern(name, search, replacement, example_inputs, *, tier='lossless', exact=True)")
    return REGISTRY.add(TracedPattern(name, search, replacement, example_inputs, tier=tier, exact=exact),
                        replace=replace)


def unregister_pattern(name: str) -> None:
    REGISTRY.remove(name)
