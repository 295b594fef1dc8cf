"""Pass: a ``cat`` of adjacent slices that tile one tensor is that tensor.

FLUX's single blocks begin with ``torch.cat([encoder_hidden_states, hidden_states], dim=1)`` and end
with ``hidden_states[:, :text_seq_len], hidden_states[:, text_seq_len:]``. Where one graph holds two
blocks in a row (a whole transformer compiled, or a stack of blocks), the next block's ``cat`` puts
back together the two halves of the previous block's output: a full copy of a [B, S, D] tensor
(~15 µs at FLUX's 4608 x 3072 on an H200) that yields the tensor it was sliced from, bit for bit.
Without it, the previous block's gated residual and the next block's LayerNorm + modulate are also
adjacent, and the ``gated_residual_ln`` family fuses them.

Rewrites ``aten.cat([slice(x, d, a0, a1), slice(x, d, a1, a2), ...], d)`` to ``x`` when the slices
are step 1, in order, without gaps, and cover ``x`` along ``d`` (``a0 == 0``, the last end
``>= x.size(d)``), ``x`` is contiguous (the ``cat`` output is: same sizes and strides), and
``x`` has the ``cat``'s dtype. Exact by construction: the values are the same elements; only the
copy is gone. An inference graph from AOTAutograd is functional, so nothing writes into ``x``
between the two.

No alias where eager made a fresh tensor that might be observed as one: ``x`` must be a fresh tensor
(an ATen op whose result aliases none of its inputs; a view could alias a graph input, which the graph
may write into at its end), and no graph output may be the ``cat`` or reach it through views
(AOTAutograd decided at trace time which outputs alias one another).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..log import get_logger
from .base import GraphPass, PassContext, is_fresh, reaches_output, register_pass

_log = get_logger("fxpasses")
aten = torch.ops.aten


def _slice_args(n: fx.Node) -> tuple[fx.Node, int, int, int] | None:
    """``(x, dim, start, end)`` of ``aten.slice.Tensor(x, dim=0, start=None, end=None, step=1)``, normalized."""
    if n.op != "call_function" or n.target is not aten.slice.Tensor:
        return None
    x, dim, start, end, step = (*n.args, *[None] * (5 - len(n.args)))[:5]
    kw = n.kwargs
    dim, start, end = kw.get("dim", dim or 0), kw.get("start", start), kw.get("end", end)
    step = kw.get("step", 1 if step is None else step)
    val = x.meta.get("val") if isinstance(x, fx.Node) else None
    if not isinstance(val, torch.Tensor) or step != 1 or not isinstance(dim, int):
        return None
    dim = dim % val.dim()
    size = val.shape[dim]
    if not isinstance(size, int) or not all(v is None or isinstance(v, int) for v in (start, end)):
        return None  # symbolic sizes: not judged
    start = 0 if start is None else (start + size if start < 0 else start)
    end = size if end is None else min(end + size if end < 0 else end, size)
    return x, dim, max(0, start), end


def covered_base(cat: fx.Node) -> fx.Node | None:
    """The tensor that ``cat`` (an ``aten.cat`` node) rebuilds from its slices, or None."""
    if cat.op != "call_function" or cat.target is not aten.cat.default:
        return None
    tensors = cat.args[0]
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    parts = [_slice_args(t) if isinstance(t, fx.Node) else None for t in tensors]
    if len(parts) < 2 or any(p is None for p in parts):
        return None
    base = parts[0][0]
    val, out = base.meta.get("val"), cat.meta.get("val")
    if not is_fresh(base) or not isinstance(out, torch.Tensor) or not isinstance(dim, int):
        return None
    dim = dim % out.dim()
    pos = 0
    for x, d, start, end in parts:
        if x is not base or d != dim or start != pos or end <= start:
            return None
        pos = end
    if pos != val.shape[dim]:
        return None
    if val.dtype != out.dtype or tuple(val.shape) != tuple(out.shape) or tuple(val.stride()) != tuple(out.stride()):
        return None
    return base


@register_pass
class CatOfSlicesPass(GraphPass):
    name = "cat_of_slices"

    def __call__(self, graph: fx.Graph, ctx: PassContext) -> None:
        done = []
        for n in list(graph.nodes):
            base = covered_base(n)
            if base is None or reaches_output(n):
                continue
            n.replace_all_uses_with(base)
            done.append((n.name, base.name))
        if done:
            shown = ", ".join(f"{name} -> {base}" for name, base in done[:3]) + (", ..." if len(done) > 3 else "")
            ctx.notes.append(f"cat_of_slices: {len(done)} cat(s) that rebuild the tensor their inputs were sliced "
                             f"from use it instead (no copy): {shown}")
            _log.info("cat_of_slices: %d cat(s) of adjacent slices replaced by their base", len(done))

