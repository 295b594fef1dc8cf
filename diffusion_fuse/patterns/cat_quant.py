"""Family ``cat_quant``: ``cat([a, b], -1)`` whose readers are static FP8 quantizers (and possibly other ops), as one
op ``diffusion_fuse::cat_quant``: the quantizer reads the two halves, and the cat is written only if something else
reads it (a single block's ``cat([attn, mlp], -1)`` before an FP8 projection). Quantizer forms:
patterns/quant_chain.py.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .match_utils import aten, val
from .quant_chain import emit_quant_op, quant_consumers
from .registry import Example, NearMiss, PatternFamily, Site, example_tensor, register_family


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


    def example(self) -> Example:
        def cat_then_quantize(a, b, s):
            c = torch.cat([a, torch.nn.functional.gelu(b, approximate="tanh")], -1)
            return (c.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)

        return cat_then_quantize, (example_tensor(1, 8, 32), example_tensor(1, 8, 16, seed=1), torch.tensor([4.0]))

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
