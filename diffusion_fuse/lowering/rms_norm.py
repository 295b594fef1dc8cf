"""``diffusion_fuse::rms_norm``: ``torch.nn.RMSNorm`` [+ AdaLN modulate] as one op.

Semantics are those of the ATen chain the pattern replaces (patterns/rms_norm.py)::

    y   = aten._fused_rms_norm(x, [D], weight, eps)[0]     # torch.nn.RMSNorm / F.rms_norm on CUDA
    out = y * (scale + 1) [+ shift] [→ out_dtype]           # optional, each op rounded to its eager dtype

CUDA inputs the guard accepts run kernels/rms_norm.py; the output is contiguous, as ``_fused_rms_norm``'s. The row
helpers here are shared by ``rms_norm_rope``, ``rms_norm_cat_rope`` and ``rms_norm_chain``, which run the same
kernel with another epilogue.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.layer_norm_stats import VEC
from ..kernels.rms_norm import plan_rms_norm, rms_norm_tail
from ..kernels.rows import row_layout
from . import checks
from .norm_modulate import modulate
from .spec import OpSpec, register_op


def fused_rms_norm(x: Tensor, weight: Tensor | None, eps: float | None) -> Tensor:
    return torch.ops.aten._fused_rms_norm.default(x, [x.shape[-1]], weight, eps)[0]


def rms_norm(x: Tensor, weight: Tensor | None, eps: float | None, scale: Tensor | None, shift: Tensor | None,
             out_dtype: torch.dtype | None) -> Tensor:
    y = fused_rms_norm(x, weight, eps)
    return y if scale is None else modulate(y, scale, shift, out_dtype)


def row_dims(x: Tensor, out_strides, scale: Tensor | None, shift: Tensor | None):
    """``kernels.rows.row_layout`` of x, the two epilogue operands and the output, or None (too many dims)."""
    mods = ((0,) * x.dim() if t is None else t.expand(x.shape).stride() for t in (scale, shift))
    return row_layout(x.shape, x.stride(), *mods, out_strides)


def check_x(x: Tensor, vec_only: bool) -> str:
    if x.dim() == 0 or x.numel() == 0:
        return "empty input" if x.dim() else "x is a scalar"
    D = x.shape[-1]
    if D > checks.MAX_D or (vec_only and D % VEC):
        what = (f"multiples of {VEC} up to {checks.MAX_D}: eager's vectorized RMSNorm" if vec_only
                else f"up to {checks.MAX_D}")
        return f"D={D} (kernel takes {what})"
    return ""


def check_param(name: str, p: Tensor | None, D: int, dtype: torch.dtype | None = None, align: int = 1) -> str:
    if p is None:
        return ""
    if p.shape != (D,) or not p.is_contiguous() or (dtype is not None and p.dtype != dtype):
        return f"{name} is not a contiguous [{D}] {dtype or ''} tensor".replace("  ", " ")
    if p.data_ptr() % align:
        return f"{name} is not {align}-byte aligned (eager takes its non-vectorized RMSNorm)"
    return ""


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def check_norm(x: Tensor, weight: Tensor | None, scale: Tensor | None = None, shift: Tensor | None = None,
               out_dtype: torch.dtype | None = None) -> str:
    """'' if the kernel reproduces eager's ``_fused_rms_norm`` (+ modulate) bits for these operands."""
    why = checks.device_and_dtypes(x, (weight, scale, shift))
    if not why and out_dtype not in (None,) + checks.KERNEL_DTYPES:
        why = f"unsupported cast (out_dtype {out_dtype})"
    why = why or check_x(x, vec_only=True)
    align = VEC * x.element_size()
    why = why or check_param("weight", weight, x.shape[-1], x.dtype, align)
    # Eager normalizes a contiguous x in place of memory, a non-contiguous one from an aligned copy.
    if not why and x.is_contiguous() and x.data_ptr() % align:
        why = f"x is not {align}-byte aligned (eager takes its non-vectorized RMSNorm)"
    why = why or checks.broadcast(x.shape, scale=scale, shift=shift)
    if not why and row_dims(x, contiguous_strides(x.shape), scale, shift) is None:
        why = "x's rows span more than 3 strided dims"
    return why


def default_eps(eps: float | None) -> float:
    """``_fused_rms_norm``'s eps when none is given: the fp32 epsilon."""
    return float(torch.finfo(torch.float32).eps) if eps is None else eps


def can_use_rms_norm(a) -> tuple[bool, str]:
    why = check_norm(a.x, a.weight, a.scale, a.shift, a.out_dtype)
    return not why, why


def plan(a, push_fma: bool = True):
    x = a.x
    tail, final = rms_norm_tail(x.dtype, a.weight, a.scale, a.shift, a.out_dtype)
    out_strides = contiguous_strides(x.shape)
    launch = plan_rms_norm(x, x.shape, out_strides, final, a.weight, None, default_eps(a.eps), a.scale, a.shift,
                           tail, row_dims(x, out_strides, a.scale, a.shift), push_fma=push_fma)
    return lambda a: launch(a.x, a.weight, None, a.scale, a.shift)[0]


SPEC = register_op(OpSpec("rms_norm", rms_norm, guard=can_use_rms_norm, plan=plan))
