"""Family ``rms_norm_rope``: ``torch.nn.RMSNorm`` (``_fused_rms_norm``) whose output only diffusers'
``apply_rotary_emb`` reads (``use_real``, pairs along D), as one op ``diffusion_fuse::rms_norm_rope``: the RoPE runs
in the norm kernel's epilogue, so q and k make one round trip instead of two. Tried before ``rms_norm`` on the same
anchor.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .match_utils import arg, aten, cast_dtype, getitem_users, is_op, other_operand, same_shape, single_user, val
from .registry import Example, NearMiss, PatternFamily, Site, example_tensor, register_family


def normalized(norm: fx.Node) -> fx.Node | None:
    """Output 0 of ``_fused_rms_norm`` node ``norm`` if nothing reads its rstd (output 1), else None."""
    try:
        outs = getitem_users(norm)
    except LookupError:
        return None
    return outs[0] if set(outs) == {0} else None


def norm_output(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(norm, y) if ``node`` is output 0 of a ``_fused_rms_norm`` over the last dim whose rstd nobody reads."""
    if not (node.op == "call_function" and node.target is operator.getitem and node.args[1] == 0):
        return None
    norm = node.args[0]
    if not is_op(norm, aten._fused_rms_norm.default) or len(norm.args[1]) != 1:
        return None
    return (norm, node) if normalized(norm) is node else None


def example_rotary(y, cos, sin):  # diffusers' apply_rotary_emb (use_real, pairs along the head dim)
    re, im = y.reshape(*y.shape[:-1], -1, 2).unbind(-1)
    return (y.float() * cos + torch.stack([-im, re], -1).flatten(3).float() * sin).to(y.dtype)


