"""``diffusion_fuse::layer_norm``: a LayerNorm with its input and output casts (patterns/layer_norm.py)::

    out = native_layer_norm(x [→ ln_dtype], [D], weight, bias, eps)[0] [→ out_dtype]

CUDA inputs the guard accepts run kernels/norm_modulate.py's kernel without its modulate (HAS_SCALE=False), or, for
rows of at most 128 elements (QK norms over a head), its multi-row ``_short_rows_kernel``. x's
rows (its leading dims, merged where they step evenly: kernels/rows.row_layout) are read in place through a view
of at most three row dims: [M, D], [B, S, D], or [B, H, S, D] (X_HEADS: a [B, S, H, D] projection transposed to
[B, H, S, D], as attention QK norms read it); the output is contiguous, as eager's.
"""

from __future__ import annotations

import types

import torch
from torch import Tensor

from ..kernels.norm_modulate import plan_norm_modulate, plan_short_rows
from ..kernels.rows import row_layout
from . import checks
from .norm_modulate import can_use_norm_modulate, layer_norm_modulate
from .spec import OpSpec, register_op


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, ln_dtype: torch.dtype | None,
               out_dtype: torch.dtype | None) -> Tensor:
    return layer_norm_modulate(x, weight, bias, eps, None, None, ln_dtype, out_dtype)


def folded_rows(x: Tensor) -> Tensor | None:
    """``x`` as a [M, D], [B, S, D] or [B, H, S, D] view of the same memory (its leading dims merged where they
    step evenly), or None when more than three row dims remain."""
    if x.dim() < 2:
        return None
    layout = row_layout(tuple(x.shape), tuple(x.stride()))
    if layout is None:
        return None
    (L0, L1, L2), ((s0, s1, s2),) = layout
    if L0 == 1:
        return x.as_strided((L1, L2, x.shape[-1]), (s1, s2, x.stride(-1)))
    return x.as_strided((L0, L1, L2, x.shape[-1]), (s0, s1, s2, x.stride(-1)))


def _as_norm_modulate(a, x: Tensor) -> types.SimpleNamespace:
    """The arguments as family norm_modulate's kernel and guard read them: x's rows, no modulate."""
    return types.SimpleNamespace(x=x, weight=a.weight, bias=a.bias, eps=a.eps, scale=None, shift=None,
                                 ln_dtype=a.ln_dtype, out_dtype=a.out_dtype, scale_temb=None, shift_temb=None)


def _rows_problem(x: Tensor) -> str:
    if folded_rows(x) is None:
        return f"x {tuple(x.shape)} with strides {x.stride()}: its rows span more than three strided dims " \
               "(the kernel addresses rows by batch, head and token)"
    return ""


def can_use_layer_norm(a) -> tuple[bool, str]:
    why = _rows_problem(a.x)
    return (False, why) if why else can_use_norm_modulate(_as_norm_modulate(a, folded_rows(a.x)))


def _static_guard(a) -> str:
    return _rows_problem(a.x) or checks.rows("x", folded_rows(a.x), unit_stride_d=False, ranks=(2, 3, 4))


def _plan(a):
    shape = a.x.shape
    run = plan_short_rows(_as_norm_modulate(a, folded_rows(a.x))) or \
        plan_norm_modulate(_as_norm_modulate(a, folded_rows(a.x)))
    return lambda a: run(_as_norm_modulate(a, folded_rows(a.x))).view(shape)


SPEC = register_op(OpSpec("layer_norm", layer_norm, guard=can_use_layer_norm, plan=_plan,
                          static_guard=_static_guard))
