"""``diffusion_fuse::grouped_gemv(Tensor x, Tensor[] weights, Tensor?[] biases) -> Tensor``: linears of one
short input, each ``torch.addmm(b_i, x, w_i.t())`` (``torch.mm`` without a bias), laid out one after another
in one flat tensor: member i's [M, N_i] output is its ``M * N_i`` elements at offset ``M * (N_0 + ... +
N_{i-1})`` (patterns/grouped_gemv.py, fxpasses/grouped_gemv.py). The reference impl is those calls; CUDA
inputs ``can_use_grouped_gemv`` accepts run kernels/grouped_gemv.py (its docstring is the numerics contract).
"""

from __future__ import annotations

import torch

from ..kernels.grouped_gemv import can_use_grouped_gemv, out_numel, plan_grouped_gemv
from .dispatch import GuardedKernel, impl

OP = "grouped_gemv"


def grouped_gemv_reference(x, weights, biases):
    return torch.cat([(torch.addmm(b, x, w.t()) if b is not None else torch.mm(x, w.t())).reshape(-1)
                      for w, b in zip(weights, biases)])


def _operand_key(t: torch.Tensor | None) -> tuple | None:
    # The plan's device tables hold the weights' and biases' addresses: they are part of the key.
    return None if t is None else (t.dtype, t.shape, t.stride(), t.data_ptr())


def layout_key(x, weights, biases) -> tuple:
    return (x.device, x.dtype, x.shape, x.stride(), x.data_ptr() & 15, tuple(map(_operand_key, weights)),
            tuple(map(_operand_key, biases)))


_dispatch = GuardedKernel(OP, layout_key, can_use_grouped_gemv, plan_grouped_gemv, grouped_gemv_reference)

_lib = torch.library.Library("diffusion_fuse", "FRAGMENT")
_lib.define("grouped_gemv(Tensor x, Tensor[] weights, Tensor?[] biases) -> Tensor")
impl(_lib, OP, _dispatch)


@torch.library.register_fake("diffusion_fuse::grouped_gemv", lib=_lib)
def _(x, weights, biases):
    return x.new_empty(out_numel(x, weights))
