"""Family ``static_quant``: a static FP8 quantizer alone, as one op ``diffusion_fuse::static_quant`` (one pass
instead of four). The quantizers after a cat are family ``cat_quant``'s, those after a norm the norm families'
(``quant_consumers``, patterns/quant_chain.py).

An FP8-static linear quantizes its input before ``torch._scaled_mm``. ATen forms covered (no
decomposition table; per-tensor scale, a one-element tensor; ``testing/fp8.py`` writes both)::

    x.float() / s:        [_to_copy(x, f32)] → div.Tensor(·, s) → clamp(·, lo, hi) → _to_copy(·, float8_e4m3fn)
    x.float() * (1 / s):  [_to_copy(x, f32)] → mul.Tensor(·, r) → clamp → _to_copy(e4m3)   (r = mul(reciprocal(s), 1))

with ``-448 <= lo <= hi <= 448`` (``±torch.finfo(e4m3).max`` as written); the ``_to_copy(f32)``
is absent for an fp32 input. torchao's static float8 activation quantization
(``_quantize_affine_float8`` in torchao 0.18: ``tensor.to(float32) / scale → clamp(min=-max,
max=max) → .to(float8)``) is the first form. A ``clone`` in front (FLUX's Dropout(p=0) after the
FF GELU) is folded in when the quantizer is its only reader.

The anchor is the clamp.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .match_utils import aten, cast_dtype, is_op, single_user, val
from .quant_chain import FP8, clamp_bounds, quant_chain
from .registry import Example, NearMiss, PatternFamily, Site, example_tensor, register_family


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


    def example(self) -> Example:
        def quantize(x, s):  # (x.float() / s).clamp(-448, 448).to(e4m3)
            return (x.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)

        return quantize, (example_tensor(8, 64) * 30, torch.tensor([2.0]))

    def near_miss_example(self) -> Example:
        def quantize(x):  # a Python-number scale: eager multiplies by a host reciprocal
            return (x.float() / 2.0).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)

        return quantize, (example_tensor(8, 64) * 30,)

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        scaled = node.args[0]
        if clamp_bounds(node) is None or not is_op(scaled, aten.div.Tensor, aten.mul.Tensor):
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
