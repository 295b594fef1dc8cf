"""Family ``rms_norm_chain`` (tier high, not bit-exact: eager's mean is ATen's generic reduce kernel), as one op
``diffusion_fuse::rms_norm_chain``. It covers the pow → mean → rsqrt chain as diffusers' ``RMSNorm`` and PyTorch's
composite ``rms_norm`` write it:

- ``[_to_copy(x, f32)] → pow(·, 2) → mean(·, [-1], True) → add(·, eps) → rsqrt → mul(x or xf, ·)``
  (``add.Tensor``/``add.Scalar``, the mean's dim as -1 or ndim-1, Inductor's ``convert_element_type``);
- then, in this order and each optional: a cast, ``* weight [D]``, ``+ bias [D]``, a cast;
- then optionally the modulate, every spelling family ``norm_modulate`` accepts.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .match_utils import arg, aten, cast_dtype, is_op, is_scalar, other_operand, same_shape, single_user, val
from .registry import Example, NearMiss, PatternFamily, Site, example_tensor, register_family
from .rms_norm import emit_modulate, modulate_inputs, single_modulate

_HALF = (torch.bfloat16, torch.float16)


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
    kernel = "rms_norm"  # the rms_norm kernel with the chain's tail
    anchors = (aten.rsqrt.default,)
    description = "RMSNorm as pow → mean → rsqrt (diffusers RMSNorm, composite rms_norm) [+ modulate]; not exact"
    variants = (
        "x.float().pow(2).mean(-1, keepdim) + eps → rsqrt → x * r → .to(bf16) → * w  (diffusers, half weight)",
        "x.pow(2).mean(-1, keepdim) + eps → rsqrt → x * r → * w [+ b]              (fp32 model)",
        "x * r → .to(x.dtype)                                                      (no weight)",
        "xf * r → * w → .to(x.dtype)                                               (composite rms_norm)",
        "... → * (1 + scale) [+ shift] [→ cast]                                   (LTX, Cosmos, Lumina AdaLN)",
    )


    def example(self) -> Example:
        def diffusers_rms_norm(x, w):  # diffusers' RMSNorm with a half-precision weight
            variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
            return (x * torch.rsqrt(variance + 1e-6)).to(w.dtype) * w

        return diffusers_rms_norm, (example_tensor(2, 8, 64), example_tensor(64, seed=1))

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
        dims, keepdim = arg(mean, 1, "dim"), arg(mean, 2, "keepdim", False)
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
        chain = single_modulate(tail.last, node)
        nodes += tail.nodes + (chain.nodes if chain else [])
        params = [p for p in (tail.weight, tail.bias) if p is not None]

        def emit(graph: fx.Graph, ins):
            it = iter(ins)
            x_n = next(it)
            w_n = next(it) if tail.weight is not None else None
            b_n = next(it) if tail.bias is not None else None
            scale, shift, out_dtype = emit_modulate(graph, chain, it)
            return [graph.call_function(torch.ops.diffusion_fuse.rms_norm_chain.default,
                                        (x_n, eps, tail.cast1, w_n, b_n, tail.cast2, scale, shift, out_dtype))]

        return Site(
            pattern=self.name,
            anchor=node,
            nodes=nodes,
            inputs=[x] + params + modulate_inputs(chain),
            outputs=[chain.last if chain else tail.last],
            emit=emit,
            op="diffusion_fuse::rms_norm_chain",
            exact=False,
        )
