"""``diffusion_fuse::linear_gelu`` and ``linear_gelu_cat``: ``gelu(x @ weight.T + bias)`` as one op, alone or
written straight into its columns of a last-dim ``cat`` (patterns/linear_gelu.py).

Semantics are those of the ATen chain the pattern replaces: ``aten.addmm(bias, x2d, weight.t())`` (or
``aten.mm`` without a bias), viewed back to ``x``'s leading dims, then ``aten.gelu(approximate)``; for
``linear_gelu_cat``, then ``aten.cat([*before, gelu, *after], -1)``. The reference impls are those chains. CUDA
inputs the guards accept run the warp-specialized Gluon GEMM in kernels/linear_gelu.py, whose epilogue looks
eager's gelu up: the pre-activation never reaches HBM, and in the ``cat`` form neither does the activation
twice (FLUX's single block: ``cat([attn, gelu(proj_mlp(x))], -1)``).
"""

from __future__ import annotations

import torch

from ..kernels.linear_gelu import BK, GLUON_ERROR, MIN_ROWS, gelu_table
from .dispatch import GuardedKernel, impl
from .norm_modulate import tensor_key

OP = "linear_gelu"
CAT_OP = "linear_gelu_cat"


def linear_gelu_reference(x, weight, bias, approximate="tanh"):
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.addmm(bias, x2, weight.t()) if bias is not None else torch.mm(x2, weight.t())
    return torch.nn.functional.gelu(y.view(*x.shape[:-1], weight.shape[0]), approximate=approximate)


def linear_gelu_cat_reference(x, weight, bias, before, after, approximate="tanh"):
    return torch.cat([*before, linear_gelu_reference(x, weight, bias, approximate), *after], dim=-1)


def can_use_linear_gelu(x, weight, bias, approximate="tanh") -> tuple[bool, str]:
    """Whether the Gluon kernel reproduces eager for these inputs; else the reason."""
    why = GLUON_ERROR
    if not why and x.device.type != "cuda":
        why = f"device is {x.device.type}"
    if not why and torch.cuda.get_device_capability(x.device) != (9, 0):
        why = f"compute capability {torch.cuda.get_device_capability(x.device)} (the kernel is sm_90's wgmma)"
    tensors = [t for t in (x, weight, bias) if t is not None]
    if not why and any(t.device != x.device for t in tensors):
        why = "inputs on different devices"
    if not why and any(t.dtype != torch.bfloat16 for t in tensors):
        why = f"unsupported dtype (x {x.dtype}, weight {weight.dtype}; kernel takes bf16)"
    if not why and approximate not in ("tanh", "none"):
        why = f"unknown gelu approximation {approximate!r}"
    if not why and (weight.dim() != 2 or x.shape[-1] != weight.shape[1] or
                    (bias is not None and tuple(bias.shape) != (weight.shape[0],))):
        why = f"shapes x {tuple(x.shape)}, weight {tuple(weight.shape)}, bias {None if bias is None else tuple(bias.shape)}"
    if not why and (not x.is_contiguous() or not weight.is_contiguous() or (bias is not None and bias.stride(0) != 1)):
        why = "x, weight or bias not contiguous"
    if not why and (x.shape[-1] % BK or weight.shape[0] % 8):
        why = f"K {x.shape[-1]} not a multiple of {BK} or N {weight.shape[0]} not a multiple of 8"
    if not why and x.numel() // max(x.shape[-1], 1) < MIN_ROWS:
        why = f"fewer than {MIN_ROWS} rows (cuBLAS may split K there: another summation order)"
    if not why and any(t.data_ptr() % 16 for t in tensors):
        why = "an operand not 16-byte aligned (TMA)"
    if not why and gelu_table(approximate, x.device) is None:
        why = "no bf16 gelu table fits (kernels/lut16.py)"
    return not why, why


def can_use_linear_gelu_cat(x, weight, bias, before, after, approximate="tanh") -> tuple[bool, str]:
    """``can_use_linear_gelu``, and the other ``cat`` pieces bf16 on x's device with x's leading dims (they
    are copied into their columns; any strides)."""
    _, why = can_use_linear_gelu(x, weight, bias, approximate)
    pieces = [*before, *after]
    if not why and any(t.device != x.device or t.dtype != torch.bfloat16 for t in pieces):
        why = "a cat piece not bf16 on the GEMM's device"
    if not why and any(tuple(t.shape[:-1]) != tuple(x.shape[:-1]) for t in pieces):
        why = f"cat pieces' leading dims {[tuple(t.shape[:-1]) for t in pieces]} not x's {tuple(x.shape[:-1])}"
    return not why, why


def layout_key(x, weight, bias, approximate="tanh") -> tuple:
    return (x.device, tensor_key(x), tensor_key(weight), tensor_key(bias), approximate)


def cat_layout_key(x, weight, bias, before, after, approximate="tanh") -> tuple:
    return (layout_key(x, weight, bias, approximate), tuple(tensor_key(t) for t in before),
            tuple(tensor_key(t) for t in after))


def _plan(*args):
    from ..kernels.linear_gelu import plan_linear_gelu

    return plan_linear_gelu(*args)


def _plan_cat(*args):
    from ..kernels.linear_gelu import plan_linear_gelu_cat

    return plan_linear_gelu_cat(*args)


_dispatch = GuardedKernel(OP, layout_key, can_use_linear_gelu, _plan, linear_gelu_reference)
_dispatch_cat = GuardedKernel(CAT_OP, cat_layout_key, can_use_linear_gelu_cat, _plan_cat, linear_gelu_cat_reference)

_lib = torch.library.Library("diffusion_fuse", "FRAGMENT")
_lib.define("linear_gelu(Tensor x, Tensor weight, Tensor? bias, str approximate='tanh') -> Tensor")
_lib.define("linear_gelu_cat(Tensor x, Tensor weight, Tensor? bias, Tensor[] before, Tensor[] after, "
            "str approximate='tanh') -> Tensor")
impl(_lib, OP, _dispatch)
impl(_lib, CAT_OP, _dispatch_cat)


@torch.library.register_fake("diffusion_fuse::linear_gelu", lib=_lib)
def _(x, weight, bias, approximate="tanh"):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake("diffusion_fuse::linear_gelu_cat", lib=_lib)
def _(x, weight, bias, before, after, approximate="tanh"):
    width = weight.shape[0] + sum(t.shape[-1] for t in [*before, *after])
    return x.new_empty((*x.shape[:-1], width))
