"""``diffusion_fuse::rms_norm_chain`` (tier high, not bit-exact): diffusers' ``RMSNorm`` chain as one op::

    xf = x.to(float32)                                      # absent for an fp32 x
    h  = x * rsqrt(mean(pow(xf, 2), -1, keepdim=True) + eps)
    h  = h.to(cast1); h = h * weight; h = h + bias; h = h.to(cast2)     # each optional, in this order
    out = h * (scale + 1) [+ shift] [→ out_dtype]           # optional

(diffusers' RMSNorm is ``cast1 = weight dtype`` then ``* weight`` for a half-precision weight, ``cast2 = x.dtype``
without a weight; PyTorch's composite ``rms_norm`` is ``* weight`` then ``cast2 = x.dtype``.) Eager's mean is
ATen's generic reduce kernel, which kernels/rms_norm.py does not replay: sites are judged within tolerance. The
output has x's layout (``empty_like``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.rms_norm import plan_rms_norm, rms_norm_chain_tail
from . import checks
from .norm_modulate import modulate
from .rms_norm import check_param, check_x, row_dims
from .spec import OpSpec, register_op


def rms_norm_chain(x: Tensor, eps: float, cast1: torch.dtype | None, weight: Tensor | None, bias: Tensor | None,
                   cast2: torch.dtype | None, scale: Tensor | None, shift: Tensor | None,
                   out_dtype: torch.dtype | None) -> Tensor:
    xf = x.to(torch.float32)
    # x * r: a bf16/fp16 x is promoted exactly, so this is the graph's mul(x, r) or mul(xf, r) alike.
    h = x * torch.rsqrt(torch.mean(torch.pow(xf, 2), dim=-1, keepdim=True) + eps)
    if cast1 is not None:
        h = h.to(cast1)
    if weight is not None:
        h = h * weight
    if bias is not None:
        h = h + bias
    if cast2 is not None:
        h = h.to(cast2)
    out = h if scale is None else modulate(h, scale, shift, out_dtype)
    like = torch.empty_like(x, dtype=out.dtype)
    if out.stride() != like.stride():  # the kernel writes x's layout
        like.copy_(out)
        out = like
    return out


def _like_strides(x: Tensor) -> tuple[int, ...]:
    return torch.empty_like(x, device="meta").stride()


def can_use_rms_norm_chain(a) -> tuple[bool, str]:
    x = a.x
    why = checks.device_and_dtypes(x, (a.weight, a.bias, a.scale, a.shift))
    if not why and any(c not in (None,) + checks.KERNEL_DTYPES for c in (a.cast1, a.cast2, a.out_dtype)):
        why = f"unsupported cast ({a.cast1}, {a.cast2}, {a.out_dtype})"
    why = why or check_x(x, vec_only=False)
    why = why or check_param("weight", a.weight, x.shape[-1]) or check_param("bias", a.bias, x.shape[-1])
    why = why or checks.broadcast(x.shape, scale=a.scale, shift=a.shift)
    if not why and row_dims(x, _like_strides(x), a.scale, a.shift) is None:
        why = "x's rows span more than 3 strided dims"
    return not why, why


def plan(a):
    x = a.x
    tail, final = rms_norm_chain_tail(a.cast1, a.weight, a.bias, a.cast2, a.scale, a.shift, a.out_dtype)
    out_strides = _like_strides(x)
    launch = plan_rms_norm(x, x.shape, out_strides, final, a.weight, a.bias, a.eps, a.scale, a.shift, tail,
                           row_dims(x, out_strides, a.scale, a.shift))
    return lambda a: launch(a.x, a.weight, a.bias, a.scale, a.shift)[0]


SPEC = register_op(OpSpec("rms_norm_chain", rms_norm_chain, guard=can_use_rms_norm_chain, plan=plan))
