"""``diffusion_fuse::ln_modulate``: LayerNorm + AdaLN modulate as one op.

Semantics are those of the ATen chain the pattern replaces (patterns/norm_modulate.py)::

    xin = x.to(ln_dtype) if ln_dtype else x
    ln  = native_layer_norm(xin, [D], weight, bias, eps)[0]
    out = ln * (scale + 1) [+ shift]   # each op rounded to its result dtype, as eager does
    out = out.to(out_dtype) if out_dtype else out

``scale``/``shift`` broadcast to ``x``'s shape. ``scale_temb``/``shift_temb`` (optional) are second
addends: the op uses ``scale + scale_temb`` (and ``shift + shift_temb``), one add in fp32 (the guard
takes fp32 sums only), which is how Wan's chunked ``scale_shift_table + temb.float()`` reaches the op
without the sum being written (patterns/wan_temb.py). The reference impl *is* that chain (CPU, and
every input a guard rejects); CUDA inputs the guard accepts run the Triton kernel in
kernels/ln_modulate.py.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import triton_interpret
from .dispatch import GuardedKernel, impl

OP = "ln_modulate"
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_D = 16384
VEC = 4  # eager's vectorized LayerNorm reads 4-element vectors; other D use another kernel


def with_addend(t: Tensor | None, addend: Tensor | None) -> Tensor | None:
    """``t + addend`` (eager's add: the table slice of Wan's ``table + temb.float()``), or ``t``."""
    return t if addend is None or t is None else t + addend


def ln_modulate_reference(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype, scale_temb=None,
                          shift_temb=None) -> Tensor:
    """The ATen chain; ``scale=None`` (gated_residual_ln_modulate only) is the LayerNorm without modulate."""
    xin = x if ln_dtype is None else x.to(ln_dtype)
    ln = torch.ops.aten.native_layer_norm.default(xin, [xin.shape[-1]], weight, bias, eps)[0]
    return modulate_reference(ln, scale, shift, out_dtype, scale_temb, shift_temb)


def modulate_reference(y, scale, shift, out_dtype, scale_temb=None, shift_temb=None) -> Tensor:
    """``y * (scale + 1) [+ shift] [→ out_dtype]`` as the ATen ops the patterns replace (shared by the
    norm families); without a scale, ``y [→ out_dtype]``."""
    out = y
    if scale is not None:
        out = out * (with_addend(scale, scale_temb) + 1)
        if shift is not None:
            out = out + with_addend(shift, shift_temb)
    if out_dtype is not None:
        out = out.to(out_dtype)
    return out


def sum_dtype(t: Tensor | None, addend: Tensor | None) -> torch.dtype | None:
    """dtype of ``t [+ addend]``."""
    if t is None:
        return None
    return t.dtype if addend is None else torch.promote_types(t.dtype, addend.dtype)


def result_dtypes(x_dtype, scale_dtype, shift_dtype, ln_dtype, out_dtype):
    """dtypes of (ln, 1+scale, ln*(1+scale), +shift, final) as eager's type promotion gives them.

    ``scale_dtype=None``: no modulate (every dtype after the LayerNorm is the LayerNorm's).
    """
    ln_dt = ln_dtype or x_dtype
    t_dt = scale_dtype or ln_dt
    u_dt = torch.promote_types(ln_dt, t_dt)
    v_dt = torch.promote_types(u_dt, shift_dtype) if shift_dtype is not None and scale_dtype is not None else u_dt
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


def check_addends(**pairs: tuple[Tensor | None, Tensor | None]) -> str:
    """'' if every (operand, second addend) pair the kernels add sums to fp32 (they add in fp32, unrounded)."""
    for name, (t, addend) in pairs.items():
        if addend is not None and (t is None or sum_dtype(t, addend) != torch.float32):
            return f"{name} + {name}_temb is not an fp32 sum (the kernel adds in fp32 and does not round)"
    return ""


def check_broadcast(shape, **operands: Tensor | None) -> str:
    """'' if every operand broadcasts to ``shape`` with unit stride along D."""
    for name, t in operands.items():
        if not _broadcast_ok(t, shape):
            return f"{name} {tuple(t.shape)} does not broadcast to {tuple(shape)}"
        if t is not None and t.expand(shape).stride(-1) != 1:
            return f"{name} is not contiguous along D"
    return ""


def can_use_ln_modulate(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype, scale_temb=None,
                        shift_temb=None) -> tuple[bool, str]:
    """Whether the Triton kernel reproduces eager for these inputs; else the reason."""
    why = check_device_and_dtypes(x, (weight, bias, scale, shift, scale_temb, shift_temb))
    if not why and (ln_dtype not in (None, torch.float32) or out_dtype not in (None,) + KERNEL_DTYPES):
        why = f"unsupported cast (ln_dtype {ln_dtype}, out_dtype {out_dtype})"
    why = why or check_rows("x", x, unit_stride_d=False)  # the kernel reads any x strides
    # Eager normalizes a contiguous x in place of memory, and a non-contiguous one (or the
    # x.float() copy) from a fresh aligned buffer: only the first can miss the vectorized kernel.
    if not why and ln_dtype is None and x.is_contiguous() and x.data_ptr() % (VEC * x.element_size()):
        why = "x is not 16-byte aligned (eager takes its non-vectorized LayerNorm)"
    why = why or check_ln_params(x.shape[-1], ln_dtype or x.dtype, weight, bias)
    why = why or check_addends(scale=(scale, scale_temb), shift=(shift, shift_temb))
    why = why or check_broadcast(x.shape, scale=scale, shift=shift, scale_temb=scale_temb, shift_temb=shift_temb)
    return not why, why


def tensor_key(t: Tensor | None) -> tuple | None:
    """What a launch plan depends on for one tensor operand (alignment: Triton specializes on it)."""
    return None if t is None else (t.dtype, t.shape, t.stride(), t.data_ptr() & 15)


def layout_key(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype, scale_temb=None, shift_temb=None) -> tuple:
    """Everything ``can_use_ln_modulate`` and the launch plan depend on (eps is a kernel argument).

    Pointer alignment is part of it: the plan launches a kernel Triton specialized on it.
    """
    return (x.device, tensor_key(x), tensor_key(scale), tensor_key(shift), tensor_key(weight), tensor_key(bias),
            ln_dtype, out_dtype, tensor_key(scale_temb), tensor_key(shift_temb))


def _plan(*args):
    from ..kernels.ln_modulate import plan_ln_modulate

    return plan_ln_modulate(*args)


_dispatch = GuardedKernel(OP, layout_key, can_use_ln_modulate, _plan, ln_modulate_reference)

# Defined with torch.library.Library rather than @custom_op: the dispatcher then calls the
# Python impl directly (a few us per call less, which matters at 13+ calls per forward).
_lib = torch.library.Library("diffusion_fuse", "FRAGMENT")
_lib.define(
    "ln_modulate(Tensor x, Tensor? weight, Tensor? bias, float eps, Tensor scale, Tensor? shift, "
    "ScalarType? ln_dtype, ScalarType? out_dtype, Tensor? scale_temb=None, Tensor? shift_temb=None) -> Tensor"
)
impl(_lib, "ln_modulate", _dispatch)


def modulated_shape_and_dtype(x_shape, x_dtype, scale, shift, ln_dtype, out_dtype, scale_temb, shift_temb):
    """Shape and dtype of the modulated output (fake impls)."""
    shapes = [x_shape] + [t.shape for t in (scale, shift, scale_temb, shift_temb) if t is not None]
    dtype = result_dtypes(x_dtype, sum_dtype(scale, scale_temb), sum_dtype(shift, shift_temb), ln_dtype,
                          out_dtype)[-1]
    return torch.broadcast_shapes(*shapes), dtype


@torch.library.register_fake("diffusion_fuse::ln_modulate", lib=_lib)
def _(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype, scale_temb=None, shift_temb=None):
    shape, dtype = modulated_shape_and_dtype(x.shape, x.dtype, scale, shift, ln_dtype, out_dtype, scale_temb,
                                             shift_temb)
    return x.new_empty(shape, dtype=dtype)
