"""Shared matcher: a slice of a chunked timestep-embedding table, read by a fused op as its two addends.

Wan 2.1/2.2 blocks compute their six modulation vectors as ``(scale_shift_table + temb.float()).chunk(6, 1)``
([B,6,D] temb) or, in Wan2.2 TI2V, per token ``(table.unsqueeze(0) + temb.float()).chunk(6, 2)`` and
``.squeeze(2)`` ([B,S,6,D] temb); the output norm does the same with 2 chunks. Eager writes the fp32 copy of
temb and the fp32 sum ([1, 27280, 6, 3072] at Wan2.2-5B 704p/121f: 2 GiB each), then its consumers read
strided slices of the sum. A fused op that recognizes such a slice as its scale, shift or gate takes the two
operands of the add instead, as views (narrowed to the slice's index along the chunk dim, squeezed as the slice
is), and adds them itself: the one fp32 add per element eager does, so the same bits. Once every slice is read
this way, the add, the split and the cast have no users and the cleanup pass removes them; a slice some other
op still reads keeps them alive for that op (the fused consumers still read the table and temb directly).

ATen forms (no decomposition table; Inductor's post-grad graph spells the cast ``prims.convert_element_type``):

- Wan 2.1 / 2.2-14B block: ``add(table[1,6,D], _to_copy(temb[B,6,D], f32)) → split.Tensor(·, 1, 1) → getitem(j)``
- Wan 2.2 TI2V block: ``add(unsqueeze(table, 0), _to_copy(temb[B,S,6,D], f32)) → split.Tensor(·, 1, 2) →
  getitem(j) → squeeze.dim(·, 2)``
- Wan output norm: ``add(table[1,2,D], unsqueeze(temb, 1))`` (TI2V: ``unsqueeze(temb[B,S,D], 2)`` and a
  squeeze): bf16 temb widened by the add's own type promotion, which computes the same fp32 values
- fp32 models (no cast); SANA's ``table[None] + timestep.reshape(B, 6, -1)`` in fp32;
  ``split_with_sizes(·, [1, ..., 1], dim)``.

Only fp32 sums are taken: the kernels add in fp32 and do not round the sum to a narrower dtype.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterator

import torch
import torch.fx as fx

from .match_utils import aten, dtype_of, fold_upcast, is_op, val


@dataclasses.dataclass(frozen=True)
class TembSlice:
    """Slice ``index`` of ``(lhs + rhs).chunk(n, dim)`` [then ``.squeeze(dim)``]."""

    node: fx.Node  # what consumers read: the getitem, or the squeeze of it
    lhs: fx.Node  # the add's operands in the add's order, an exact fp32 widening cast stripped
    rhs: fx.Node
    dim: int  # the chunk dim, counted in the sum's rank
    index: int
    squeeze: bool
    rank: int  # the sum's rank

    def views(self, graph: fx.Graph, lhs: fx.Node, rhs: fx.Node) -> tuple[fx.Node, fx.Node]:
        """Views of the two operands whose sum (broadcast) is the slice, emitted into ``graph``."""
        return self._view(graph, lhs, self.lhs), self._view(graph, rhs, self.rhs)

    def _view(self, graph: fx.Graph, node: fx.Node, like: fx.Node) -> fx.Node:
        shape = val(like).shape
        d = self.dim - (self.rank - len(shape))  # the chunk dim in this operand (broadcasting aligns right)
        if d < 0:
            return node  # the operand has no chunk dim: it broadcasts to every slice as it is
        if shape[d] == 1:  # broadcast along the chunk dim: every slice reads all of it
            return graph.call_function(aten.squeeze.dim, (node, d)) if self.squeeze else node
        if self.squeeze:
            return graph.call_function(aten.select.int, (node, d, self.index))
        return graph.call_function(aten.slice.Tensor, (node, d, self.index, self.index + 1))


def _split_dim(split: fx.Node) -> int | None:
    """The dim of a split into pieces of size 1, else None."""
    if is_op(split, aten.split.Tensor):
        size = split.args[1] if len(split.args) > 1 else split.kwargs.get("split_size")
        if size != 1:
            return None
    elif is_op(split, aten.split_with_sizes.default):
        sizes = split.args[1] if len(split.args) > 1 else split.kwargs.get("split_sizes")
        if not sizes or any(s != 1 for s in sizes):
            return None
    else:
        return None
    return split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)


def temb_slice(node: object) -> TembSlice | None:
    """The chunked-table slice ``node`` is, or None (see the module docstring for the forms)."""
    squeeze_dim = None
    item = node
    if is_op(node, aten.squeeze.dim):
        item, squeeze_dim = node.args[0], node.args[1]
    if not (isinstance(item, fx.Node) and item.op == "call_function" and item.target is operator.getitem):
        return None
    split, index = item.args
    dim = _split_dim(split)
    total = split.args[0] if dim is not None else None
    v = val(total)
    if v is None or v.dtype != torch.float32 or not isinstance(index, int):
        return None
    rank = v.dim()
    dim %= rank
    if squeeze_dim is not None and squeeze_dim % rank != dim:
        return None
    if not is_op(total, aten.add.Tensor) or total.kwargs.get("alpha", 1) != 1 or len(total.args) != 2:
        return None
    lhs, rhs = total.args
    if not (isinstance(lhs, fx.Node) and isinstance(rhs, fx.Node)):
        return None
    rhs, _ = fold_upcast(rhs, dtype_of(lhs))
    lhs, _ = fold_upcast(lhs, dtype_of(rhs))
    vl, vr = val(lhs), val(rhs)
    if vl is None or vr is None or max(vl.dim(), vr.dim()) > rank:
        return None
    if torch.promote_types(vl.dtype, vr.dtype) != torch.float32:
        return None
    return TembSlice(node, lhs, rhs, dim, index, squeeze_dim is not None, rank)


class ModOperand:
    """A scale, shift or gate operand of a fused op: a node, or a temb-table slice read as its two addends.

    ``inputs`` are the nodes the site reads for it; ``emit`` takes them from the site's input iterator
    and returns ``(operand, second addend or None)`` as the op takes them. ``table=False`` reads the
    node as it is (a ``1 + scale`` inside an unsqueeze: the view is re-added to one operand only).
    """

    def __init__(self, node: fx.Node, table: bool = True) -> None:
        self.node = node
        self.slice = temb_slice(node) if table else None

    @property
    def inputs(self) -> list[fx.Node]:
        return [self.slice.lhs, self.slice.rhs] if self.slice is not None else [self.node]

    def emit(self, graph: fx.Graph, it: Iterator[fx.Node], unsqueeze_dim: int | None = None
             ) -> tuple[fx.Node, fx.Node | None]:
        if self.slice is None:
            a, b = next(it), None
        else:
            a, b = self.slice.views(graph, next(it), next(it))
        if unsqueeze_dim is not None:  # the site's ``1 + scale`` sat inside an unsqueeze: re-add the view
            assert b is None, "a table slice is read with table=False under an unsqueeze"
            a = graph.call_function(aten.unsqueeze.default, (a, unsqueeze_dim))
        return a, b
