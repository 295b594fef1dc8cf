"""``diffusion_fuse::gated_residual``: ``r = residual + (gate [+ gate_temb]) * x [→ r_dtype]``, where no LayerNorm
reads ``r`` in the graph (patterns/gated_residual.py).

The reference is the ATen chain; CUDA inputs the guard accepts run kernels/gated_residual.py: its row kernel, or,
for a residual not laid out in rows (a patch embedding's D-major tokens, whose layout every later residual add
keeps), its tile kernel, which writes ``r`` in eager's layout.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.gated_residual import plan_gated_residual, plan_gated_residual_tiles
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
    """Whether the row kernels read ``t`` as it is: unit stride along D, rows in row-major order."""
    return t.stride(-1) == 1 and _row_major(t)


def eager_r_strides(a) -> tuple[int, ...]:
    """The strides of eager's ``r`` for these operands: the reference on meta tensors of their layouts (an add of
    differently laid out operands follows its first operand's order)."""
    def meta(t: Tensor | None) -> Tensor | None:
        return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")

    return gated_residual(meta(a.residual), meta(a.x), meta(a.gate), meta(a.gate_temb), a.r_dtype,
                          a.mul_first).stride()


def r_in_rows(a) -> bool:
    """Whether the row kernel serves these operands: it reads the residual as rows and writes ``r`` row-major,
    as eager does for row-major operands. Otherwise the tile kernel runs (kernels/gated_residual.py)."""
    return reads_rows(a.residual) and _row_major(a.x)


def can_use_gated_residual(a) -> tuple[bool, str]:
    """Whether the gated-residual kernels reproduce eager for these arguments; else the reason (``a`` may be any
    op's arguments with the fields of this one). The residual may have any layout: one the row kernel cannot read
    (``r_in_rows``) goes to the tile kernel, which writes ``r`` in eager's layout."""
    x = a.x
    why = checks.device_and_dtypes(x, (a.residual, a.gate, a.gate_temb))
    if not why and a.r_dtype not in (None,) + checks.KERNEL_DTYPES:
        why = f"unsupported cast (r_dtype {a.r_dtype})"
    why = why or checks.rows("x", x)
    if not why and a.residual.shape != x.shape:
        why = f"residual {tuple(a.residual.shape)} and x {tuple(x.shape)} differ in shape"
    why = why or checks.addends(gate=(a.gate, a.gate_temb))
    why = why or checks.broadcast(x.shape, gate=a.gate, gate_temb=a.gate_temb)
    return not why, why


def _plan(a):
    """The row kernel where ``r_in_rows``, else the tile kernel writing ``r`` at eager's strides."""
    if r_in_rows(a):
        return plan_gated_residual(a)
    tiles = plan_gated_residual_tiles(a, eager_r_strides(a), rows=False)
    return lambda a: tiles(a)[0]


SPEC = register_op(OpSpec("gated_residual", gated_residual, guard=can_use_gated_residual, plan=_plan))
