"""``diffusion_fuse::gated_residual_ln_modulate``: gated residual, LayerNorm and AdaLN modulate as one op;
``diffusion_fuse::gated_residual``: the gated residual alone (no LayerNorm reads it in the graph).

Semantics are those of the ATen chain the pattern replaces (patterns/gated_residual.py)::

    r   = residual + gate * x                  # [→ r_dtype]: the next residual (returned)
    out = LN(r [→ ln_dtype]) [* (1 + scale) [+ shift]] [→ out_dtype]   # as diffusion_fuse::ln_modulate

each op rounded to its eager result dtype. Wan's form is ``(residual.float() + x * gate).type_as(residual)``
then FP32LayerNorm: ``r_dtype`` bf16 and ``ln_dtype`` fp32 (the widening casts of residual and x are folded
into the op by eager's type promotion, which computes the same fp32 values). ``scale=None``: the LayerNorm
is read by no modulate (Wan's norm2). ``gate_temb``/``scale_temb``/``shift_temb`` are optional second
addends (Wan's chunked ``scale_shift_table + temb.float()``): the op uses ``gate + gate_temb`` etc., one fp32
add. Returns ``(r, out)``. The reference impl is that chain; CUDA inputs
``can_use_gated_residual_ln_modulate`` accepts run the Triton kernel in kernels/gated_residual_ln.py, which
writes ``r`` once and never writes ``gate * x``, the normalized tensor or a table sum.
``gated_residual(residual, x, gate, gate_temb, r_dtype)`` returns ``r`` alone, with the same semantics
(``can_use_gated_residual`` guards its kernel).
"""

from __future__ import annotations

import torch

from .dispatch import GuardedKernel, impl
from .norm_modulate import (
    KERNEL_DTYPES,
    check_addends,
    check_broadcast,
    check_device_and_dtypes,
    check_ln_params,
    check_rows,
    ln_modulate_reference,
    modulated_shape_and_dtype,
    sum_dtype,
    tensor_key,
    with_addend,
)

OP = "gated_residual_ln_modulate"
RESIDUAL_OP = "gated_residual"


def gated_residual_reference(residual, x, gate, gate_temb=None, r_dtype=None):
    r = residual + with_addend(gate, gate_temb) * x
    # Contiguous, as the kernel writes it and the fake impl says (eager's add follows a strided
    # residual's layout, e.g. a permuted patch embedding in Inductor's graph; the values are the same).
    return (r if r_dtype is None else r.to(r_dtype)).contiguous()


def gated_residual_ln_modulate_reference(residual, x, gate, weight, bias, eps, scale, shift, out_dtype,
                                         gate_temb=None, scale_temb=None, shift_temb=None, r_dtype=None,
                                         ln_dtype=None):
    r = gated_residual_reference(residual, x, gate, gate_temb, r_dtype)
    return r, ln_modulate_reference(r, weight, bias, eps, scale, shift, ln_dtype, out_dtype, scale_temb, shift_temb)


def residual_dtypes(residual_dtype, x_dtype, gate_dtype, r_dtype=None) -> tuple[torch.dtype, torch.dtype]:
    """dtypes of (gate * x, residual + gate * x [→ r_dtype]) under eager's type promotion."""
    m_dt = torch.promote_types(gate_dtype, x_dtype)
    return m_dt, r_dtype or torch.promote_types(residual_dtype, m_dt)


def can_use_gated_residual(residual, x, gate, gate_temb=None, r_dtype=None) -> tuple[bool, str]:
    """Whether the gated-residual kernel reproduces eager for these inputs; else the reason."""
    why = check_device_and_dtypes(x, (residual, gate, gate_temb))
    if not why and r_dtype not in (None,) + KERNEL_DTYPES:
        why = f"unsupported cast (r_dtype {r_dtype})"
    why = why or check_rows("x", x) or check_rows("residual", residual)
    if not why and residual.shape != x.shape:
        why = f"residual {tuple(residual.shape)} and x {tuple(x.shape)} differ in shape"
    why = why or check_addends(gate=(gate, gate_temb))
    why = why or check_broadcast(x.shape, gate=gate, gate_temb=gate_temb)
    return not why, why


