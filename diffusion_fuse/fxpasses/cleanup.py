"""Pass: drop what the rewrites left dead, and check the graph is well formed."""

from __future__ import annotations

import torch.fx as fx

from .base import GraphPass, PassContext, register_pass


@register_pass
class CleanupPass(GraphPass):
    name = "cleanup"
    after = ("common_subexpressions",)

    def __call__(self, graph: fx.Graph, ctx: PassContext) -> None:
        graph.eliminate_dead_code()  # keeps impure nodes (in-place copies into inputs)
        graph.lint()
