"""Static FP8 quantizers: alone (family ``static_quant``), after a token cat (``cat_quant``), and as a
consumer suffix the norm families take into their op (``quant_consumers``).

An FP8-static linear quantizes its input before ``torch._scaled_mm``. ATen forms covered (no
decomposition table; per-tensor scale, a one-element tensor; ``testing/fp8.py`` writes both)::

    x.float() / s:        [_to_copy(x, f32)] → div.Tensor(·, s) → clamp(·, lo, hi) → _to_copy(·, float8_e4m3fn)
    x.float() * (1 / s):  [_to_copy(x, f32)] → mul.Tensor(·, r) → clamp → _to_copy(e4m3)   (r = mul(reciprocal(s), 1))

with ``-448 <= lo <= hi <= 448`` (``±torch.finfo(e4m3).max`` as written); the ``_to_copy(f32)``
is absent for an fp32 input. torchao's static float8 activation quantization
(``_quantize_affine_float8`` in torchao 0.18: ``tensor.to(float32) / scale → clamp(min=-max,
max=max) → .to(float8)``) is the first form. A ``clone`` in front (FLUX's Dropout(p=0) after the
FF GELU) is folded in when the quantizer is its only reader.

- ``static_quant`` (anchor: the clamp): the quantizer alone becomes ``diffusion_fuse::static_quant``,
  one pass instead of four.
- ``cat_quant`` (anchor: ``cat``): ``cat([a, b], -1)`` whose readers are quantizers (and
  possibly other ops) becomes ``diffusion_fuse::cat_quant``: FLUX's single block
  ``cat([attn, gelu(mlp)], 2)`` and FLUX.2's ``cat([attn, swiglu], -1)`` before the projection.
- the norm families (patterns/norm_modulate.py, patterns/gated_residual.py) take the
  quantizers reading their output (``quant_consumers``) into ``ln_modulate_quant`` /
  ``gated_residual_ln_modulate_quant``; the bf16 output is written only if something else reads it.
"""

from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx

from ..lowering.fp8_quant import FP8_MAX, MAX_QUANTS, Q_DIV, Q_MUL
from .match_utils import aten, cast_dtype, is_op, single_user, val
from .registry import NearMiss, PatternFamily, Site, register_family

FP8 = torch.float8_e4m3fn
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass
class QuantChain:
    """One quantizer reading ``source``: its nodes, scale operand, mode and clamp bounds."""

    nodes: list[fx.Node]
    scale: fx.Node
    mode: int
    lo: float
    hi: float

    @property
    def out(self) -> fx.Node:
        return self.nodes[-1]

    def same_form(self, other: QuantChain) -> bool:
        return (self.mode, self.lo, self.hi) == (other.mode, other.lo, other.hi)


def _scale_operand(node: fx.Node, a: fx.Node) -> tuple[fx.Node, int] | str:
    """(scale, mode) if ``node`` is ``a / s`` or ``a * r`` by a one-element tensor, else why not."""
    if is_op(node, aten.div.Tensor) and node.args[0] is a and not node.kwargs:
        s, mode = node.args[1], Q_DIV
    elif is_op(node, aten.mul.Tensor) and list(node.args[:2]).count(a) == 1:
        s, mode = (node.args[1] if node.args[0] is a else node.args[0]), Q_MUL
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


def _clamp_bounds(node: object) -> tuple[float, float] | None:
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
    bounds = _clamp_bounds(clamp)
    if bounds is None:
        return "not clamped to bounds within ±448 after scaling"
    cast = single_user(clamp)
    if cast is None or cast_dtype(cast) != FP8:
        return "the clamped value is not cast to float8_e4m3fn"
    if val(cast) is None or not val(cast).is_contiguous():
        return "the e4m3 tensor is not contiguous"
    return QuantChain(nodes + [first, clamp, cast], scale, mode, *bounds)


def quant_consumers(source: fx.Node) -> tuple[list[QuantChain], int]:
    """The quantizers reading ``source`` (up to MAX_QUANTS of one form) and how many other readers it has."""
    chains: list[QuantChain] = []
    others = 0
    for user in source.users:
        chain = quant_chain(source, user)
        if isinstance(chain, str) or len(chains) == MAX_QUANTS or (chains and not chains[0].same_form(chain)):
            others += 1
        else:
            chains.append(chain)
    return chains, others


