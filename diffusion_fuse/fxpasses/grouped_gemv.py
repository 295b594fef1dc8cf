"""Pass: the linears of one short input become one ``grouped_gemv`` (patterns/grouped_gemv.py says which).

Two steps, both in graph order:
1. identical pure ops on the same input, read by such linears, are computed once (a block's ``silu(temb)`` is
   traced once per block): later copies' readers read the first. The same op on the same values gives the same
   bits, so this is exact by construction; the report notes it.
2. the linears that read one node are one site (two or more members), emitted where the first member was.
Runs after the families (a linear a family took is gone) and before the pointwise pass (which would take the
duplicate ``silu`` nodes into its kernels). Lossless tier only.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..lowering.grouped_gemv import member_problem
from ..patterns.grouped_gemv import GroupedGemv, group_site, member_of
from ..patterns.match_utils import val
from .base import GraphPass, PassContext, call_key, note_rewrites, register_pass
from .fuse_patterns import apply_sites

aten = torch.ops.aten

# Ops whose output is a function of their arguments alone (no randomness, no aliasing): one call stands for all.
PURE_OPS = frozenset({aten.silu.default, aten.gelu.default, aten.relu.default, aten.sigmoid.default,
                      aten.tanh.default, aten._to_copy.default, aten.mul.Tensor, aten.add.Tensor})


def _cse_inputs(graph: fx.Graph, members: list[fx.Node]) -> list[str]:
    """Step 1 on the inputs of ``members``; returns the names of the nodes it removed. The copy that comes
    first in the graph stays: every reader of a later one comes after it. A node the graph returns is left
    alone: two outputs must not become one tensor (the caller may change one in place)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    copies: dict[tuple, set[fx.Node]] = {}
    for n in members:
        x = member_of(n)[0]
        if x.op != "call_function" or x.target not in PURE_OPS or any(u.op == "output" for u in x.users):
            continue
        key = call_key(x)
        if key is not None:
            copies.setdefault(key, set()).add(x)
    removed = []
    for xs in copies.values():
        keep, *rest = sorted(xs, key=order.__getitem__)
        for x in rest:
            x.replace_all_uses_with(keep)
            graph.erase_node(x)
            removed.append(x.name)
    return removed


def _member(n: fx.Node) -> bool:
    m = member_of(n)
    return m is not None and not member_problem(val(m[0]), val(m[1]))


@register_pass
class GroupedGemvPass(GraphPass):
    name = "grouped_gemv"
    after = ("fuse_patterns",)

    def __call__(self, graph: fx.Graph, ctx: PassContext) -> None:
        if ctx.options.quality != "lossless" or not ctx.options.pattern_enabled(GroupedGemv.name, "lossless"):
            return
        members = [n for n in graph.nodes if _member(n)]
        if len(members) < 2:
            return
        note_rewrites(ctx, self.name, _cse_inputs(graph, members),
                      "identical op(s) on the same input computed once (the modulation linears' silu(temb))")
        groups: dict[fx.Node, list[fx.Node]] = {}
        for n in members:
            groups.setdefault(member_of(n)[0], []).append(n)
        apply_sites(graph, ctx, [group_site(g) for g in groups.values() if len(g) >= 2])
