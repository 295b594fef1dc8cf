"""Families ``rms_norm`` and ``rms_norm_chain``: RMSNorm [+ weight] [+ AdaLN modulate] as one op.

``rms_norm`` (lossless) becomes ``diffusion_fuse::rms_norm`` (lowering/rms_norm.py). It covers
``torch.nn.RMSNorm`` / ``F.rms_norm`` as a CUDA graph holds them (PyTorch routes them to
``aten._fused_rms_norm``, which has a CUDA kernel and so is not decomposed):

- ``_fused_rms_norm(x, [D], w?, eps) → getitem 0``: QK norm over head_dim (FLUX, FLUX.2:
  ``[B,S,H,Dh]``), across heads (Wan, LTX: ``[B,S,H*Dh]``);
- optionally followed by the modulate ``* (1 + scale) [+ shift] [→ cast]``, every spelling
  family ``norm_modulate`` accepts.

On a CPU build ``_fused_rms_norm`` is CompositeImplicit, so CPU graphs hold the chain below instead.

``rms_norm_chain`` (tier high, not bit-exact: eager's mean is ATen's generic reduce kernel) becomes
``diffusion_fuse::rms_norm_chain``. It covers the pow → mean → rsqrt chain as diffusers' RMSNorm
(SD3.5, Qwen-Image, SANA, LTX, Cosmos, ...) and PyTorch's composite ``rms_norm`` write it:

- ``[_to_copy(x, f32)] → pow(·, 2) → mean(·, [-1], True) → add(·, eps) → rsqrt → mul(x or xf, ·)``
  (``add.Tensor``/``add.Scalar``, the mean's dim as -1 or ndim-1, Inductor's ``convert_element_type``);
- then, in this order and each optional: a cast, ``* weight [D]``, ``+ bias [D]``, a cast;
- then optionally the modulate, as above.

``rms_norm_rope`` (lossless) becomes ``diffusion_fuse::rms_norm_rope``: the ``rms_norm`` form without
modulate when the normalized value feeds only diffusers' ``apply_rotary_emb`` (use_real, pairs along D),
as in the FLUX / FLUX.2 single blocks. ``rms_norm_cat_rope`` (lossless) is the double blocks' form: the text
and image norms ``cat`` along the sequence, then the same RoPE (``diffusion_fuse::rms_norm_cat_rope``).

Sites are sized to what only they read: a chain stops at a value read by more than one op.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .match_utils import aten, cast_dtype, getitem_users, is_op, is_scalar, other_operand, same_shape, single_user, val
from .norm_modulate import ModulateChain, modulate_chain
from .registry import NearMiss, PatternFamily, Site, register_family
from .wan_temb import ModOperand

_HALF = (torch.bfloat16, torch.float16)


def _arg(node: fx.Node, i: int, name: str, default=None):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _single_modulate(y: fx.Node, anchor: fx.Node) -> ModulateChain | None:
    """The modulate reading ``y`` if it is ``y``'s only reader, else None."""
    user = single_user(y)
    if user is None:
        return None
    chain = modulate_chain(y, user, anchor)
    return chain if isinstance(chain, ModulateChain) else None


def _modulate_inputs(chain: ModulateChain | None) -> list[fx.Node]:
    # scale and shift as the nodes they are (a Wan timestep-table slice is not split into its addends)
    if chain is None:
        return []
    return [chain.scale.node] + ([chain.shift.node] if chain.shift is not None else [])


def _emit_modulate(graph: fx.Graph, chain: ModulateChain | None, it) -> tuple:
    """(scale, shift, out_dtype) arguments of the op, taking the modulate's inputs from ``it``."""
    if chain is None:
        return None, None, None
    scale = ModOperand(chain.scale.node, table=False).emit(graph, it, chain.unsqueeze_dim)[0]
    shift = next(it) if chain.shift is not None else None
    return scale, shift, chain.out_dtype


@register_family
class RmsNorm(PatternFamily):
    name = "rms_norm"
    tier = "lossless"
    anchors = (aten._fused_rms_norm.default,)
    description = "torch.nn.RMSNorm (_fused_rms_norm) [+ AdaLN modulate (1 + scale) [+ shift] [→ cast]]"
    variants = (
        "_fused_rms_norm(x, [D], w, eps)[0]                (QK norm over head_dim: FLUX/FLUX.2; across heads: Wan)",
        "_fused_rms_norm(x, [D], None, eps)[0]             (no weight)",
        "_fused_rms_norm(...)[0] * (1 + scale) [+ shift] [→ cast]   (modulate, any norm_modulate spelling)",
    )

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        x, normalized_shape = node.args[:2]
        weight, eps = _arg(node, 2, "weight"), _arg(node, 3, "eps")
        if len(normalized_shape) != 1:
            return NearMiss(self.name, node, f"normalized_shape {list(normalized_shape)} spans more than the last dim")
        try:
            outs = getitem_users(node)
        except LookupError as e:
            return NearMiss(self.name, node, str(e))
        if set(outs) != {0}:
            return NearMiss(self.name, node, f"rstd output is used (getitems {sorted(outs)})") if outs else None
        y = outs[0]
        if not y.users:
            return None
        chain = _single_modulate(y, node)
        has_w = isinstance(weight, fx.Node)

        def emit(graph: fx.Graph, ins):
            it = iter(ins)
            x_n = next(it)
            w_n = next(it) if has_w else None
            scale, shift, out_dtype = _emit_modulate(graph, chain, it)
            return [graph.call_function(torch.ops.diffusion_fuse.rms_norm.default,
                                        (x_n, w_n, None if eps is None else float(eps), scale, shift, out_dtype))]

        return Site(
            pattern=self.name,
            anchor=node,
            nodes=[node, y] + (chain.nodes if chain else []),
            inputs=[x] + ([weight] if has_w else []) + _modulate_inputs(chain),
            outputs=[chain.last if chain else y],
            emit=emit,
            op="diffusion_fuse::rms_norm",
        )


