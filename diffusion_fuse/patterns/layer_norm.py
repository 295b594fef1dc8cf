"""Family ``layer_norm``: a LayerNorm no modulate reads, as one op ``diffusion_fuse::layer_norm``.

Covered ATen forms (``nn.LayerNorm``, ``F.layer_norm``, an fp32-upcast LayerNorm; affine or not)::

    native_layer_norm(x, [D], w?, b?, eps)[0] [→ _to_copy(dtype)]
    native_layer_norm(_to_copy(x, f32), [D], w?, b?, eps)[0] → _to_copy(x's dtype)      (FP32LayerNorm)

over the last dim only, with the mean and rstd outputs unread. The op runs family ``norm_modulate``'s kernel
without the modulate: eager's LayerNorm statistics, the normalize, the casts folded in (the fp32 copy of x and the
cast of the output are never written). The LayerNorms a modulate reads are ``norm_modulate``'s and
``gated_residual_norm_modulate``'s, tried first on the same anchor; the rest of a normalization's epilogue is the
pointwise pass's.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .match_utils import aten, cast_dtype, dtype_of, getitem_users, single_user
from .registry import Example, NearMiss, PatternFamily, Site, example_tensor, register_family

_HALF = (torch.bfloat16, torch.float16)


@register_family
class LayerNorm(PatternFamily):
    name = "layer_norm"
    tier = "lossless"
    priority = -10  # after the families that take a LayerNorm with its modulate or its gated residual
    kernel = "norm_modulate"  # that family's kernel without the modulate
    lossless_only = True  # in tier high Inductor fuses a LayerNorm with its neighbours
    anchors = (aten.native_layer_norm.default,)
    description = "LayerNorm read by no modulate, its input and output casts folded in"
    variants = (
        "native_layer_norm(x, [D], w?, b?, eps)[0]                    (nn.LayerNorm, F.layer_norm, QK norms)",
        "native_layer_norm(...)[0] → _to_copy(dtype)                   (an output cast)",
        "_to_copy(x, f32) → native_layer_norm → _to_copy(x's dtype)   (FP32LayerNorm)",
    )

    def example(self) -> Example:
        def fp32_layer_norm(x, w, b):
            return torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), w, b, 1e-6).to(x.dtype)

        return fp32_layer_norm, (example_tensor(2, 8, 64), example_tensor(64, dtype=torch.float32, seed=1),
                                 example_tensor(64, dtype=torch.float32, seed=2))

    def near_miss_example(self) -> Example:
        def over_two_dims(x):
            return torch.nn.functional.layer_norm(x, x.shape[-2:])

        return over_two_dims, (example_tensor(2, 8, 64),)

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        x_in, normalized_shape, weight, bias, eps = node.args[:5]
        if len(normalized_shape) != 1:
            return NearMiss(self.name, node, f"normalized_shape {list(normalized_shape)} spans more than the last dim")
        try:
            outs = getitem_users(node)
        except LookupError as e:
            return NearMiss(self.name, node, str(e))
        if set(outs) != {0}:
            return NearMiss(self.name, node, f"mean/rstd outputs are used (getitems {sorted(outs)})")
        y = outs[0]
        if not y.users:
            return None
        nodes, x, ln_dtype = [node, y], x_in, None
        if cast_dtype(x_in) == torch.float32 and dtype_of(x_in.args[0]) in _HALF and len(x_in.users) == 1:
            nodes.insert(0, x_in)
            x, ln_dtype = x_in.args[0], torch.float32
        out, out_dtype = y, None
        cast = single_user(y)
        if cast is not None and cast_dtype(cast) in _HALF + (torch.float32,) and cast_dtype(cast) != dtype_of(y):
            nodes.append(cast)
            out, out_dtype = cast, cast_dtype(cast)
        has_w, has_b = isinstance(weight, fx.Node), isinstance(bias, fx.Node)

        def emit(graph: fx.Graph, ins):
            it = iter(ins)
            x_n = next(it)
            w_n = next(it) if has_w else None
            b_n = next(it) if has_b else None
            return [graph.call_function(torch.ops.diffusion_fuse.layer_norm.default,
                                        (x_n, w_n, b_n, float(eps), ln_dtype, out_dtype))]

        return Site(pattern=self.name, anchor=node, nodes=nodes,
                    inputs=[x] + ([weight] if has_w else []) + ([bias] if has_b else []), outputs=[out], emit=emit,
                    op="diffusion_fuse::layer_norm")
