"""Pass base class and the context passes share.

Every pass has a ``uuid()`` derived from its source and its configuration, so a graph
cache (Inductor's FX graph cache in tier "high") is keyed correctly instead of bypassed.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import inspect
import operator
from collections.abc import Callable

import torch
import torch.fx as fx

from ..config import Options
from ..log import get_logger
from ..patterns.registry import NearMiss, Site


@dataclasses.dataclass
class PassContext:
    """What one run of the pipeline shares between its passes and hands back: the sites rewritten, those
    skipped, near misses and notes for the report."""

    options: Options
    exclude: frozenset[str] = frozenset()  # site ids the verifier put back
    sites: list[Site] = dataclasses.field(default_factory=list)
    skipped: list[Site] = dataclasses.field(default_factory=list)  # matched but excluded
    near_misses: list[NearMiss] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # exact-by-construction rewrites, for the report
    # Inductor's graph (tier high): a user site's replacement is inlined for Inductor to compile, not guarded
    inline_user_sites: bool = False


# ATen views whose schema carries no alias annotation (``reshape`` of a non-contiguous tensor traces to clone +
# ``_unsafe_view``): they alias their input all the same.
UNANNOTATED_VIEWS = frozenset({torch.ops.aten._unsafe_view.default})


def is_fresh(n: fx.Node) -> bool:
    """Whether ``n`` is an ATen op whose (first) result is a new tensor, not a view or in-place result."""
    schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
    return schema is not None and len(schema.returns) >= 1 and schema.returns[0].alias_info is None \
        and n.target not in UNANNOTATED_VIEWS


def view_root(n: fx.Node) -> fx.Node | None:
    """What the view chain ending at ``n`` views: a fresh ATen result or a graph input (``n`` itself when it is
    one), or None (an in-place result or an op of unknown aliasing on the way). ``getitem`` of a multi-result
    op follows the result it takes (a split's pieces are views of its input)."""
    while not is_fresh(n) and n.op != "placeholder":
        if n.op != "call_function" or not n.args or not isinstance(n.args[0], fx.Node):
            return None
        if n.target is operator.getitem:
            op = n.args[0]
            schema = getattr(op.target, "_schema", None) if op.op == "call_function" else None
            if schema is None or not schema.returns:
                return None
            ret = schema.returns[n.args[1] if len(schema.returns) > 1 and isinstance(n.args[1], int) else 0]
            if ret.alias_info is None and op.target not in UNANNOTATED_VIEWS:
                return op  # a fresh result of a multi-result op
            n = op
            continue
        schema = getattr(n.target, "_schema", None)
        ret = schema.returns[0].alias_info if schema is not None and schema.returns else None
        if n.target not in UNANNOTATED_VIEWS and (ret is None or ret.is_write):
            return None
        n = n.args[0]
    return n


def written_args(n: fx.Node) -> list[fx.Node]:
    """The tensors the ATen op ``n`` writes into: the arguments its schema marks mutable (in place, ``out=``)."""
    schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
    if schema is None or not schema.is_mutable:
        return []
    out = []
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            v = n.args[i] if i < len(n.args) else n.kwargs.get(a.name)
            out += [t for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, fx.Node)]
    return out


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


def writes_only_inputs(graph: fx.Graph) -> bool:
    """Whether every in-place or ``out=`` ATen op of ``graph`` writes into graph inputs (or views of them) only."""
    for n in graph.nodes:
        for target in written_args(n):
            root = view_root(target)
            if root is None or root.op != "placeholder":
                return False
    return True


def arg_key(a: object) -> object:
    """``a`` as a dict key that tells apart what ``==`` does not: -0.0 from 0.0, 1.0 from 1 and True."""
    if isinstance(a, fx.Node):
        return a
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(arg_key(v) for v in a))
    if isinstance(a, (bool, int, float)):
        return (type(a).__name__, repr(a))
    return a


def call_key(n: fx.Node) -> tuple | None:
    """What makes two calls the same computation: target, arguments and keyword arguments (None: unhashable)."""
    key = (n.target, arg_key(n.args), arg_key(tuple(sorted(n.kwargs.items()))))
    try:
        hash(key)
    except TypeError:  # an argument with no hash: never the same as another
        return None
    return key


def note_rewrites(ctx: PassContext, pass_name: str, names: list[str], what: str) -> None:
    """The report note and the log line of a pass's exact-by-construction rewrites (the first four named)."""
    if not names:
        return
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    ctx.notes.append(f"{pass_name}: {len(names)} {what}: {shown}")
    get_logger("fxpasses").info("%s: %d %s", pass_name, len(names), what)


class GraphPass:
    """One rewrite of an FX graph, in place. ``after``: the passes that must run before it (the pass manager's
    order is derived from these, fxpasses/pass_manager.py)."""

    name: str = "pass"
    after: tuple[str, ...] = ()

    def __call__(self, graph: fx.Graph, ctx: PassContext) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def config_key(self) -> str:
        return ""

    def uuid(self) -> str:
        return hashlib.sha256(f"{self.name}\0{source_digest(type(self))}\0{self.config_key()}".encode()).hexdigest()


@functools.cache
def source_digest(obj: object) -> str:
    """sha256 of a class's or module's source, or of its repr where there is no source. Cached: the source is read
    once a process (``inspect.getsource`` tokenizes the file, about 10 ms a class, and Inductor asks each tier-high
    compile for every pass's uuid)."""
    try:
        src = inspect.getsource(obj)
    except (OSError, TypeError):
        src = repr(obj)
    return hashlib.sha256(src.encode()).hexdigest()


PASSES: dict[str, type[GraphPass]] = {}


def register_pass(cls: type[GraphPass]) -> type[GraphPass]:
    """Class decorator: a pass of the pipeline (its place follows from ``after``)."""
    if cls.name in PASSES and PASSES[cls.name] is not cls:
        raise ValueError(f"a pass named {cls.name!r} is already registered")
    PASSES[cls.name] = cls
    return cls


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
