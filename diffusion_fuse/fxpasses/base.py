"""Pass base class and the context passes share.

Every pass has a ``uuid()`` derived from its source and its configuration, so a graph
cache (Inductor's FX graph cache in tier "high") is keyed correctly instead of bypassed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect

import torch.fx as fx

from ..config import Options
from ..patterns.registry import NearMiss, Site


@dataclasses.dataclass
class PassContext:
    options: Options
    exclude: frozenset[str] = frozenset()  # site ids the verifier put back
    sites: list[Site] = dataclasses.field(default_factory=list)
    skipped: list[Site] = dataclasses.field(default_factory=list)  # matched but excluded
    near_misses: list[NearMiss] = dataclasses.field(default_factory=list)


class GraphPass:
    """One rewrite of an FX graph, in place."""

    name: str = "pass"

    def __call__(self, graph: fx.Graph, ctx: PassContext) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def config_key(self) -> str:
        return ""

    def uuid(self) -> str:
        src = inspect.getsource(type(self))
        return hashlib.sha256(f"{self.name}\0{src}\0{self.config_key()}".encode()).hexdigest()
