"""Family ``gated_residual_norm_modulate``: ``r = residual + gate * x`` feeding LN + AdaLN modulate.

Becomes ``diffusion_fuse::gated_residual_ln_modulate`` (lowering/gated_residual.py), which
returns the new residual ``r`` (read by later ops) and the modulated output, without writing
``gate * x`` or the normalized tensor. Covered ATen forms (bf16 or fp32 models, no
decomposition table; ../shared/aten_pattern_excerpts.txt "FLUX.1 (b)"):

- FLUX double block, SD3.5, Qwen-Image, SANA, FLUX.2:
  ``mul(unsqueeze(gate,1), x) → add(residual, ·) → native_layer_norm → modulate``;
  ``x`` may be a ``clone`` (Dropout p=0) or a ``view``/``_unsafe_view`` of a matmul;
  either operand order of the ``mul`` and of the ``add``.
- the LN + modulate part is exactly what family ``norm_modulate`` accepts, with one
  modulate reading the LN (several modulates stay with ``norm_modulate``).

It is tried before ``norm_modulate`` (priority), which takes the LayerNorm when the
residual is not a gated one. Wan's fp32 round-trip residual form is not covered yet.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .match_utils import aten, is_op, single_user, val
from .norm_modulate import match_ln_chains
from .registry import NearMiss, PatternFamily, Site, register_family
from .quant_chain import emit_quant_op, quant_consumers


def _gated_residual(r: object) -> tuple[fx.Node, fx.Node, fx.Node, fx.Node] | None:
    """(mul, residual, gate, x) if ``r`` is ``residual + gate * x`` (any operand order), else None."""
    if not is_op(r, aten.add.Tensor) or r.kwargs.get("alpha", 1) != 1 or len(r.args) != 2:
        return None
    for mul, residual in (r.args, r.args[::-1]):
        if is_op(mul, aten.mul.Tensor) and isinstance(residual, fx.Node) and len(mul.args) == 2:
            a, b = mul.args
            if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
                continue
            va, vb, vr = val(a), val(b), val(r)
            if va is None or vb is None or vr is None:
                continue
            # x has the full shape; the gate broadcasts ([B,1,D]); a full-shape gate is fine too.
            gate, x = (a, b) if tuple(vb.shape) == tuple(vr.shape) else (b, a)
            if tuple(val(x).shape) != tuple(vr.shape) or tuple(val(residual).shape) != tuple(vr.shape):
                continue
            return mul, residual, gate, x
    return None


@register_family
class GatedResidualNormModulate(PatternFamily):
    name = "gated_residual_norm_modulate"
    tier = "lossless"
    priority = 10
    anchors = (aten.native_layer_norm.default,)
    description = "r = residual + gate * x; LN(r) * (1 + scale) [+ shift]; returns r and the output"
    variants = (
        "add(residual, mul(unsqueeze(gate,1), x)) → LN → modulate  (FLUX/SD3.5/Qwen-Image/SANA/FLUX.2, bf16/fp32)",
        "operands of mul and add in either order; x a clone/view of a linear's output",
        "the output read by up to 4 static FP8 quantizers (patterns/static_quant.py) → ..._quant op",
    )

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        r, _, weight, bias, eps = node.args[:5]
        gated = _gated_residual(r)
        if gated is None:
            return None  # not a gated residual: family norm_modulate takes (and explains) this LayerNorm
        mul, residual, gate, x = gated
        if single_user(mul) is None:
            return NearMiss(self.name, node, f"gate * x has {len(mul.users)} users (needs 1: the residual add)")
        found = match_ln_chains(self.name, node)
        if not isinstance(found, tuple) or len(found[1]) != 1:
            return None  # norm_modulate decides (and reports) what happens to this LayerNorm
        ln, (chain,) = found
        has_w, has_b, has_shift = isinstance(weight, fx.Node), isinstance(bias, fx.Node), chain.shift is not None
        inputs = [residual, x, gate, chain.scale] + ([weight] if has_w else []) + ([bias] if has_b else [])
        inputs += [chain.shift] if has_shift else []
        quants, others = quant_consumers(chain.last)  # FP8-static linears reading the output join the op
        inputs += [q.scale for q in quants]

        def emit(graph: fx.Graph, ins):
            it = iter(ins)
            res_n, x_n, gate_n = next(it), next(it), next(it)
            scale_n = chain.scale_arg(graph, next(it))
            w_n = next(it) if has_w else None
            b_n = next(it) if has_b else None
            shift_n = next(it) if has_shift else None
            if quants:
                return emit_quant_op(graph, torch.ops.diffusion_fuse.gated_residual_ln_modulate_quant.default,
                                     (res_n, x_n, gate_n, w_n, b_n, float(eps), scale_n, shift_n, chain.out_dtype,
                                      list(it)), 1, others > 0, quants)
            both = graph.call_function(
                torch.ops.diffusion_fuse.gated_residual_ln_modulate.default,
                (res_n, x_n, gate_n, w_n, b_n, float(eps), scale_n, shift_n, chain.out_dtype),
            )
            return [graph.call_function(operator.getitem, (both, 0)), graph.call_function(operator.getitem, (both, 1))]

        return Site(
            pattern=self.name,
            anchor=node,
            nodes=[mul, r, node, ln, *chain.nodes, *(n for q in quants for n in q.nodes)],
            inputs=inputs,
            outputs=[r] + ([chain.last] if not quants or others else []) + [q.out for q in quants],
            emit=emit,
            op="diffusion_fuse::gated_residual_ln_modulate" + ("_quant" if quants else ""),
            n_ops=1,
            where=chain.last,
        )
