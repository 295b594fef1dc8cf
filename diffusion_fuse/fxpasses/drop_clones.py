"""Pass: a ``clone`` of a contiguous intermediate that nothing writes to is that intermediate.

Eager's ``nn.Dropout(p)`` in eval mode (``attn.to_out[1]`` in every diffusers attention, the FF's dropout)
returns its input: no kernel. AOTAutograd up to torch 2.13 traces it as ``aten.clone``, so the graph copies
the tensor (FLUX's image ``to_out``: a 25 MB copy of [1, 4096, 3072] bf16 per double block; eager has none);
torch 2.14 traces no clone. Running before interleave_scatter (whose result clone carries a reference value's
name) and the pointwise pass, this gives those passes the same graph on every torch; the clones left (not
droppable) pointwise absorbs into the kernel of their chain.

Rewrites ``y = aten.clone(x)`` to ``x`` when:

* ``x`` is contiguous and ``y`` has ``x``'s sizes and strides (so consumers see the same layout; a
  ``memory_format`` other than preserve/contiguous is left alone), and ``x`` starts 16-byte aligned within
  its buffer (consumers chose their kernels for the clone's fresh, aligned buffer: vector widths and cuBLAS's
  algorithm depend on alignment);
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

import torch
import torch.fx as fx

from .base import (
    GraphPass,
    PassContext,
    is_fresh,
    note_rewrites,
    reaches_output,
    register_pass,
    view_root,
    writes_only_inputs,
)

aten = torch.ops.aten
_LAYOUT_KEEPING = (None, torch.preserve_format, torch.contiguous_format)
# A consumer of the clone read a fresh (allocator-aligned) buffer; kernels choose their vector width and cuBLAS
# its algorithm by alignment, so the clone's input must start at least this aligned within its buffer.
ALIGN_BYTES = 16


def storage_base(n: fx.Node) -> fx.Node | None:
    """The node whose fresh result ``n`` views (``n`` itself when it is fresh), or None (a graph input, an
    in-place result or an op of unknown aliasing on the way)."""
    root = view_root(n)
    return root if root is not None and is_fresh(root) else None


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
            and tuple(xv.stride()) == tuple(yv.stride()) and xv.dtype == yv.dtype \
            and xv.storage_offset() * xv.element_size() % ALIGN_BYTES == 0
    except Exception:  # noqa: BLE001 - symbolic sizes: not judged
        return False
    return bool(same_layout) and storage_base(x) is not None and not reaches_output(n)


@register_pass
class DropClonesPass(GraphPass):
    name = "drop_clones"
    after = ("grouped_gemv",)

    def __call__(self, graph: fx.Graph, ctx: PassContext) -> None:
        if ctx.options.quality != "lossless" or not writes_only_inputs(graph):
            return
        done = []
        for n in list(graph.nodes):
            if droppable(n):
                n.replace_all_uses_with(n.args[0])
                graph.erase_node(n)
                done.append(n.name)
        note_rewrites(ctx, self.name, done, "clone(s) of contiguous intermediates read in place (eager's eval-mode "
                      "Dropout returns its input; no copy)")
