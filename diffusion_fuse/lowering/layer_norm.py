"""``diffusion_fuse::layer_norm``: a LayerNorm with its input and output casts (patterns/layer_norm.py)::

    out = native_layer_norm(x [→ ln_dtype], [D], weight, bias, eps)[0] [→ out_dtype]

CUDA inputs the guard accepts run kernels/norm_modulate.py's kernel without its modulate.
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


def _as_norm_modulate(a) -> types.SimpleNamespace:
    """The arguments as family norm_modulate's kernel and guard read them: no modulate."""
    return types.SimpleNamespace(x=a.x, weight=a.weight, bias=a.bias, eps=a.eps, scale=None, shift=None,
                                 ln_dtype=a.ln_dtype, out_dtype=a.out_dtype, scale_temb=None, shift_temb=None)


def _static_guard(a) -> str:
    return checks.rows("x", a.x, unit_stride_d=False) if a.x.dim() in (2, 3) else \
        f"x has rank {a.x.dim()} (the kernel takes rows of 2- or 3-dim tensors)"


def _plan(a):
    run = plan_norm_modulate(_as_norm_modulate(a))
    return lambda a: run(_as_norm_modulate(a))


SPEC = register_op(OpSpec("layer_norm", layer_norm, guard=lambda a: can_use_norm_modulate(_as_norm_modulate(a)),
                          plan=_plan, static_guard=_static_guard))
