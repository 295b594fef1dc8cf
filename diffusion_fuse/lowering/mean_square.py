"""``diffusion_fuse::mean_square``: ``x.to(float32).pow(2).mean(-1, keepdim=True)`` in one pass.

The variance of diffusers' ``RMSNorm`` (patterns/mean_square.py). CUDA inputs ``can_use_mean_square`` accepts run
kernels/mean_square.py, which reads x once and sums its squares in the order of ATen's reduce kernel (the numerics
contract is that module's docstring).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.mean_square import ROW_SIZES, can_use_mean_square, candidates, plan_mean_square
from .spec import OpSpec, register_op


def mean_square(x: Tensor) -> Tensor:
    return x.to(torch.float32).pow(2).mean(-1, keepdim=True)


def _static_guard(a) -> str:
    # elsewhere the op would only ever run its reference, and the pointwise pass does better with the chain
    if a.x.dim() < 1:
        return "a 0-d input"
    d, step = a.x.shape[-1], a.x.stride(-1)
    # a symbolic size (a dynamic-shape graph) is left to the guard, which sees each call's
    if (isinstance(d, int) and not candidates(d)) or (isinstance(step, int) and step != 1):
        return f"last dim {tuple(a.x.shape)[-1:]} ({ROW_SIZES}, contiguous)"
    return ""


def _plan(a):
    run = plan_mean_square(a.x)
    return lambda a: run(a.x)


SPEC = register_op(OpSpec("mean_square", mean_square, guard=lambda a: can_use_mean_square(a.x), plan=_plan,
                          static_guard=_static_guard))
