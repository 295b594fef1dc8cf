"""``diffusion_fuse::norm_modulate``: LayerNorm + AdaLN modulate as one op (and ``norm_modulate_quant``, the same
feeding static FP8 quantizers: lowering/fp8.py).

Semantics are those of the ATen chain the pattern replaces (patterns/norm_modulate.py), the reference below::

    xin = x.to(ln_dtype) if ln_dtype else x
    ln  = native_layer_norm(xin, [D], weight, bias, eps)[0]
    out = ln * (scale + 1) [+ shift]   # each op rounded to its result dtype, as eager does
    out = out.to(out_dtype) if out_dtype else out

``scale``/``shift`` broadcast to ``x``'s shape. ``scale_temb``/``shift_temb`` (optional) are second addends: the
op uses ``scale + scale_temb`` (and ``shift + shift_temb``), one add in fp32 (the guard takes fp32 sums only),
which is how a chunked timestep table ``table + temb.float()`` reaches the op without the sum being written
(patterns/table_slice.py). CUDA inputs the guard accepts run the Triton kernel in kernels/norm_modulate.py.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.layer_norm_stats import VEC
from ..kernels.norm_modulate import plan_norm_modulate
from . import checks
from .fp8 import quant_twin
from .spec import OpSpec, register_op


def with_addend(t: Tensor | None, addend: Tensor | None) -> Tensor | None:
    """``t + addend`` (eager's add: the table slice of ``table + temb.float()``), or ``t``."""
    return t if addend is None or t is None else t + addend


def modulate(y: Tensor, scale: Tensor | None, shift: Tensor | None, out_dtype: torch.dtype | None,
             scale_temb: Tensor | None = None, shift_temb: Tensor | None = None) -> Tensor:
    """``y * (scale + 1) [+ shift] [→ out_dtype]`` as the ATen ops the norm families replace; without a scale,
    ``y [→ out_dtype]``."""
    out = y
    if scale is not None:
        out = out * (with_addend(scale, scale_temb) + 1)
        if shift is not None:
            out = out + with_addend(shift, shift_temb)
    if out_dtype is not None:
        out = out.to(out_dtype)
    return out


def layer_norm_modulate(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, scale: Tensor | None,
                        shift: Tensor | None, ln_dtype: torch.dtype | None, out_dtype: torch.dtype | None,
                        scale_temb: Tensor | None = None, shift_temb: Tensor | None = None) -> Tensor:
    """The ATen chain; ``scale=None`` (gated_residual_norm_modulate's norm2) is the LayerNorm without modulate."""
    xin = x if ln_dtype is None else x.to(ln_dtype)
    ln = torch.ops.aten.native_layer_norm.default(xin, [xin.shape[-1]], weight, bias, eps)[0]
    return modulate(ln, scale, shift, out_dtype, scale_temb, shift_temb)


def norm_modulate(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, scale: Tensor,
                  shift: Tensor | None, ln_dtype: torch.dtype | None, out_dtype: torch.dtype | None,
                  scale_temb: Tensor | None = None, shift_temb: Tensor | None = None) -> Tensor:
    return layer_norm_modulate(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype, scale_temb, shift_temb)


def can_use_norm_modulate(a) -> tuple[bool, str]:
    """Whether the Triton kernel reproduces eager for these arguments; else the reason."""
    x = a.x
    why = checks.device_and_dtypes(x, (a.weight, a.bias, a.scale, a.shift, a.scale_temb, a.shift_temb))
    if not why and (a.ln_dtype not in (None, torch.float32) or a.out_dtype not in (None,) + checks.KERNEL_DTYPES):
        why = f"unsupported cast (ln_dtype {a.ln_dtype}, out_dtype {a.out_dtype})"
    # the kernel reads any x strides; rows of three dims ([B, H, S, D]) without a modulate (family layer_norm)
    ranks = (2, 3, 4) if a.scale is None and a.shift is None else (2, 3)
    why = why or checks.rows("x", x, unit_stride_d=False, ranks=ranks)
    # Eager normalizes a contiguous x in place of memory, and a non-contiguous one (or the
    # x.float() copy) from a fresh aligned buffer: only the first can miss the vectorized kernel.
    if not why and a.ln_dtype is None and x.is_contiguous() and x.data_ptr() % (VEC * x.element_size()):
        why = "x is not 16-byte aligned (eager takes its non-vectorized LayerNorm)"
    why = why or checks.ln_params(x.shape[-1], a.ln_dtype or x.dtype, a.weight, a.bias)
    why = why or checks.addends(scale=(a.scale, a.scale_temb), shift=(a.shift, a.shift_temb))
    why = why or checks.broadcast(x.shape, scale=a.scale, shift=a.shift, scale_temb=a.scale_temb,
                                  shift_temb=a.shift_temb)
    return not why, why


SPEC = register_op(OpSpec("norm_modulate", norm_modulate, guard=can_use_norm_modulate, plan=plan_norm_modulate))
QUANT_SPEC = quant_twin(SPEC, lambda a, quant: plan_norm_modulate(a, quant=quant))