def example_rope_tables(seq: int, d: int):
    pos = example_tensor(seq, d // 2, dtype=torch.float64, seed=7) * 20
    return tuple(f(pos).repeat_interleave(2, dim=1)[:, None].float() for f in (torch.cos, torch.sin))


class Rope:
    """diffusers' ``apply_rotary_emb`` (use_real, unbind -1) applied to ``y`` and nothing else reading ``y``::

        view(y, [..., D/2, 2]) → unbind(-1) → neg(im), stack([neg, re], -1) → view(y's shape) → _to_copy(f32) → mul(·, sin)
        _to_copy(y, f32) → mul(·, cos);  add(the two products) → _to_copy(y's dtype)

    (each mul and the add in either operand order; an fp32 y has none of the casts). cos/sin: fp32 values broadcasting to y with last dim D.
    """

    def __init__(self, y: fx.Node) -> None:
        self.nodes: list[fx.Node] = []
        self.cos = self.sin = self.out = None
        yv = val(y)
        if yv is None or yv.dim() < 2 or yv.shape[-1] % 2 or len(y.users) != 2:
            return
        f32 = yv.dtype == torch.float32  # an fp32 model: .float() and .to(x.dtype) are not in the graph
        pair = [u for u in y.users if is_op(u, aten.view.default, aten._unsafe_view.default)]
        yf = [y] if f32 else [u for u in y.users if cast_dtype(u) == torch.float32]
        if len(pair) != 1 or len(yf) != 1 or not self._pairs_view(pair[0], yv):
            return
        unbind = single_user(pair[0])
        if not is_op(unbind, aten.unbind.int) or arg(unbind, 1, "dim", 0) not in (-1, yv.dim()):
            return
        try:
            parts = getitem_users(unbind)
        except LookupError:
            return
        if set(parts) != {0, 1}:
            return
        re, im = parts[0], parts[1]
        neg = single_user(im)
        stack = single_user(neg) if is_op(neg, aten.neg.default) else None
        if not is_op(stack, aten.stack.default) or list(stack.args[0]) != [neg, re] or single_user(re) is not stack:
            return
        if arg(stack, 1, "dim", 0) not in (-1, yv.dim()):
            return
        flat = single_user(stack)
        if not is_op(flat, aten.view.default, aten._unsafe_view.default) or not same_shape(flat, y):
            return
        rotf = flat if f32 else single_user(flat)
        if not f32 and cast_dtype(rotf) != torch.float32:
            return
        mul_cos = next((u for u in y.users if u is not pair[0]), None) if f32 else single_user(yf[0])
        mul_sin = single_user(rotf)
        cos, sin = self._factor(mul_cos, yf[0], yv), self._factor(mul_sin, rotf, yv)
        add = single_user(mul_cos)
        if cos is None or sin is None or add is None or single_user(mul_sin) is not add:
            return
        if not is_op(add, aten.add.Tensor) or set(add.args) != {mul_cos, mul_sin} or add.kwargs.get("alpha", 1) != 1:
            return
        out = add if f32 else single_user(add)
        if not f32 and cast_dtype(out) != yv.dtype:
            return
        casts = [] if f32 else [rotf, yf[0], out]
        self.nodes = [pair[0], unbind, re, im, neg, stack, flat, mul_cos, mul_sin, add] + casts
        self.cos, self.sin, self.out = cos, sin, out

    @staticmethod
    def _pairs_view(v: fx.Node, yv) -> bool:
        shape = tuple(val(v).shape) if val(v) is not None else ()
        return shape == (*yv.shape[:-1], yv.shape[-1] // 2, 2)

    @staticmethod
    def _factor(mul: fx.Node | None, operand: fx.Node, yv) -> fx.Node | None:
        """The other factor of ``mul(operand, f)``: an fp32 tensor broadcasting to y with y's last dim."""
        if not is_op(mul, aten.mul.Tensor) or len(mul.args) != 2 or list(mul.args).count(operand) != 1:
            return None
        f = other_operand(mul, operand)
        fv = val(f)
        if not isinstance(f, fx.Node) or fv is None or fv.dtype != torch.float32 or fv.dim() > yv.dim():
            return None
        if fv.shape[-1] != yv.shape[-1] or torch.broadcast_shapes(fv.shape, yv.shape) != yv.shape:
            return None
        return f


@register_family
class RmsNormRope(PatternFamily):
    name = "rms_norm_rope"
    tier = "lossless"
    kernel = "rms_norm"  # the rms_norm kernel with the RoPE epilogue
    priority = 1  # tried before rms_norm on the same anchor: the larger site
    anchors = (aten._fused_rms_norm.default,)
    description = "torch.nn.RMSNorm (_fused_rms_norm) → RoPE (apply_rotary_emb, use_real, pairs along D)"
    variants = (
        "_fused_rms_norm(x, [D], w, eps)[0] → apply_rotary_emb(·, (cos, sin))   (FLUX/FLUX.2 single-block q and k)",
    )


    def example(self) -> Example:
        def q(x, w, cos, sin):
            return example_rotary(torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6), cos, sin)

        return q, (example_tensor(2, 8, 4, 32), example_tensor(32, seed=1), *example_rope_tables(8, 32))

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        x, normalized_shape = node.args[:2]
        weight, eps = arg(node, 2, "weight"), arg(node, 3, "eps")
        y = normalized(node)
        if len(normalized_shape) != 1 or y is None:
            return None  # family rms_norm says why
        rope = Rope(y)
        if rope.out is None:
            return None
        has_w = isinstance(weight, fx.Node)

        def emit(graph: fx.Graph, ins):
            it = iter(ins)
            x_n = next(it)
            w_n = next(it) if has_w else None
            cos, sin = next(it), next(it)
            return [graph.call_function(torch.ops.diffusion_fuse.rms_norm_rope.default,
                                        (x_n, w_n, None if eps is None else float(eps), cos, sin))]

        return Site(
            pattern=self.name,
            anchor=node,
            nodes=[node, y] + rope.nodes,
            inputs=[x] + ([weight] if has_w else []) + [rope.cos, rope.sin],
            outputs=[rope.out],
            emit=emit,
            op="diffusion_fuse::rms_norm_rope",
            where=y,  # named by the model line that called the norm (the RoPE is a helper in embeddings.py)
        )
