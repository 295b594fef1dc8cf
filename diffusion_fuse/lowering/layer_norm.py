"""``diffusion_fuse::layer_norm``: a LayerNorm with its input and output casts (patterns/layer_norm.py)::

    out = native_layer_norm(x [→ ln_dtype], [D], weight, bias, eps)[0] [→ out_dtype]

CUDA inputs the guard accepts run kernels/norm_modulate.py's kernel without its modulate (HAS_SCALE=False). The
kernel addresses rows by (batch, token): x of any rank whose leading dims fold into two without a copy (a
contiguous [B, H, S, D], every other token of one, a [1, S, H, D] transposed to [1, H, S, D]) is read through
that view; the output is contiguous, as eager's.
"""

from __future__ import annotations

import types

import torch
from torch import Tensor

from ..kernels.norm_modulate import plan_norm_modulate
from . import checks
from .norm_modulate import can_use_norm_modulate, layer_norm_modulate
from .spec import OpSpec, register_op


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, ln_dtype: torch.dtype | None,
               out_dtype: torch.dtype | None) -> Tensor:
    return layer_norm_modulate(x, weight, bias, eps, None, None, ln_dtype, out_dtype)


def folded_rows(x: Tensor) -> Tensor | None:
    """``x`` as a [M, D] or [B, S, D] view of the same memory (its leading dims folded where their strides
    allow), or None when they do not fold into two."""
    if x.dim() in (2, 3):
        return x
    if x.dim() < 2:
        return None
    dims: list[list[int]] = []  # [size, stride] of the leading dims, outermost first, size-1 dims dropped
    for size, stride in zip(x.shape[:-1], x.stride()[:-1]):
        if size == 1:
            continue
        if dims and dims[-1][1] == stride * size:  # the outer dim steps over whole runs of this one: fold them
            dims[-1] = [dims[-1][0] * size, stride]
        else:
            dims.append([size, stride])
    if len(dims) > 2:
        return None
    dims = [[1, 0]] * (2 - len(dims)) + dims
    return x.as_strided((dims[0][0], dims[1][0], x.shape[-1]), (dims[0][1], dims[1][1], x.stride(-1)))


def _as_norm_modulate(a, x: Tensor) -> types.SimpleNamespace:
    """The arguments as family norm_modulate's kernel and guard read them: x's rows, no modulate."""
    return types.SimpleNamespace(x=x, weight=a.weight, bias=a.bias, eps=a.eps, scale=None, shift=None,
                                 ln_dtype=a.ln_dtype, out_dtype=a.out_dtype, scale_temb=None, shift_temb=None)


def _rows_problem(x: Tensor) -> str:
    if folded_rows(x) is None:
        return f"x {tuple(x.shape)} with strides {x.stride()}: its leading dims do not fold into two " \
               "(the kernel addresses rows by batch and token)"
    return ""


def can_use_layer_norm(a) -> tuple[bool, str]:
    why = _rows_problem(a.x)
    return (False, why) if why else can_use_norm_modulate(_as_norm_modulate(a, folded_rows(a.x)))


def _static_guard(a) -> str:
    return _rows_problem(a.x) or checks.rows("x", folded_rows(a.x), unit_stride_d=False)


def _plan(a):
    shape = a.x.shape
    run = plan_norm_modulate(_as_norm_modulate(a, folded_rows(a.x)))
    return lambda a: run(_as_norm_modulate(a, folded_rows(a.x))).view(shape)


SPEC = register_op(OpSpec("layer_norm", layer_norm, guard=can_use_layer_norm, plan=_plan,
                          static_guard=_static_guard))
