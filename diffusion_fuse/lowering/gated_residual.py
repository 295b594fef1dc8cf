"""``diffusion_fuse::gated_residual_ln_modulate``: gated residual, LayerNorm and AdaLN modulate as one op.

Semantics are those of the ATen chain the pattern replaces (patterns/gated_residual.py)::

    r   = residual + gate * x                 # the next residual (returned)
    out = LN(r) * (1 + scale) [+ shift] [→ out_dtype]   # as diffusion_fuse::ln_modulate

each op rounded to its eager result dtype. Returns ``(r, out)``. The reference impl is that
chain; CUDA inputs ``can_use_gated_residual_ln_modulate`` accepts run the Triton kernel in
kernels/gated_residual_ln.py, which writes ``r`` once and never writes the normalized tensor.
"""

from __future__ import annotations

import torch

from .dispatch import GuardedKernel
from .norm_modulate import (
    KERNEL_DTYPES,
    check_broadcast,
    check_device_and_dtypes,
    check_ln_params,
    check_rows,
    ln_modulate_reference,
    result_dtypes,
)

OP = "gated_residual_ln_modulate"


def gated_residual_ln_modulate_reference(residual, x, gate, weight, bias, eps, scale, shift, out_dtype):
    r = residual + gate * x
    return r, ln_modulate_reference(r, weight, bias, eps, scale, shift, None, out_dtype)


def residual_dtypes(residual_dtype, x_dtype, gate_dtype) -> tuple[torch.dtype, torch.dtype]:
    """dtypes of (gate * x, residual + gate * x) under eager's type promotion."""
    m_dt = torch.promote_types(gate_dtype, x_dtype)
    return m_dt, torch.promote_types(residual_dtype, m_dt)


def can_use_gated_residual_ln_modulate(residual, x, gate, weight, bias, eps, scale, shift,
                                       out_dtype) -> tuple[bool, str]:
    """Whether the Triton kernel reproduces eager for these inputs; else the reason."""
    why = check_device_and_dtypes(x, (residual, gate, weight, bias, scale, shift))
    if not why and out_dtype not in (None,) + KERNEL_DTYPES:
        why = f"unsupported cast (out_dtype {out_dtype})"
    why = why or check_rows("x", x) or check_rows("residual", residual)
    if not why and residual.shape != x.shape:
        why = f"residual {tuple(residual.shape)} and x {tuple(x.shape)} differ in shape"
    # r is a fresh contiguous tensor, as eager's add makes it: eager's LayerNorm takes its
    # vectorized kernel on it, whatever the alignment of the inputs.
    why = why or check_ln_params(x.shape[-1], residual_dtypes(residual.dtype, x.dtype, gate.dtype)[1], weight, bias)
    why = why or check_broadcast(x.shape, gate=gate, scale=scale, shift=shift)
    return not why, why


def layout_key(residual, x, gate, weight, bias, eps, scale, shift, out_dtype) -> tuple:
    def k(t):
        return None if t is None else (t.dtype, t.shape, t.stride(), t.data_ptr() & 15)

    return (x.device, k(residual), k(x), k(gate), k(weight), k(bias), k(scale), k(shift), out_dtype)


def _plan(*args):
    from ..kernels.gated_residual_ln import plan_gated_residual_ln_modulate

    return plan_gated_residual_ln_modulate(*args)


_dispatch = GuardedKernel(OP, layout_key, can_use_gated_residual_ln_modulate, _plan,
                          gated_residual_ln_modulate_reference)

_lib = torch.library.Library("diffusion_fuse", "FRAGMENT")
_lib.define(
    "gated_residual_ln_modulate(Tensor residual, Tensor x, Tensor gate, Tensor? weight, Tensor? bias, float eps, "
    "Tensor scale, Tensor? shift, ScalarType? out_dtype) -> (Tensor, Tensor)"
)
_lib.impl("gated_residual_ln_modulate", _dispatch, "CompositeExplicitAutograd")


@torch.library.register_fake("diffusion_fuse::gated_residual_ln_modulate", lib=_lib)
def _(residual, x, gate, weight, bias, eps, scale, shift, out_dtype):
    r_shape = torch.broadcast_shapes(residual.shape, x.shape, gate.shape)
    r_dt = residual_dtypes(residual.dtype, x.dtype, gate.dtype)[1]
    shapes = [r_shape, scale.shape] + ([shift.shape] if shift is not None else [])
    out_dt = result_dtypes(r_dt, scale.dtype, None if shift is None else shift.dtype, None, out_dtype)[-1]
    return x.new_empty(r_shape, dtype=r_dt), x.new_empty(torch.broadcast_shapes(*shapes), dtype=out_dt)
