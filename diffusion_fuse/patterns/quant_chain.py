"""Matching static FP8 quantizers: shared by families ``static_quant`` and ``cat_quant`` and the norm families,
which take the quantizers reading their output (``quant_consumers``) into their ``_quant`` op.

ATen forms (no decomposition table; per-tensor scale, a one-element tensor)::

    x.float() / s:        [_to_copy(x, f32)] → div.Tensor(·, s) → clamp(·, lo, hi) → _to_copy(·, float8_e4m3fn)
    x.float() * (1 / s):  [_to_copy(x, f32)] → mul.Tensor(·, r) → clamp → _to_copy(e4m3)   (r = mul(reciprocal(s), 1))

with ``-448 <= lo <= hi <= 448``; the ``_to_copy(f32)`` is absent for an fp32 input.
"""

from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx

from .match_utils import aten, cast_dtype, is_op, single_user, val

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)
# Quantizers one ``_quant`` op takes (its kernel's scales S0..S3: kernels/fp8_quant.MAX_QUANTS, which
# tests/test_layout.py checks this equals); more readers of one form stay outside the op.
MAX_FUSED_QUANTIZERS = 4
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass
class QuantChain:
    """One quantizer reading ``source``: its nodes, scale operand, mode ("div": x / s, "mul": x * r) and clamp
    bounds."""

    nodes: list[fx.Node]
    scale: fx.Node
    mode: str
    lo: float
    hi: float

    @property
    def out(self) -> fx.Node:
        return self.nodes[-1]

    def same_form(self, other: QuantChain) -> bool:
        return (self.mode, self.lo, self.hi) == (other.mode, other.lo, other.hi)


def _scale_operand(node: fx.Node, a: fx.Node) -> tuple[fx.Node, str] | str:
    """(scale, mode) if ``node`` is ``a / s`` or ``a * r`` by a one-element tensor, else why not."""
    if is_op(node, aten.div.Tensor) and node.args[0] is a and not node.kwargs:
        s, mode = node.args[1], "div"
    elif is_op(node, aten.mul.Tensor) and list(node.args[:2]).count(a) == 1:
        s, mode = (node.args[1] if node.args[0] is a else node.args[0]), "mul"
    else:
        return "not a division or multiplication by the scale"
    if not isinstance(s, fx.Node):
        return "scale is a Python number (eager multiplies by a host reciprocal)"
    vs, va, vn = val(s), val(a), val(node)
    if vs is None or va is None or vn is None:
        return "no shapes recorded"
    if vs.numel() != 1 or vs.dtype not in _FLOATS or tuple(vn.shape) != tuple(va.shape) or vn.dtype != torch.float32:
        return f"scale {vs.dtype}{list(vs.shape)} is not a one-element float tensor scaling an fp32 tensor"
    return s, mode


def clamp_bounds(node: object) -> tuple[float, float] | None:
    if not is_op(node, aten.clamp.default):
        return None
    args = list(node.args[1:]) + [None] * 2
    lo, hi = node.kwargs.get("min", args[0]), node.kwargs.get("max", args[1])
    ok = all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in (lo, hi))
    return (float(lo), float(hi)) if ok and -FP8_MAX <= lo <= hi <= FP8_MAX else None


def quant_chain(source: fx.Node, first: fx.Node) -> QuantChain | str:
    """The quantizer that starts at ``first``, a reader of ``source``, or why it is not one."""
    nodes, a = [], source
    if cast_dtype(first) == torch.float32 and val(source) is not None and val(source).dtype in _FLOATS:
        nodes.append(first)
        a, first = first, single_user(first)
        if first is None:
            return "the fp32 copy has several readers"
    found = _scale_operand(first, a)
    if isinstance(found, str):
        return found
    scale, mode = found
    clamp = single_user(first)
    bounds = clamp_bounds(clamp)
    if bounds is None:
        return "not clamped to bounds within ±448 after scaling"
    cast = single_user(clamp)
    if cast is None or cast_dtype(cast) != FP8:
        return "the clamped value is not cast to float8_e4m3fn"
    if val(cast) is None or not val(cast).is_contiguous():
        return "the e4m3 tensor is not contiguous"
    return QuantChain(nodes + [first, clamp, cast], scale, mode, *bounds)


def quant_consumers(source: fx.Node) -> tuple[list[QuantChain], int]:
    """The quantizers reading ``source`` (up to MAX_FUSED_QUANTIZERS of one form) and how many other readers it
    has."""
    chains: list[QuantChain] = []
    others = 0
    for user in source.users:
        chain = quant_chain(source, user)
        if isinstance(chain, str) or len(chains) == MAX_FUSED_QUANTIZERS or (chains and not chains[0].same_form(chain)):
            others += 1
        else:
            chains.append(chain)
    return chains, others


def emit_quant_op(graph: fx.Graph, op, args: tuple, lead: int, keep_out: bool, chains: list[QuantChain]):
    """Emit ``op(*args, q_mode, lo, hi, keep_out)``, an op returning Tensor[] ``[<lead outputs>, out?, q_1..q_n]``,
    and one getitem per output (``args`` end with the scale, or the list of scales of a ``_quant`` op)."""
    c0 = chains[0]
    both = graph.call_function(op, (*args, c0.mode, c0.lo, c0.hi, keep_out))
    n = lead + int(keep_out) + len(chains)
    return [graph.call_function(operator.getitem, (both, i)) for i in range(n)]