def emit_quant_op(graph: fx.Graph, op, args: tuple, lead: int, keep_out: bool, chains: list[QuantChain]):
    """Emit an op returning Tensor[] ``[<lead outputs>, out?, q_1..q_n]`` and one getitem per output."""
    c0 = chains[0]
    both = graph.call_function(op, (*args, c0.mode, c0.lo, c0.hi, keep_out))
    n = lead + int(keep_out) + len(chains)
    return [graph.call_function(operator.getitem, (both, i)) for i in range(n)]


@register_family
class StaticQuant(PatternFamily):
    name = "static_quant"
    tier = "lossless"
    anchors = (aten.clamp.default,)
    description = "static FP8 quantizer: (x.float() / s).clamp(±448).to(e4m3) in one pass"
    variants = (
        "_to_copy(x,f32) → div(·, s) → clamp(-448, 448) → _to_copy(e4m3)   (ModelOpt-style; torchao static float8)",
        "_to_copy(x,f32) → mul(·, 1/s) → clamp → _to_copy(e4m3)            (the * (1 / s) form)",
        "an fp32 x (no _to_copy); a clone in front folded in",
    )

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        scaled = node.args[0]
        if _clamp_bounds(node) is None or not is_op(scaled, aten.div.Tensor, aten.mul.Tensor):
            return None
        a = scaled.args[0] if is_op(scaled, aten.div.Tensor) else next(
            (x for x in scaled.args[:2] if isinstance(x, fx.Node) and x is not scaled.args[1 - scaled.args.index(x)]
             and val(x) is not None and val(scaled) is not None and val(x).shape == val(scaled).shape
             and val(scaled.args[1 - scaled.args.index(x)]) is not None
             and val(scaled.args[1 - scaled.args.index(x)]).numel() == 1), None)
        if not isinstance(a, fx.Node):
            return None
        nodes: list[fx.Node] = []
        source, first = a, scaled
        if cast_dtype(a) == torch.float32 and len(a.users) == 1:
            source, first = a.args[0], a
        if is_op(source, aten.clone.default) and len(source.users) == 1 and not source.kwargs:
            nodes.append(source)
            source = source.args[0]
        chain = quant_chain(nodes[-1] if nodes else source, first)
        if isinstance(chain, str):
            cast = single_user(node)
            return NearMiss(self.name, node, chain) if cast is not None and cast_dtype(cast) == FP8 else None
        nodes += chain.nodes

        def emit(graph: fx.Graph, ins):
            return [graph.call_function(torch.ops.diffusion_fuse.static_quant.default,
                                        (ins[0], ins[1], chain.mode, chain.lo, chain.hi))]

        return Site(pattern=self.name, anchor=node, nodes=nodes, inputs=[source, chain.scale], outputs=[chain.out],
                    emit=emit, op="diffusion_fuse::static_quant")


@register_family
class CatQuant(PatternFamily):
    name = "cat_quant"
    tier = "lossless"
    anchors = (aten.cat.default,)
    description = "cat([a, b], -1) → static FP8 quantizer: the cat is not written unless read elsewhere"
    variants = (
        "cat([view(attn), gelu(mlp)], 2) → quantizer   (FLUX single block → proj_out)",
        "cat([view(attn), silu(g) * u], -1) → quantizer (FLUX.2 single block → to_out)",
    )

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        tensors = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        vc = val(node)
        if vc is None or len(tensors) != 2 or dim not in (-1, vc.dim() - 1):
            return None
        chains, others = quant_consumers(node)
        if not chains:
            return None
        a, b = tensors
        if len(chains) > 1:
            return NearMiss(self.name, node, f"the cat feeds {len(chains)} quantizers (one is fused)")
        if not all(isinstance(t, fx.Node) and val(t) is not None and val(t).dtype == vc.dtype for t in tensors):
            return NearMiss(self.name, node, "cat inputs differ in dtype from the cat")
        (chain,) = chains
        keep_cat = others > 0
        nodes = [node] + chain.nodes

        def emit(graph: fx.Graph, ins):
            return emit_quant_op(graph, torch.ops.diffusion_fuse.cat_quant.default, (ins[0], ins[1], ins[2]), 0,
                                 keep_cat, chains)

        return Site(pattern=self.name, anchor=node, nodes=nodes, inputs=[a, b, chain.scale],
                    outputs=([node] if keep_cat else []) + [chain.out], emit=emit, op="diffusion_fuse::cat_quant",
                    n_ops=1)
