"""``diffusion_fuse::linear_cat``: linears whose outputs a ``cat`` joins, each GEMM writing straight into its
rows of the ``cat`` buffer (patterns/linear_cat.py).

Semantics are those of the ATen chain the pattern replaces: ``aten.addmm(bias_i, x_i, weight_i.t())`` (or
``aten.mm`` without a bias) for each piece, each viewed to its piece shape, then ``aten.cat`` along a dim
whose leading dims are all 1 (``dim`` of them), with ``inner`` the dims after it. With those leading dims 1, the
``cat`` is the pieces' flat data one after another, and piece ``i`` is a contiguous chunk of the buffer: its
``[M_i, N_i]`` rows. The ``cat`` dim's size follows from the pieces (a dynamic sequence length needs no
argument).

Numerics contract: the same ATen call as eager, only its ``out=`` differs. ``addmm`` / ``mm`` with ``out=`` a
contiguous, 16-byte-aligned chunk takes the same path as into a fresh tensor (ATen's Blas.cpp: the cuBLASLt
bias epilogue needs a contiguous 2-D result; the alignment cuBLASLt's heuristic is given is the result
pointer's, capped at 16 bytes), so the same kernel with the same arguments writes the same bits; the ``cat``'s
copy (FLUX's joint-attention value tensor: 4608 x 3072 bf16 a double block) is gone.
The guard sends a chunk that would not be 16-byte aligned to the reference. No Triton kernel: the "kernel"
is cuBLAS (or the CPU BLAS), called the way eager calls it; the verifier checks every site all the same.

Verified: tiny FLUX / SD3 / Qwen-Image on the CPU (tests/test_linear_cat.py); FLUX shapes on an H200
(tests/gpu/test_linear_cat_gpu.py).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .spec import OpSpec, register_op

ALIGN = 16  # bytes: cuBLASLt's alignment attribute for C is the pointer's, at most 16


def _linear(x, weight, bias, out=None):
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


def out_shape(xs, weights, dim, inner) -> list:
    total = sum(x.shape[0] * w.shape[0] for x, w in zip(xs, weights))
    return [1] * dim + [total // math.prod(inner)] + list(inner)


def linear_cat(xs: list[Tensor], weights: list[Tensor], biases: list[Tensor | None], dim: int,
               inner: list[int]) -> Tensor:
    flat = torch.cat([_linear(x, w, b).reshape(-1) for x, w, b in zip(xs, weights, biases)])
    return flat.view(out_shape(xs, weights, dim, inner))


def can_use_linear_cat(a) -> tuple[bool, str]:
    """Whether writing each GEMM into its chunk runs the call eager runs; else the reason."""
    xs, weights, biases, inner = a.xs, a.weights, a.biases, a.inner
    why = ""
    if not (len(xs) == len(weights) == len(biases)) or len(xs) < 1:
        why = f"{len(xs)} inputs, {len(weights)} weights, {len(biases)} biases"
    tensors = [t for t in (*xs, *weights, *biases) if t is not None]
    if not why and any(t.device != xs[0].device or t.dtype != xs[0].dtype for t in tensors):
        why = "operands on different devices or of different dtypes"
    if not why:
        for x, w, b in zip(xs, weights, biases):
            if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or (
                    b is not None and tuple(b.shape) != (w.shape[0],)):
                why = (f"shapes x {tuple(x.shape)}, weight {tuple(w.shape)}, "
                       f"bias {None if b is None else tuple(b.shape)}")
                break
    if not why:
        for x, w in zip(xs, weights):
            if (x.shape[0] * w.shape[0]) % math.prod(inner):
                why = f"a [{x.shape[0]}, {w.shape[0]}] piece is not a whole number of {list(inner)} blocks"
                break
    if not why:
        size, off = xs[0].element_size(), 0
        for x, w in zip(xs, weights):
            if (off * size) % ALIGN:
                why = f"a piece starts {off * size} bytes into the buffer (not {ALIGN}-byte aligned)"
                break
            off += x.shape[0] * w.shape[0]
    return not why, why


def _plan(_a):
    def launch(a):
        xs, weights = a.xs, a.weights
        out = torch.empty(out_shape(xs, weights, a.dim, a.inner), dtype=xs[0].dtype, device=xs[0].device)
        flat, off = out.view(-1), 0
        for x, w, b in zip(xs, weights, a.biases):
            m, n = x.shape[0], w.shape[0]
            _linear(x, w, b, out=flat[off:off + m * n].view(m, n))
            off += m * n
        return out

    return launch


SPEC = register_op(OpSpec("linear_cat", linear_cat, guard=can_use_linear_cat, plan=_plan, needs_triton=False,
                           compute_bound=True))
