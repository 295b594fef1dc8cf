"""Guard checks shared by the norm families: each returns '' when the kernels can take the operand, else why not.

``sum_dtype`` is re-exported for the guards (kernels/norm_modulate.py owns it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import triton_interpret
from ..kernels.layer_norm_stats import VEC
from ..kernels.norm_modulate import sum_dtype  # noqa: F401  (re-exported for the guards)

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_D = 16384


def device_and_dtypes(x: Tensor, others) -> str:
    """'' if the kernels can run on these tensors' device and dtypes."""
    if x.device.type != "cuda" and not (x.device.type == "cpu" and triton_interpret()):
        return f"device is {x.device.type}"
    tensors = [t for t in others if t is not None]
    if any(t.device != x.device for t in tensors):
        return "inputs on different devices"
    if x.dtype not in KERNEL_DTYPES or any(t.dtype not in KERNEL_DTYPES for t in tensors):
        return f"unsupported dtype (x {x.dtype}; kernel takes {[str(d) for d in KERNEL_DTYPES]})"
    return ""


def rows(name: str, t: Tensor, unit_stride_d: bool = True, ranks: tuple[int, ...] = (2, 3)) -> str:
    """'' if ``t`` is a [M, D] or [B, S, D] tensor (a rank in ``ranks``) of rows the kernels can read (D as eager
    vectorizes)."""
    if t.dim() not in ranks:
        return f"{name} has rank {t.dim()} (kernel takes {' or '.join(map(str, ranks))})"
    if t.numel() == 0:
        return "empty input"
    D = t.shape[-1]
    if D % VEC or D > MAX_D:
        return f"D={D} (kernel takes multiples of {VEC} up to {MAX_D}: eager's vectorized LayerNorm)"
    if unit_stride_d and t.stride(-1) != 1:
        return f"{name} is not contiguous along D"
    return ""


def ln_params(D: int, ln_in: torch.dtype, weight: Tensor | None, bias: Tensor | None) -> str:
    if bias is not None and weight is None:
        return "LayerNorm with bias but no weight (its output rounding is not reproduced)"
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            if p.dtype != ln_in or p.shape != (D,) or not p.is_contiguous():
                return f"{name} is not a contiguous [{D}] {ln_in} tensor"
            if p.data_ptr() % (VEC * p.element_size()):
                return f"{name} is not 16-byte aligned"
    return ""


def addends(**pairs: tuple[Tensor | None, Tensor | None]) -> str:
    """'' if every (operand, second addend) pair the kernels add sums to fp32 (they add in fp32, unrounded)."""
    for name, (t, addend) in pairs.items():
        if addend is not None and (t is None or sum_dtype(t, addend) != torch.float32):
            return f"{name} + {name}_temb is not an fp32 sum (the kernel adds in fp32 and does not round)"
    return ""


def _broadcasts(t: Tensor, shape) -> bool:
    try:
        return torch.broadcast_shapes(t.shape, shape) == shape
    except RuntimeError:
        return False


def broadcast(shape, **operands: Tensor | None) -> str:
    """'' if every operand broadcasts to ``shape`` with unit stride along D."""
    for name, t in operands.items():
        if t is None:
            continue
        if not _broadcasts(t, shape):
            return f"{name} {tuple(t.shape)} does not broadcast to {tuple(shape)}"
        if t.expand(shape).stride(-1) != 1:
            return f"{name} is not contiguous along D"
    return ""
