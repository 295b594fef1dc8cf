"""Pass: a ``clone`` of a contiguous intermediate that nothing writes to is that intermediate.

Eager's ``nn.Dropout(p)`` in eval mode (``attn.to_out[1]`` in every diffusers attention, the FF's dropout)
returns its input: no kernel. AOTAutograd traces it as ``aten.clone``, so the graph copies the tensor
(FLUX's image ``to_out``: a 28 MB copy per double block, ~12 µs on an H200, eager has none). The pointwise
pass absorbs a clone into the kernel of the chain it ends; the clones left standalone are dropped here.

Rewrites ``y = aten.clone(x)`` to ``x`` when:

* ``x`` is contiguous and ``y`` has ``x``'s sizes and strides (so consumers see the same layout; a
  ``memory_format`` other than preserve/contiguous is left alone);
* ``x``'s storage is fresh: ``x`` is an ATen op's new tensor, or a view chain from one, never a graph
  input (which the graph may write into at its end);
* ``y`` is no graph output, not even through views (AOTAutograd decided at trace time which outputs
  alias one another);
* the graph writes into nothing but its inputs (an inference graph from AOTAutograd is functional; any
  other in-place op and the pass leaves the graph as it is).

Exact by construction: consumers read the same elements; only the copy is gone. Tier high leaves the
clones to Inductor, which removes them itself.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..log import get_logger
from .base import GraphPass, PassContext, is_fresh, reaches_output

_log = get_logger("fxpasses")
aten = torch.ops.aten
_LAYOUT_KEEPING = (None, torch.preserve_format, torch.contiguous_format)


def storage_base(n: fx.Node) -> fx.Node | None:
    """The node whose fresh result ``n`` views (``n`` itself when it is fresh), or None (a graph input,
    or an op of unknown aliasing on the way)."""
    while not is_fresh(n):
        if n.op == "call_function" and n.target is operator.getitem and isinstance(n.args[0], fx.Node):
            n = n.args[0]  # an output of a multi-result op (split: its views; others: fresh)
            continue
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if schema is None or not schema.returns or schema.returns[0].alias_info is None \
                or schema.returns[0].alias_info.is_write or not n.args or not isinstance(n.args[0], fx.Node):
            return None  # a placeholder, an in-place result, or not an ATen view
        n = n.args[0]
    return n


def _written(n: fx.Node) -> list[fx.Node]:
    """The tensors an in-place or ``out=`` ATen op writes into (its schema's mutable arguments)."""
    schema = getattr(n.target, "_schema", None)
    out = []
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            v = n.args[i] if i < len(n.args) else n.kwargs.get(a.name)
            out += [t for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, fx.Node)]
    return out


def _writes_only_inputs(graph: fx.Graph) -> bool:
    """Whether every in-place ATen op of ``graph`` writes into graph inputs (or views of them) only."""
    for n in graph.nodes:
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if schema is None or not schema.is_mutable:
            continue
        for target in _written(n):
            while target.op == "call_function":  # a view chain back to what it views
                s = getattr(target.target, "_schema", None)
                if s is None or not s.returns or s.returns[0].alias_info is None \
                        or not target.args or not isinstance(target.args[0], fx.Node):
                    return False  # writes into a tensor the graph made
                target = target.args[0]
            if target.op != "placeholder":
                return False
    return True


def droppable(n: fx.Node) -> bool:
    """Whether the clone ``n`` can be replaced by its input (the conditions in the module docstring)."""
    if n.op != "call_function" or n.target is not aten.clone.default or not isinstance(n.args[0], fx.Node):
        return False
    x = n.args[0]
    if n.kwargs.get("memory_format") not in _LAYOUT_KEEPING:
        return False
    xv, yv = x.meta.get("val"), n.meta.get("val")
    if not isinstance(xv, torch.Tensor) or not isinstance(yv, torch.Tensor):
        return False
    try:
        same_layout = xv.is_contiguous() and tuple(xv.shape) == tuple(yv.shape) \
            and tuple(xv.stride()) == tuple(yv.stride()) and xv.dtype == yv.dtype
    except Exception:  # noqa: BLE001 - symbolic sizes: not judged
        return False
    return bool(same_layout) and storage_base(x) is not None and not reaches_output(n)


class DropClonesPass(GraphPass):
    name = "drop_clones"

    def __call__(self, graph: fx.Graph, ctx: PassContext) -> None:
        if ctx.options.quality != "lossless" or not _writes_only_inputs(graph):
            return
        done = []
        for n in list(graph.nodes):
            if droppable(n):
                n.replace_all_uses_with(n.args[0])
                graph.erase_node(n)
                done.append(n.name)
        if done:
            shown = ", ".join(done[:4]) + (", ..." if len(done) > 4 else "")
            ctx.notes.append(f"drop_clones: {len(done)} clone(s) of contiguous intermediates read in place "
                             f"(eager's eval-mode Dropout returns its input; no copy): {shown}")
            _log.info("drop_clones: %d standalone clone(s) dropped", len(done))
