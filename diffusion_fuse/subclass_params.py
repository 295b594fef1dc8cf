"""Tensor-subclass parameters (torchao's Float8 weights) flattened once, at compile time, instead of every call.

AOTAutograd runs a graph whose inputs include traceable tensor subclasses by flattening each of them on every
call (``runtime_unwrap_tensor_subclasses``: ``__tensor_flatten__`` per subclass, recursively, plus size and stride
bookkeeping), before anything is launched: host time per forward that grows with the number of Float8 weights and,
under CUDA graphs, is most of the host time.

Here the backend hands AOTAutograd the Dynamo graph with each subclass *parameter* replaced by placeholders for its
inner tensors and a ``rebuild_subclass`` node that puts the subclass back together (``__tensor_unflatten__`` with
the metadata recorded now). AOTAutograd traces through that node, so the graph it compiles is the same ATen graph
over the same inner tensors, and sees only plain inputs. At run time ``SubclassParams.unwrap`` takes the inner
tensors out of the arguments with one ``getattr`` per inner tensor name recorded here.

Why that is safe:

- Only parameters are flattened (Dynamo marks them static); inputs that are activations stay as they were.
- The names of the inner tensors and the metadata (``ctx``) are those of ``__tensor_flatten__`` at compile time.
  Dynamo guards every subclass input's ``__tensor_flatten__`` metadata (its ``metadata_checker`` guard), so a
  weight whose metadata changes recompiles; the unwrap reads the inner tensors afresh on every call (a weight
  updated in place or whose inner tensor was replaced is used as it is now), and checks the subclass's type.
- Inner tensors that are subclasses themselves are flattened recursively.
- Anything unexpected (symbolic sizes, a failed trace) leaves the graph as it came, logged.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .log import get_logger

_log = get_logger("backend")


@dataclasses.dataclass(frozen=True)
class SubclassSpec:
    """How one subclass tensor flattens: its type, inner tensor names (each plain or a nested spec), metadata."""

    cls: type
    attrs: tuple[str, ...]
    children: tuple[SubclassSpec | None, ...]
    ctx: Any
    size: tuple[int, ...]
    stride: tuple[int, ...]

    @staticmethod
    def of(t: torch.Tensor) -> SubclassSpec:
        attrs, ctx = t.__tensor_flatten__()
        children = tuple(SubclassSpec.of(getattr(t, a)) if is_traceable_wrapper_subclass(getattr(t, a)) else None
                         for a in attrs)
        return SubclassSpec(type(t), tuple(attrs), children, ctx, tuple(t.size()), tuple(t.stride()))

    def leaves(self, t: torch.Tensor) -> list[torch.Tensor]:
        """The plain inner tensors of ``t`` in flattening order (the placeholders' order)."""
        out: list[torch.Tensor] = []
        self.unwrap_into(t, out)
        return out

    def unwrap_into(self, t: Any, out: list) -> None:
        if type(t) is not self.cls:
            raise TypeError(f"diffusion_fuse: a parameter compiled as {self.cls.__name__} is now {type(t).__name__}; "
                            "recompile (torch._dynamo.reset()) after replacing weights with another tensor type")
        for attr, child in zip(self.attrs, self.children):
            v = getattr(t, attr)
            if child is None:
                out.append(v)
            else:
                child.unwrap_into(v, out)

    def rebuild(self, leaves) -> torch.Tensor:
        inner = {}
        for attr, child in zip(self.attrs, self.children):
            inner[attr] = next(leaves) if child is None else child.rebuild(leaves)
        return self.cls.__tensor_unflatten__(inner, self.ctx, self.size, self.stride)


_SPECS: dict[int, SubclassSpec] = {}
_SPECS_LOCK = threading.Lock()
_NEXT = itertools.count()


def _register(spec: SubclassSpec) -> int:
    with _SPECS_LOCK:
        key = next(_NEXT)
        _SPECS[key] = spec
    return key


def rebuild_subclass(key: int, *leaves: torch.Tensor) -> torch.Tensor:
    """Graph node: the subclass parameter ``key`` from its inner tensors (traced through by AOTAutograd)."""
    return _SPECS[key].rebuild(iter(leaves))


def _is_static_param(node: fx.Node, value: Any) -> bool:
    static = (node.meta.get("tensor_dict") or {}).get("_dynamo_static_input_type")
    return bool(static) and isinstance(value, torch.nn.Parameter)


class SubclassParams:
    """The flattening of one Dynamo graph's subclass parameters; ``unwrap`` maps Dynamo's arguments to the new ones."""

    def __init__(self, specs: list[SubclassSpec | None]) -> None:
        self.specs = specs
        self.count = sum(s is not None for s in specs)

    def unwrap(self, args: Sequence[Any]) -> list[Any]:
        flat: list[Any] = []
        for a, spec in zip(args, self.specs):
            if spec is None:
                flat.append(a)
            else:
                spec.unwrap_into(a, flat)
        return flat

    def wrap(self, compiled):
        """A callable taking Dynamo's arguments for ``compiled``: AOTAutograd's ``forward`` for a plain GraphModule,
        which Dynamo calls with positional arguments (its ``_boxed_call`` attribute is copied from the inner
        function, not a promise of the boxed convention)."""
        unwrap = self.unwrap

        def run(*args):
            return compiled(*unwrap(args))

        return run


def flatten_subclass_params(gm: fx.GraphModule, example_inputs: Sequence[Any]
                            ) -> tuple[fx.GraphModule, list[Any], SubclassParams] | None:
    """``gm`` with its subclass parameters as inner-tensor placeholders, the matching inputs, and the unwrapper;
    None when there is nothing to flatten or the graph is not one this handles."""
    if not isinstance(gm, fx.GraphModule):
        return None  # e.g. Dynamo's boxed GmWrapper (inputs it flattened itself): left as it is
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    if len(placeholders) != len(example_inputs):
        return None
    specs: list[SubclassSpec | None] = []
    for node, x in zip(placeholders, example_inputs):
        take = is_traceable_wrapper_subclass(x) and _is_static_param(node, x)
        specs.append(SubclassSpec.of(x) if take else None)
    if not any(specs):
        return None
    if any(isinstance(x, torch.SymInt) for x in example_inputs) or any(
            isinstance(s, torch.SymInt) for x in example_inputs if isinstance(x, torch.Tensor) for s in x.shape):
        _log.info("subclass parameters left to AOTAutograd: the graph has symbolic sizes")
        return None
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    rebuilds: list[tuple[fx.Node, SubclassSpec, list[fx.Node]]] = []
    flat_inputs: list[Any] = []
    for node, x, spec in zip(placeholders, example_inputs, specs):
        if spec is None:
            p = graph.placeholder(node.name, type_expr=node.type)
            p.meta = dict(node.meta)
            p._dynamo_source = getattr(node, "_dynamo_source", None)
            env[node] = p
            flat_inputs.append(x)
            continue
        fake = node.meta.get("example_value")
        real_leaves = spec.leaves(x)
        fake_leaves = spec.leaves(fake) if fake is not None else [None] * len(real_leaves)
        inner = []
        for j, (real, fv) in enumerate(zip(real_leaves, fake_leaves)):
            p = graph.placeholder(f"{node.name}_inner{j}")
            p.meta = {k: v for k, v in node.meta.items() if k in ("tensor_dict", "stack_trace", "nn_module_stack")}
            if fv is not None:
                p.meta["example_value"] = fv
            p._dynamo_source = None  # AOTAutograd needs the attribute; None: no guard source of its own
            inner.append(p)
            flat_inputs.append(real)
        rebuilds.append((node, spec, inner))
    for node, spec, inner in rebuilds:
        r = graph.call_function(rebuild_subclass, (_register(spec), *inner))
        r.meta = dict(node.meta)
        env[node] = r
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            env[node] = graph.node_copy(node, lambda n: env[n])
    new = fx.GraphModule(gm, graph)
    new.meta.update(gm.meta)
    if hasattr(gm, "_param_name_to_source"):  # AOTAutograd reads it to tell a Dynamo graph's params
        new._param_name_to_source = gm._param_name_to_source
    params = SubclassParams(specs)
    _log.info("subclass parameters flattened at compile time: %d (%d inner tensors), %d other inputs",
              params.count, len(flat_inputs) - (len(example_inputs) - params.count),
              len(example_inputs) - params.count)
    return new, flat_inputs, params
