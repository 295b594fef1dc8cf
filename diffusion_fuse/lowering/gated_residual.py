"""``diffusion_fuse::gated_residual``: ``r = residual + (gate [+ gate_temb]) * x [→ r_dtype]``, where no LayerNorm
reads ``r`` in the graph (patterns/gated_residual.py).

The reference is the ATen chain; CUDA inputs the guard accepts run kernels/gated_residual.py.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.gated_residual import plan_gated_residual
from . import checks
from .norm_modulate import with_addend
from .spec import OpSpec, register_op


def gated_residual(residual: Tensor, x: Tensor, gate: Tensor, gate_temb: Tensor | None = None,
                   r_dtype: torch.dtype | None = None, mul_first: bool | None = None) -> Tensor:
    # Eager's layout too, which the verifier judges: an add of differently laid out operands (a permuted patch
    # embedding as the residual) follows its first operand's order, so the add keeps the traced operand order
    # (mul_first: ``gate * x + residual``). The values do not depend on it.
    gx = with_addend(gate, gate_temb) * x
    r = gx + residual if mul_first else residual + gx
    return r if r_dtype is None else r.to(r_dtype)


def _row_major(t: Tensor) -> bool:
    """Strides non-increasing over the dims of size > 1: eager's output of such operands is row-major too."""
    st = [s for n, s in zip(t.shape, t.stride()) if n > 1]
    return all(p >= q for p, q in zip(st, st[1:]))


def reads_rows(t: Tensor) -> bool:
    """Whether the kernels read ``t`` as it is: unit stride along D, rows in row-major order."""
    return t.stride(-1) == 1 and _row_major(t)


def can_use_gated_residual(a, residual_copied: bool = False) -> tuple[bool, str]:
    """Whether the gated-residual kernel reproduces eager for these arguments; else the reason (``a`` may be any
    op's arguments with the fields of this one). ``residual_copied``: the kernel is to read a contiguous copy of
    the residual, whatever its layout."""
    x = a.x
    why = checks.device_and_dtypes(x, (a.residual, a.gate, a.gate_temb))
    if not why and a.r_dtype not in (None,) + checks.KERNEL_DTYPES:
        why = f"unsupported cast (r_dtype {a.r_dtype})"
    why = why or checks.rows("x", x) or checks.rows("residual", a.residual, unit_stride_d=not residual_copied)
    if not why and a.residual.shape != x.shape:
        why = f"residual {tuple(a.residual.shape)} and x {tuple(x.shape)} differ in shape"
    if not why and not ((residual_copied or _row_major(a.residual)) and _row_major(x)):
        why = "residual or x not in row-major order (eager's output follows their layout; the kernel writes rows)"
    why = why or checks.addends(gate=(a.gate, a.gate_temb))
    why = why or checks.broadcast(x.shape, gate=a.gate, gate_temb=a.gate_temb)
    return not why, why


SPEC = register_op(OpSpec("gated_residual", gated_residual, guard=can_use_gated_residual, plan=plan_gated_residual))
