"""``diffusion_fuse::rms_norm_rope``: ``rms_norm`` without modulate, then diffusers' ``apply_rotary_emb``
(``use_real=True``, ``use_real_unbind_dim=-1``: pairs along D)::

    re, im = y.unflatten(-1, (-1, 2)).unbind(-1)
    out = (y.float() * cos + stack([-im, re], -1).flatten(-2).float() * sin).to(y.dtype)

CUDA inputs the guard accepts run kernels/rms_norm.py with the RoPE in its epilogue (patterns/rms_norm_rope.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.rms_norm import plan_rms_norm, rms_norm_tail
from . import checks
from .rms_norm import check_norm, contiguous_strides, default_eps, fused_rms_norm, row_dims
from .spec import OpSpec, register_op


def rope(y: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """diffusers' ``apply_rotary_emb`` (use_real, unbind -1) on y, op for op as eager runs it."""
    re, im = y.unflatten(-1, (-1, 2)).unbind(-1)
    rot = torch.stack([-im, re], -1).flatten(-2)
    return (y.float() * cos + rot.float() * sin).to(y.dtype)


def rms_norm_rope(x: Tensor, weight: Tensor | None, eps: float | None, cos: Tensor, sin: Tensor) -> Tensor:
    return rope(fused_rms_norm(x, weight, eps), cos, sin)


def narrow_rows(t: Tensor, ndim: int, dim: int, start: int, length: int) -> Tensor:
    """``t`` (broadcasting to an ``ndim``-dim output) restricted to output positions [start, start+length) of ``dim``."""
    d = dim - (ndim - t.dim())
    return t if d < 0 or t.shape[d] == 1 else t.narrow(d, start, length)


def check_rope_tables(shape, dim: int, cos: Tensor, sin: Tensor, parts) -> str:
    """'' if cos/sin are fp32 on the parts' device, broadcast to the output ``shape`` with unit stride along D,
    and each part (x, its first position along ``dim``) has rows the kernel can address with its slice of them."""
    device = parts[0][0].device
    if any(t.dtype != torch.float32 or t.device != device for t in (cos, sin)):
        return f"cos/sin are {cos.dtype}/{sin.dtype} on {cos.device}/{sin.device}, not float32 on {device}"
    why = checks.broadcast(shape, cos=cos, sin=sin)
    out_strides = contiguous_strides(shape)
    for x, start in parts:
        c, s = (narrow_rows(t, len(shape), dim, start, x.shape[dim]) for t in (cos, sin))
        if not why and row_dims(x, out_strides, c, s) is None:
            why = "x's rows span more than 3 strided dims"
    return why


def can_use_rms_norm_rope(a) -> tuple[bool, str]:
    """The norm as ``rms_norm``'s guard takes it; cos/sin fp32, broadcast to x over its rows with unit stride
    along D."""
    why = check_norm(a.x, a.weight) or check_rope_tables(a.x.shape, 0, a.cos, a.sin, [(a.x, 0)])
    return not why, why


def plan_part(x, weight, eps, cos, sin, out_strides):
    """The kernel for x with the RoPE epilogue, writing rows laid out as ``out_strides`` (x's own output or a part
    of one)."""
    tail, final = rms_norm_tail(x.dtype, weight, None, None, None)
    return plan_rms_norm(x, x.shape, out_strides, final, weight, None, default_eps(eps), cos, sin, tail,
                         row_dims(x, out_strides, cos, sin), rope=True)


def plan(a):
    launch = plan_part(a.x, a.weight, a.eps, a.cos, a.sin, contiguous_strides(a.x.shape))
    return lambda a: launch(a.x, a.weight, None, a.cos, a.sin)[0]


SPEC = register_op(OpSpec("rms_norm_rope", rms_norm_rope, guard=can_use_rms_norm_rope, plan=plan))
