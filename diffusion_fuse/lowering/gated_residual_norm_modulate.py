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

A residual the row kernel cannot read (a patch embedding's ``flatten(2).transpose(1, 2)``: D-major tokens, whose
layout every later residual add keeps, as eager's add follows its first operand) goes through
kernels/gated_residual.py's tile kernel, which writes ``r`` in eager's layout and a row-major copy of it; the
LayerNorm kernel then normalizes the copy (``_tiles_then_rows``), as eager's LayerNorm normalizes ``r.contiguous()``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.gated_residual import plan_gated_residual_tiles, residual_dtypes
from ..kernels.gated_residual_norm_modulate import plan_gated_residual_norm_modulate
from . import checks
from .fp8 import quant_twin
from .gated_residual import can_use_gated_residual, eager_r_strides, gated_residual, r_in_rows
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
    """Whether the Triton kernels reproduce eager for these arguments; else the reason."""
    x = a.x
    _, why = can_use_gated_residual(a)
    why = why or checks.device_and_dtypes(x, (a.weight, a.bias, a.scale, a.shift, a.scale_temb, a.shift_temb))
    if not why and (a.out_dtype not in (None,) + checks.KERNEL_DTYPES or a.ln_dtype not in (None, torch.float32)):
        why = f"unsupported cast (out_dtype {a.out_dtype}, ln_dtype {a.ln_dtype})"
    # r (or the tile kernel's copy of it) is a fresh contiguous tensor, as eager's add or LayerNorm's contiguous()
    # makes it: eager's LayerNorm takes its vectorized kernel on it, whatever the alignment of the inputs.
    r_dt = residual_dtypes(a.residual.dtype, x.dtype, checks.sum_dtype(a.gate, a.gate_temb), a.r_dtype)[1]
    why = why or checks.ln_params(x.shape[-1], a.ln_dtype or r_dt, a.weight, a.bias)
    if not why and a.scale is None and a.shift is not None:
        why = "shift without scale"
    why = why or checks.addends(scale=(a.scale, a.scale_temb), shift=(a.shift, a.shift_temb))
    why = why or checks.broadcast(x.shape, scale=a.scale, shift=a.shift, scale_temb=a.scale_temb,
                                  shift_temb=a.shift_temb)
    return not why, why


def _tiles_then_rows(a, quant=None):
    """The fused row kernel where ``r_in_rows``. Otherwise the tile kernel writes ``r`` in eager's layout (and a
    row-major copy where that layout is not row-major), and the row kernel normalizes the row-major one: ``r``
    stays the first output, of the op and of its quant twin."""
    if r_in_rows(a):
        return plan_gated_residual_norm_modulate(a, quant)
    strides = eager_r_strides(a)
    tiles = plan_gated_residual_tiles(a, strides, rows=strides != torch.empty(a.x.shape, device="meta").stride())
    r_dt = residual_dtypes(a.residual.dtype, a.x.dtype, checks.sum_dtype(a.gate, a.gate_temb), a.r_dtype)[1]
    norm = plan_gated_residual_norm_modulate(
        a._replace(residual=torch.empty(a.x.shape, dtype=r_dt, device=a.x.device)), quant, gated=False)

    def launch(a):
        r, r_rows = tiles(a)
        outs = norm(a._replace(residual=r if r_rows is None else r_rows))
        return (r, *outs[1:]) if isinstance(outs, tuple) else [r, *outs[1:]]

    return launch


SPEC = register_op(OpSpec("gated_residual_norm_modulate", gated_residual_norm_modulate,
                          guard=can_use_gated_residual_norm_modulate, plan=_tiles_then_rows))
QUANT_SPEC = quant_twin(SPEC, _tiles_then_rows)