def _normalized(norm: fx.Node) -> fx.Node | None:
    """Output 0 of ``_fused_rms_norm`` node ``norm`` if nothing reads its rstd (output 1), else None."""
    try:
        outs = getitem_users(norm)
    except LookupError:
        return None
    return outs[0] if set(outs) == {0} else None


def _norm_output(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(norm, y) if ``node`` is output 0 of a ``_fused_rms_norm`` over the last dim whose rstd nobody reads."""
    if not (node.op == "call_function" and node.target is operator.getitem and node.args[1] == 0):
        return None
    norm = node.args[0]
    if not is_op(norm, aten._fused_rms_norm.default) or len(norm.args[1]) != 1:
        return None
    return (norm, node) if _normalized(norm) is node else None


class _Rope:
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
        if not is_op(unbind, aten.unbind.int) or _arg(unbind, 1, "dim", 0) not in (-1, yv.dim()):
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
        if _arg(stack, 1, "dim", 0) not in (-1, yv.dim()):
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
    priority = 1  # tried before rms_norm on the same anchor: the larger site
    anchors = (aten._fused_rms_norm.default,)
    description = "torch.nn.RMSNorm (_fused_rms_norm) → RoPE (apply_rotary_emb, use_real, pairs along D)"
    variants = (
        "_fused_rms_norm(x, [D], w, eps)[0] → apply_rotary_emb(·, (cos, sin))   (FLUX/FLUX.2 single-block q and k)",
    )

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        x, normalized_shape = node.args[:2]
        weight, eps = _arg(node, 2, "weight"), _arg(node, 3, "eps")
        y = _normalized(node)
        if len(normalized_shape) != 1 or y is None:
            return None  # family rms_norm says why
        rope = _Rope(y)
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


@register_family
class RmsNormCatRope(PatternFamily):
    name = "rms_norm_cat_rope"
    tier = "lossless"
    priority = 2  # tried before rms_norm_rope and rms_norm on the same anchor: the larger site
    anchors = (aten._fused_rms_norm.default,)
    description = "two RMSNorms (_fused_rms_norm) → cat along a row dim → RoPE (FLUX/FLUX.2 double-block q and k)"
    variants = (
        "cat([_fused_rms_norm(x_txt)[0], _fused_rms_norm(x_img)[0]], 1) → apply_rotary_emb(·, (cos, sin))",
    )

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        y = _normalized(node)
        cat = single_user(y) if y is not None else None
        if not is_op(cat, aten.cat.default) or len(cat.args[0]) != 2 or val(cat) is None:
            return None
        halves = [_norm_output(t) if isinstance(t, fx.Node) else None for t in cat.args[0]]
        if any(h is None or single_user(h[1]) is not cat for h in halves) or halves[0][0] is halves[1][0]:
            return None
        if node not in (halves[0][0], halves[1][0]):
            return None
        ndim = val(cat).dim()
        dim = _arg(cat, 1, "dim", 0)
        dim = dim + ndim if dim < 0 else dim
        if not 0 <= dim < ndim - 1:
            return None
        rope = _Rope(cat)
        if rope.out is None:
            return None
        parts = []
        for norm, _y in halves:
            w, eps = _arg(norm, 2, "weight"), _arg(norm, 3, "eps")
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


def _eps_of(add: object) -> tuple[fx.Node, float] | None:
    """(mean, eps) if ``add`` is ``mean + eps`` with a float eps, else None."""
    if not is_op(add, aten.add.Tensor, aten.add.Scalar) or len(add.args) != 2 or add.kwargs.get("alpha", 1) != 1:
        return None
    a, eps = add.args
    if not isinstance(a, fx.Node) or not isinstance(eps, (int, float)) or isinstance(eps, bool):
        return None
    return a, float(eps)


def _param_of(node: fx.Node, prev: fx.Node, target, D: int) -> fx.Node | None:
    """p if ``node`` is ``target(prev, p)`` (either order) with p a [D] tensor, else None."""
    if not is_op(node, target) or len(node.args) != 2 or node.kwargs.get("alpha", 1) != 1 or prev not in node.args:
        return None
    try:
        p = other_operand(node, prev)
    except LookupError:
        return None
    v = val(p)
    return p if isinstance(p, fx.Node) and v is not None and tuple(v.shape) == (D,) else None


class _Tail:
    """The ops after ``mul(x, rsqrt)``: [cast1] [* weight] [+ bias] [cast2], in this order."""

    def __init__(self, mul: fx.Node, D: int) -> None:
        self.nodes: list[fx.Node] = []
        self.cast1 = self.weight = self.bias = self.cast2 = None
        cur, stage = mul, 0
        while (u := single_user(cur)) is not None:
            if stage == 0 and cast_dtype(u) is not None:
                self.cast1, stage = cast_dtype(u), 1
            elif stage <= 1 and (w := _param_of(u, cur, aten.mul.Tensor, D)) is not None:
                self.weight, stage = w, 2
            elif stage <= 2 and (b := _param_of(u, cur, aten.add.Tensor, D)) is not None:
                self.bias, stage = b, 3
            elif stage <= 3 and cast_dtype(u) is not None:
                self.cast2, stage = cast_dtype(u), 4
            else:
                break
            self.nodes.append(u)
            cur = u
        self.last = cur


@register_family
class RmsNormChain(PatternFamily):
    name = "rms_norm_chain"
    tier = "high"
    anchors = (aten.rsqrt.default,)
    description = "RMSNorm as pow → mean → rsqrt (diffusers RMSNorm, composite rms_norm) [+ modulate]; not exact"
    variants = (
        "x.float().pow(2).mean(-1, keepdim) + eps → rsqrt → x * r → .to(bf16) → * w  (diffusers, half weight)",
        "x.pow(2).mean(-1, keepdim) + eps → rsqrt → x * r → * w [+ b]              (fp32 model)",
        "x * r → .to(x.dtype)                                                      (no weight)",
        "xf * r → * w → .to(x.dtype)                                               (composite rms_norm)",
        "... → * (1 + scale) [+ shift] [→ cast]                                   (LTX, Cosmos, Lumina AdaLN)",
    )

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        found = _eps_of(node.args[0])
        if found is None:
            return None
        add, (mean, eps) = node.args[0], found
        if not is_op(mean, aten.mean.dim) or not is_op(mean.args[0], aten.pow.Tensor_Scalar):
            return None
        pow_ = mean.args[0]
        xf = pow_.args[0]
        if not is_scalar(pow_.args[1], 2.0) or val(xf) is None:
            return None
        ndim = val(xf).dim()
        dims, keepdim = _arg(mean, 1, "dim"), _arg(mean, 2, "keepdim", False)
        if list(dims or []) not in ([-1], [ndim - 1]) or not keepdim or mean.kwargs.get("dtype") is not None:
            return NearMiss(self.name, node, f"mean over dims {dims} (keepdim={keepdim}), not the last dim only")
        if val(xf).dtype != torch.float32:
            return NearMiss(self.name, node, f"pow input is {val(xf).dtype}, not float32")
        mul = single_user(node)
        if not is_op(mul, aten.mul.Tensor) or list(mul.args).count(node) != 1:
            return NearMiss(self.name, node, "rsqrt is not read by one mul by the input")
        a = other_operand(mul, node)
        # Fold the input cast x.to(f32) when only the chain reads it.
        x, nodes = xf, [pow_, mean, add, node, mul]
        src = xf.args[0] if cast_dtype(xf) == torch.float32 and isinstance(xf.args[0], fx.Node) else None
        if src is not None and val(src) is not None and val(src).dtype in _HALF and set(xf.users) <= {pow_, mul}:
            x, nodes = src, [xf] + nodes
        if a not in (x, xf) or not same_shape(mul, x):
            return NearMiss(self.name, node, "the normalized value is not x * rsqrt(...) of the pow's input")
        D = val(x).shape[-1]
        tail = _Tail(mul, D)
        chain = _single_modulate(tail.last, node)
        nodes += tail.nodes + (chain.nodes if chain else [])
        params = [p for p in (tail.weight, tail.bias) if p is not None]

        def emit(graph: fx.Graph, ins):
            it = iter(ins)
            x_n = next(it)
            w_n = next(it) if tail.weight is not None else None
            b_n = next(it) if tail.bias is not None else None
            scale, shift, out_dtype = _emit_modulate(graph, chain, it)
            return [graph.call_function(torch.ops.diffusion_fuse.rms_norm_chain.default,
                                        (x_n, eps, tail.cast1, w_n, b_n, tail.cast2, scale, shift, out_dtype))]

        return Site(
            pattern=self.name,
            anchor=node,
            nodes=nodes,
            inputs=[x] + params + _modulate_inputs(chain),
            outputs=[chain.last if chain else tail.last],
            emit=emit,
            op="diffusion_fuse::rms_norm_chain",
            exact=False,
        )
