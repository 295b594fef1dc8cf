"""``diffusion_fuse::gated_residual_norm_modulate``: gated residual, LayerNorm and AdaLN modulate as one op (and
``gated_residual_norm_modulate_quant``, the same feeding static FP8 quantizers: lowering/fp8.py).

Semantics are those of the ATen chain the pattern replaces (patterns/gated_residual_norm_modulate.py)::

    r   = residual + gate * x                  # [→ r_dtype]: the next residual (returned)
    out = LN(r [→ ln_dtype]) [* (1 + scale) [+ shift]] [→ out_dtype]   # as diffusion_fuse::norm_modulate

each op rounded to its eager result dtype. The fp32 residual form is ``(residual.float() + x * gate).type_as(
residual)`` then an fp32 LayerNorm: ``r_dtype`` bf16 and ``ln_dtype`` fp32 (the widening casts of residual and x
are folded into the op by eager's type promotion, which computes the same fp32 values). ``scale=None``: the
LayerNorm is read by no modulate. ``gate_temb``/``scale_temb``/``shift_temb`` are optional second addends (a
chunked ``table + temb.float()``): the op uses ``gate + gate_temb`` etc., one fp32 add. Returns ``(r, out)``. CUDA
inputs the guard accepts run kernels/gated_residual_norm_modulate.py, which writes ``r`` once and never writes
``gate * x``, the normalized tensor or a table sum.

A residual the kernel cannot read in place (a patch embedding's ``flatten(2).transpose(1, 2)``: D-major tokens,
whose layout every later residual add keeps, as eager's add follows its first operand) is read from a contiguous
copy, and ``r`` goes back to eager's layout: one copy each way, the same values (``_through_contiguous``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.gated_residual import residual_dtypes
from ..kernels.gated_residual_norm_modulate import plan_gated_residual_norm_modulate
from . import checks
from .fp8 import quant_twin
from .gated_residual import can_use_gated_residual, gated_residual, reads_rows
from .norm_modulate import layer_norm_modulate
from .spec import OpSpec, register_op


def gated_residual_norm_modulate(residual: Tensor, x: Tensor, gate: Tensor, weight: Tensor | None,
                                 bias: Tensor | None, eps: float, scale: Tensor | None, shift: Tensor | None,
                                 out_dtype: torch.dtype | None, gate_temb: Tensor | None = None,
                                 scale_temb: Tensor | None = None, shift_temb: Tensor | None = None,
                                 r_dtype: torch.dtype | None = None,
                                 ln_dtype: torch.dtype | None = None,
                                 mul_first: bool | None = None) -> tuple[Tensor, Tensor]:
    r = gated_residual(residual, x, gate, gate_temb, r_dtype, mul_first)
    return r, layer_norm_modulate(r, weight, bias, eps, scale, shift, ln_dtype, out_dtype, scale_temb, shift_temb)


def can_use_gated_residual_norm_modulate(a) -> tuple[bool, str]:
    """Whether the Triton kernel reproduces eager for these arguments (a residual it cannot read in place
    through a contiguous copy); else the reason."""
    x = a.x
    _, why = can_use_gated_residual(a, residual_copied=a.residual.dim() in (2, 3) and not reads_rows(a.residual))
    why = why or checks.device_and_dtypes(x, (a.weight, a.bias, a.scale, a.shift, a.scale_temb, a.shift_temb))
    if not why and (a.out_dtype not in (None,) + checks.KERNEL_DTYPES or a.ln_dtype not in (None, torch.float32)):
        why = f"unsupported cast (out_dtype {a.out_dtype}, ln_dtype {a.ln_dtype})"
    # r is a fresh contiguous tensor, as eager's add makes it: eager's LayerNorm takes its
    # vectorized kernel on it, whatever the alignment of the inputs.
    r_dt = residual_dtypes(a.residual.dtype, x.dtype, checks.sum_dtype(a.gate, a.gate_temb), a.r_dtype)[1]
    why = why or checks.ln_params(x.shape[-1], a.ln_dtype or r_dt, a.weight, a.bias)
    if not why and a.scale is None and a.shift is not None:
        why = "shift without scale"
    why = why or checks.addends(scale=(a.scale, a.scale_temb), shift=(a.shift, a.shift_temb))
    why = why or checks.broadcast(x.shape, scale=a.scale, shift=a.shift, scale_temb=a.scale_temb,
                                  shift_temb=a.shift_temb)
    return not why, why


def _eager_r_strides(a) -> tuple[int, ...]:
    """The strides of eager's ``r`` for these operands: the reference on meta tensors of their layouts."""
    def meta(t: Tensor | None) -> Tensor | None:
        return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")

    return gated_residual(meta(a.residual), meta(a.x), meta(a.gate), meta(a.gate_temb), a.r_dtype,
                          a.mul_first).stride()


def _through_contiguous(plan):
    """``plan`` for a residual the kernel cannot read in place: the kernel reads a contiguous copy, and ``r``
    (the first output, of the op and of its quant twin) is copied back into eager's layout where that differs."""
    def planned(a, *quant):
        if reads_rows(a.residual):
            return plan(a, *quant)
        strides = _eager_r_strides(a)
        # the plan reads the copy's layout only: an empty one of that layout, not a copy
        inner = plan(a._replace(residual=torch.empty_like(a.residual, memory_format=torch.contiguous_format)), *quant)

        def launch(a):
            outs = inner(a._replace(residual=a.residual.contiguous()))
            r = outs[0]
            if r.stride() != strides:
                r = torch.empty_strided(r.shape, strides, dtype=r.dtype, device=r.device).copy_(r)
            return (r, *outs[1:]) if isinstance(outs, tuple) else [r, *outs[1:]]

        return launch

    return planned


SPEC = register_op(OpSpec("gated_residual_norm_modulate", gated_residual_norm_modulate,
                          guard=can_use_gated_residual_norm_modulate,
                          plan=_through_contiguous(plan_gated_residual_norm_modulate)))
QUANT_SPEC = quant_twin(SPEC, _through_contiguous(
    lambda a, quant: plan_gated_residual_norm_modulate(a, quant=quant)))