def can_use_gated_residual_ln_modulate(residual, x, gate, weight, bias, eps, scale, shift, out_dtype,
                                       gate_temb=None, scale_temb=None, shift_temb=None, r_dtype=None,
                                       ln_dtype=None) -> tuple[bool, str]:
    """Whether the Triton kernel reproduces eager for these inputs; else the reason."""
    _, why = can_use_gated_residual(residual, x, gate, gate_temb, r_dtype)
    why = why or check_device_and_dtypes(x, (weight, bias, scale, shift, scale_temb, shift_temb))
    if not why and (out_dtype not in (None,) + KERNEL_DTYPES or ln_dtype not in (None, torch.float32)):
        why = f"unsupported cast (out_dtype {out_dtype}, ln_dtype {ln_dtype})"
    # r is a fresh contiguous tensor, as eager's add makes it: eager's LayerNorm takes its
    # vectorized kernel on it, whatever the alignment of the inputs.
    r_dt = residual_dtypes(residual.dtype, x.dtype, sum_dtype(gate, gate_temb), r_dtype)[1]
    why = why or check_ln_params(x.shape[-1], ln_dtype or r_dt, weight, bias)
    if not why and scale is None and shift is not None:
        why = "shift without scale"
    why = why or check_addends(scale=(scale, scale_temb), shift=(shift, shift_temb))
    why = why or check_broadcast(x.shape, scale=scale, shift=shift, scale_temb=scale_temb, shift_temb=shift_temb)
    return not why, why


def layout_key(residual, x, gate, weight, bias, eps, scale, shift, out_dtype, gate_temb=None, scale_temb=None,
               shift_temb=None, r_dtype=None, ln_dtype=None) -> tuple:
    tensors = (residual, x, gate, weight, bias, scale, shift, gate_temb, scale_temb, shift_temb)
    return (x.device, *(tensor_key(t) for t in tensors), out_dtype, r_dtype, ln_dtype)


def _plan(*args):
    from ..kernels.gated_residual_ln import plan_gated_residual_ln_modulate

    return plan_gated_residual_ln_modulate(*args)


def _residual_layout_key(residual, x, gate, gate_temb=None, r_dtype=None) -> tuple:
    return (x.device, *(tensor_key(t) for t in (residual, x, gate, gate_temb)), r_dtype)


def _plan_residual(*args):
    from ..kernels.gated_residual_ln import plan_gated_residual

    return plan_gated_residual(*args)


_dispatch = GuardedKernel(OP, layout_key, can_use_gated_residual_ln_modulate, _plan,
                          gated_residual_ln_modulate_reference)
_dispatch_residual = GuardedKernel(RESIDUAL_OP, _residual_layout_key, can_use_gated_residual, _plan_residual,
                                   gated_residual_reference)

_lib = torch.library.Library("diffusion_fuse", "FRAGMENT")
_lib.define(
    "gated_residual_ln_modulate(Tensor residual, Tensor x, Tensor gate, Tensor? weight, Tensor? bias, float eps, "
    "Tensor? scale, Tensor? shift, ScalarType? out_dtype, Tensor? gate_temb=None, Tensor? scale_temb=None, "
    "Tensor? shift_temb=None, ScalarType? r_dtype=None, ScalarType? ln_dtype=None) -> (Tensor, Tensor)"
)
impl(_lib, "gated_residual_ln_modulate", _dispatch)


@torch.library.register_fake("diffusion_fuse::gated_residual_ln_modulate", lib=_lib)
def _(residual, x, gate, weight, bias, eps, scale, shift, out_dtype, gate_temb=None, scale_temb=None,
      shift_temb=None, r_dtype=None, ln_dtype=None):
    gates = [t.shape for t in (gate, gate_temb) if t is not None]
    r_shape = torch.broadcast_shapes(residual.shape, x.shape, *gates)
    r_dt = residual_dtypes(residual.dtype, x.dtype, sum_dtype(gate, gate_temb), r_dtype)[1]
    shape, out_dt = modulated_shape_and_dtype(r_shape, r_dt, scale, shift, ln_dtype, out_dtype, scale_temb,
                                              shift_temb)
    return x.new_empty(r_shape, dtype=r_dt), x.new_empty(shape, dtype=out_dt)


_lib.define("gated_residual(Tensor residual, Tensor x, Tensor gate, Tensor? gate_temb=None, "
            "ScalarType? r_dtype=None) -> Tensor")
impl(_lib, "gated_residual", _dispatch_residual)


@torch.library.register_fake("diffusion_fuse::gated_residual", lib=_lib)
def _(residual, x, gate, gate_temb=None, r_dtype=None):
    gates = [t.shape for t in (gate, gate_temb) if t is not None]
    r_dt = residual_dtypes(residual.dtype, x.dtype, sum_dtype(gate, gate_temb), r_dtype)[1]
    return x.new_empty(torch.broadcast_shapes(residual.shape, x.shape, *gates), dtype=r_dt)
