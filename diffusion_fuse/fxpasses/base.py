"""Pass base class and the context passes share.

Every pass has a ``uuid()`` derived from its source and its configuration, so a graph
cache (Inductor's FX graph cache in tier "high") is keyed correctly instead of bypassed.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import inspect
from collections.abc import Callable

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
    notes: list[str] = dataclasses.field(default_factory=list)  # exact-by-construction rewrites, for the report


def is_fresh(n: fx.Node) -> bool:
    """Whether ``n`` is an ATen op whose (first) result is a new tensor, not a view or in-place result."""
    schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
    return schema is not None and len(schema.returns) >= 1 and schema.returns[0].alias_info is None


def reaches_output(n: fx.Node) -> bool:
    """Whether ``n`` is a graph output or a view chain from it ends in one."""
    todo, seen = [n], set()
    while todo:
        m = todo.pop()
        for u in m.users:
            if u.op == "output":
                return True
            if u not in seen and not is_fresh(u) and u.op == "call_function":
                seen.add(u)
                todo.append(u)  # a view (or an op of unknown aliasing): follow it
    return False


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


def retarget_calls(gm: fx.GraphModule, change: Callable[[fx.Node], tuple | None]) -> tuple[fx.GraphModule, int]:
    """A copy of ``gm`` in which each call node ``n`` for which ``change(n)`` returns ``(target, args,
    kwargs)`` calls that instead (args and kwargs in terms of ``gm``'s nodes), and how many changed;
    ``gm`` itself when none did. The runtime rewrites (PassManager.runtime) are made of this."""
    graph = fx.Graph()
    graph._codegen = copy.deepcopy(gm.graph._codegen)  # the calling convention stays the traced one
    env: dict[fx.Node, fx.Node] = {}
    n_changed = 0
    for n in gm.graph.nodes:
        new = graph.node_copy(n, env.__getitem__)
        repl = change(n) if n.op == "call_function" else None
        if repl is not None:
            target, args, kwargs = repl
            new.target = target
            new.args, new.kwargs = fx.node.map_arg((tuple(args), dict(kwargs)), env.__getitem__)
            n_changed += 1
        env[n] = new
    if not n_changed:
        return gm, 0
    out = fx.GraphModule(gm, graph)
    out.meta.update(gm.meta)
    return out, n_changed
