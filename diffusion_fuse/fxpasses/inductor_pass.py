"""The pass pipeline as an Inductor post-grad ``CustomGraphPass`` (tier "high")."""

from __future__ import annotations

from collections.abc import Callable

import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from ..config import Options
from .base import PassContext
from .pass_manager import PassManager


class InductorFusePass(CustomGraphPass):
    """Runs ``PassManager`` on Inductor's post-grad graph; hands each context to ``on_context``."""

    def __init__(self, options: Options, on_context: Callable[[fx.Graph, PassContext], None] | None = None,
                 exclude: frozenset[str] = frozenset()) -> None:
        self.pm = PassManager(options, inline_user_sites=True)  # Inductor compiles user ops itself
        self.on_context = on_context
        self.exclude = exclude

    def __call__(self, graph: fx.Graph) -> None:
        ctx = self.pm.run(graph, self.exclude)
        if self.on_context is not None:
            self.on_context(graph, ctx)

    def uuid(self) -> str:
        return f"{self.pm.uuid()}:{sorted(self.exclude)}"
