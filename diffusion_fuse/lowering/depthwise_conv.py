"""``diffusion_fuse::depthwise_conv``: a 2-D depthwise convolution, stride 1, no dilation (patterns/depthwise_conv.py),
and optionally the gated linear unit after it::

    y = convolution(x, weight, bias, stride=[1, 1], padding, dilation=[1, 1], groups=channels)
    y = value * silu(gate)        # glu_gate 0 or 1: the halves of y's channels, the gate the first or second

CUDA inputs the guard accepts run kernels/depthwise_conv.py in the order eager's convolution sums for that layout
(found once per layout); the output has eager's layout (channels-last for a channels-last input).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.depthwise_conv import (
    CANDIDATES,
    DTYPES,
    MAX_K,
    NO_GLU,
    can_use_depthwise_conv,
    cudnn_flags,
    eager_order,
    plan_depthwise_conv,
)
from .spec import OpSpec, default_layout_key, register_op


def depthwise_conv(x: Tensor, weight: Tensor, bias: Tensor | None, padding: list[int],
                   glu_gate: int = NO_GLU) -> Tensor:
    y = torch.ops.aten.convolution(x, weight, bias, [1, 1], padding, [1, 1], False, [0, 0], x.shape[1])
    if glu_gate == NO_GLU:
        return y
    halves = torch.ops.aten.split.Tensor(y, y.shape[1] // 2, 1)
    return torch.ops.aten.mul.Tensor(halves[1 - glu_gate], torch.ops.aten.silu.default(halves[glu_gate]))


def _guard(a) -> tuple[bool, str]:
    return can_use_depthwise_conv(a.x, a.weight, a.bias, tuple(a.padding), a.glu_gate)


def _static_guard(a) -> str:
    if a.x.dtype not in DTYPES:
        return f"dtype {a.x.dtype} (kernel takes {[str(d) for d in DTYPES]}: their products are exact in fp32)"
    kh, kw = a.weight.shape[-2:]
    if isinstance(kh, int) and isinstance(kw, int) and (kh > MAX_K or kw > MAX_K):
        return f"filter {kh}x{kw} (kernel takes up to {MAX_K}x{MAX_K})"
    return ""


def _plan(a):
    padding = tuple(a.padding)
    order = eager_order(a.x, a.weight, a.bias is not None, padding) if a.x.device.type == "cuda" else CANDIDATES[0]
    if order is None:  # the guard said so already; a plan asked for directly (SPEC.run_kernel) says it too
        raise ValueError("eager's convolution for this layout sums in no one order the kernel knows")
    run = plan_depthwise_conv(a.x, a.weight, a.bias is not None, padding, order, a.glu_gate)
    return lambda a: run(a.x, a.weight, a.bias)


def _layout_key(args: tuple) -> tuple:
    # eager's kernel, so its order, also depends on cuDNN's flags: a plan made under others is not reused
    return default_layout_key(args), cudnn_flags()


SPEC = register_op(OpSpec("depthwise_conv", depthwise_conv, guard=_guard, plan=_plan, static_guard=_static_guard,
                          layout_key=_layout_key))
