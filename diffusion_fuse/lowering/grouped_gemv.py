"""``diffusion_fuse::grouped_gemv``: linears of one
short input, each ``torch.addmm(b_i, x, w_i.t())`` (``torch.mm`` without a bias), laid out one after another
in one flat tensor: member i's [M, N_i] output is its ``M * N_i`` elements at offset ``M * (N_0 + ... +
N_{i-1})`` (patterns/grouped_gemv.py, fxpasses/grouped_gemv.py). The reference impl is those calls; CUDA
inputs ``can_use_grouped_gemv`` accepts run kernels/grouped_gemv.py (its docstring is the numerics contract).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.grouped_gemv import ALIGN, DTYPES, MAX_ROWS, block_k, can_use_grouped_gemv, plan_grouped_gemv
from .spec import OpSpec, register_op, tensor_key


def grouped_gemv(x: Tensor, weights: list[Tensor], biases: list[Tensor | None]) -> Tensor:
    return torch.cat([(torch.addmm(b, x, w.t()) if b is not None else torch.mm(x, w.t())).reshape(-1)
                      for w, b in zip(weights, biases)])


def member_problem(x: Tensor, weight: Tensor) -> str:
    """Why the kernel could never take a member reading ``x`` with ``weight`` (fake values), or '': the guard's
    static half. The pass groups only members it would take: one it refuses sends its whole group to the
    reference path."""
    if not 1 <= x.shape[0] <= MAX_ROWS:
        return f"{x.shape[0]} rows (the kernel takes 1 to {MAX_ROWS})"
    if x.dtype not in DTYPES:
        return f"dtype {x.dtype}"
    if block_k(x.shape[1]) is None:
        return f"K = {x.shape[1]} is not a multiple of 32"
    if weight.shape[0] % (ALIGN // x.element_size()):
        return f"{weight.shape[0]} output features are not {ALIGN}-byte aligned rows"
    return ""


def _operand_key(t: Tensor | None) -> tuple | None:
    # The plan's device tables hold the weights' and biases' addresses: they are part of the key.
    return None if t is None else (t.dtype, t.shape, t.stride(), t.data_ptr())


def layout_key(args: tuple) -> tuple:
    x, weights, biases = args
    return (tensor_key(x), tuple(map(_operand_key, weights)), tuple(map(_operand_key, biases)))


def _plan(a):
    run = plan_grouped_gemv(a.x, a.weights, a.biases)
    return lambda a: run(a.x, a.weights, a.biases)


SPEC = register_op(OpSpec("grouped_gemv", grouped_gemv, guard=lambda a: can_use_grouped_gemv(a.x, a.weights, a.biases),
                          plan=_plan, layout_key=layout_key))
