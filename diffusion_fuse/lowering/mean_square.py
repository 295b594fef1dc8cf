"""``diffusion_fuse::mean_square(Tensor x) -> Tensor``: ``x.to(float32).pow(2).mean(-1, keepdim=True)``.

The variance of diffusers' ``RMSNorm`` (patterns/mean_square.py). The reference impl is that chain; CUDA
inputs ``can_use_mean_square`` accepts run kernels/mean_square.py, which reads x once and sums its squares
in the order of ATen's reduce kernel (the numerics contract is that module's docstring).
"""

from __future__ import annotations

import torch

from ..kernels.mean_square import can_use_mean_square, plan_mean_square
from .dispatch import GuardedKernel, impl
from .norm_modulate import tensor_key

OP = "mean_square"


def mean_square_reference(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).pow(2).mean(-1, keepdim=True)


def layout_key(x: torch.Tensor) -> tuple:
    return (x.device, tensor_key(x))


_dispatch = GuardedKernel(OP, layout_key, can_use_mean_square, plan_mean_square, mean_square_reference)

_lib = torch.library.Library("diffusion_fuse", "FRAGMENT")
_lib.define("mean_square(Tensor x) -> Tensor")
impl(_lib, "mean_square", _dispatch)


@torch.library.register_fake("diffusion_fuse::mean_square", lib=_lib)
def _(x):
    return mean_square_reference(x)
