"""Family ``rms_norm_cat_rope``: two RMSNorms (``_fused_rms_norm``) concatenated along a row dim, then the RoPE of
``rms_norm_rope`` (joint attention's text and image q or k), as one op ``diffusion_fuse::rms_norm_cat_rope``: two
launches of the ``rms_norm_rope`` kernel write the two halves of one output, so the cat is never a pass. Tried
first on the ``_fused_rms_norm`` that comes first.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .match_utils import arg, aten, is_op, single_user, val
from .registry import Example, NearMiss, PatternFamily, Site, example_tensor, register_family
from .rms_norm_rope import Rope, example_rope_tables, example_rotary, norm_output, normalized


@register_family
class RmsNormCatRope(PatternFamily):
    name = "rms_norm_cat_rope"
    tier = "lossless"
    kernel = "rms_norm"  # two launches of the rms_norm kernel with the RoPE epilogue
    priority = 2  # tried before rms_norm_rope and rms_norm on the same anchor: the larger site
    anchors = (aten._fused_rms_norm.default,)
    description = "two RMSNorms (_fused_rms_norm) → cat along a row dim → RoPE (FLUX/FLUX.2 double-block q and k)"
    variants = (
        "cat([_fused_rms_norm(x_txt)[0], _fused_rms_norm(x_img)[0]], 1) → apply_rotary_emb(·, (cos, sin))",
    )


    def example(self) -> Example:
        def joint_q(x_txt, x_img, w_txt, w_img, cos, sin):  # text and image q normed, cat along the sequence
            norm = torch.nn.functional.rms_norm
            q = torch.cat([norm(x_txt, (x_txt.shape[-1],), w_txt, 1e-6), norm(x_img, (x_img.shape[-1],), w_img, 1e-6)],
                          dim=1)
            return example_rotary(q, cos, sin)

        return joint_q, (example_tensor(2, 3, 4, 32), example_tensor(2, 5, 4, 32, seed=1), example_tensor(32, seed=2),
                         example_tensor(32, seed=3), *example_rope_tables(8, 32))

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        y = normalized(node)
        cat = single_user(y) if y is not None else None
        if not is_op(cat, aten.cat.default) or len(cat.args[0]) != 2 or val(cat) is None:
            return None
        halves = [norm_output(t) if isinstance(t, fx.Node) else None for t in cat.args[0]]
        if any(h is None or single_user(h[1]) is not cat for h in halves) or halves[0][0] is halves[1][0]:
            return None
        if node not in (halves[0][0], halves[1][0]):
            return None
        ndim = val(cat).dim()
        dim = arg(cat, 1, "dim", 0)
        dim = dim + ndim if dim < 0 else dim
        if not 0 <= dim < ndim - 1:
            return None
        rope = Rope(cat)
        if rope.out is None:
            return None
        parts = []
        for norm, _y in halves:
            w, eps = arg(norm, 2, "weight"), arg(norm, 3, "eps")
            parts.append((norm.args[0], w if isinstance(w, fx.Node) else None, None if eps is None else float(eps)))

        def emit(graph: fx.Graph, ins):
            it = iter(ins)
            args = []
            for _x, w, eps in parts:
                x_n = next(it)
                args += [x_n, next(it) if w is not None else None, eps]
            cos, sin = next(it), next(it)
            return [graph.call_function(torch.ops.diffusion_fuse.rms_norm_cat_rope.default,
                                        (*args[:3], *args[3:], dim, cos, sin))]

        inputs = []
        for x, w, _eps in parts:
            inputs += [x] + ([w] if w is not None else [])
        return Site(
            pattern=self.name,
            anchor=node,
            nodes=[halves[0][0], halves[0][1], halves[1][0], halves[1][1], cat] + rope.nodes,
            inputs=inputs + [rope.cos, rope.sin],
            outputs=[rope.out],
            emit=emit,
            op="diffusion_fuse::rms_norm_cat_rope",
            where=y,  # named by the model line of the first norm in graph order
        )
