"""``diffusion_fuse::ln_modulate``: LayerNorm + AdaLN modulate as one op.

Semantics are those of the ATen chain the pattern replaces (patterns/norm_modulate.py)::

    xin = x.to(ln_dtype) if ln_dtype else x
    ln  = native_layer_norm(xin, [D], weight, bias, eps)[0]
    out = ln * (scale + 1) [+ shift]   # each op rounded to its result dtype, as eager does
    out = out.to(out_dtype) if out_dtype else out

``scale``/``shift`` broadcast to ``x``'s shape. The reference impl *is* that chain (CPU, and
every input a guard rejects); CUDA inputs the guard accepts run the Triton kernel in
kernels/ln_modulate.py.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import triton_interpret
from .dispatch import GuardedKernel

OP = "ln_modulate"
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_D = 16384
VEC = 4  # eager's vectorized LayerNorm reads 4-element vectors; other D use another kernel


def ln_modulate_reference(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype) -> Tensor:
    xin = x if ln_dtype is None else x.to(ln_dtype)
    ln = torch.ops.aten.native_layer_norm.default(xin, [xin.shape[-1]], weight, bias, eps)[0]
    out = ln * (scale + 1)
    if shift is not None:
        out = out + shift
    if out_dtype is not None:
        out = out.to(out_dtype)
    return out


def result_dtypes(x_dtype, scale_dtype, shift_dtype, ln_dtype, out_dtype):
    """dtypes of (ln, 1+scale, ln*(1+scale), +shift, final) as eager's type promotion gives them."""
    ln_dt = ln_dtype or x_dtype
    t_dt = scale_dtype
    u_dt = torch.promote_types(ln_dt, t_dt)
    v_dt = torch.promote_types(u_dt, shift_dtype) if shift_dtype is not None else u_dt
    return ln_dt, t_dt, u_dt, v_dt, out_dtype or v_dt


def _broadcast_ok(t: Tensor | None, shape) -> bool:
    if t is None:
        return True
    try:
        return torch.broadcast_shapes(t.shape, shape) == shape
    except RuntimeError:
        return False


def check_device_and_dtypes(x: Tensor, others) -> str:
    """'' if the kernels can run on these tensors' device and dtypes, else why not."""
    if x.device.type != "cuda" and not (x.device.type == "cpu" and triton_interpret()):
        return f"device is {x.device.type}"
    tensors = [t for t in others if t is not None]
    if any(t.device != x.device for t in tensors):
        return "inputs on different devices"
    if x.dtype not in KERNEL_DTYPES or any(t.dtype not in KERNEL_DTYPES for t in tensors):
        return f"unsupported dtype (x {x.dtype}; kernel takes {[str(d) for d in KERNEL_DTYPES]})"
    return ""


def check_rows(name: str, t: Tensor, unit_stride_d: bool = True) -> str:
    """'' if ``t`` is a [M, D] or [B, S, D] tensor of rows the kernels can read (D as eager vectorizes)."""
    if t.dim() not in (2, 3):
        return f"{name} has rank {t.dim()} (kernel takes 2 or 3)"
    if t.numel() == 0:
        return "empty input"
    D = t.shape[-1]
    if D % VEC or D > MAX_D:
        return f"D={D} (kernel takes multiples of {VEC} up to {MAX_D}: eager's vectorized LayerNorm)"
    if unit_stride_d and t.stride(-1) != 1:
        return f"{name} is not contiguous along D"
    return ""


def check_ln_params(D: int, ln_in: torch.dtype, weight: Tensor | None, bias: Tensor | None) -> str:
    if bias is not None and weight is None:
        return "LayerNorm with bias but no weight (its output rounding is not reproduced)"
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            if p.dtype != ln_in or p.shape != (D,) or not p.is_contiguous():
                return f"{name} is not a contiguous [{D}] {ln_in} tensor"
            if p.data_ptr() % (VEC * p.element_size()):
                return f"{name} is not 16-byte aligned"
    return ""


def check_broadcast(shape, **operands: Tensor | None) -> str:
    """'' if every operand broadcasts to ``shape`` with unit stride along D."""
    for name, t in operands.items():
        if not _broadcast_ok(t, shape):
            return f"{name} {tuple(t.shape)} does not broadcast to {tuple(shape)}"
        if t is not None and t.expand(shape).stride(-1) != 1:
            return f"{name} is not contiguous along D"
    return ""


def can_use_ln_modulate(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype) -> tuple[bool, str]:
    """Whether the Triton kernel reproduces eager for these inputs; else the reason."""
    why = check_device_and_dtypes(x, (weight, bias, scale, shift))
    if not why and (ln_dtype not in (None, torch.float32) or out_dtype not in (None,) + KERNEL_DTYPES):
        why = f"unsupported cast (ln_dtype {ln_dtype}, out_dtype {out_dtype})"
    why = why or check_rows("x", x, unit_stride_d=False)  # the kernel reads any x strides
    # Eager normalizes a contiguous x in place of memory, and a non-contiguous one (or the
    # x.float() copy) from a fresh aligned buffer: only the first can miss the vectorized kernel.
    if not why and ln_dtype is None and x.is_contiguous() and x.data_ptr() % (VEC * x.element_size()):
        why = "x is not 16-byte aligned (eager takes its non-vectorized LayerNorm)"
    why = why or check_ln_params(x.shape[-1], ln_dtype or x.dtype, weight, bias)
    why = why or check_broadcast(x.shape, scale=scale, shift=shift)
    return not why, why


def layout_key(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype) -> tuple:
    """Everything ``can_use_ln_modulate`` and the launch plan depend on (eps is a kernel argument).

    Pointer alignment is part of it: the plan launches a kernel Triton specialized on it.
    """
    return (
        x.device, x.dtype, x.shape, x.stride(), x.data_ptr() & 15,
        scale.dtype, scale.shape, scale.stride(), scale.data_ptr() & 15,
        None if shift is None else (shift.dtype, shift.shape, shift.stride(), shift.data_ptr() & 15),
        None if weight is None else (weight.dtype, weight.shape, weight.stride(), weight.data_ptr() & 15),
        None if bias is None else (bias.dtype, bias.shape, bias.stride(), bias.data_ptr() & 15),
        ln_dtype, out_dtype,
    )


def _plan(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype):
    from ..kernels.ln_modulate import plan_ln_modulate

    return plan_ln_modulate(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype)


_dispatch = GuardedKernel(OP, layout_key, can_use_ln_modulate, _plan, ln_modulate_reference)

# Defined with torch.library.Library rather than @custom_op: the dispatcher then calls the
# Python impl directly (a few us per call less, which matters at 13+ calls per forward).
_lib = torch.library.Library("diffusion_fuse", "FRAGMENT")
_lib.define(
    "ln_modulate(Tensor x, Tensor? weight, Tensor? bias, float eps, Tensor scale, Tensor? shift, "
    "ScalarType? ln_dtype, ScalarType? out_dtype) -> Tensor"
)
_lib.impl("ln_modulate", _dispatch, "CompositeExplicitAutograd")


@torch.library.register_fake("diffusion_fuse::ln_modulate", lib=_lib)
def _(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype):
    shapes = [x.shape, scale.shape] + ([shift.shape] if shift is not None else [])
    shape = torch.broadcast_shapes(*shapes)
    dtype = result_dtypes(x.dtype, scale.dtype, None if shift is None else shift.dtype, ln_dtype, out_dtype)[-1]
    return x.new_empty(shape, dtype=dtype)
