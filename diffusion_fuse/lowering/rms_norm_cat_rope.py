"""``diffusion_fuse::rms_norm_cat_rope``: two ``rms_norm`` outputs concatenated along a row dim, then
``rms_norm_rope``'s RoPE (patterns/rms_norm_cat_rope.py)::

    out = rope(cat([rms_norm(x_a, w_a, eps_a), rms_norm(x_b, w_b, eps_b)], dim), cos, sin)

run as two launches of the ``rms_norm_rope`` kernel writing the two halves of one output: the cat is never a pass.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .rms_norm import check_norm, contiguous_strides, fused_rms_norm
from .rms_norm_rope import check_rope_tables, narrow_rows, plan_part, rope
from .spec import OpSpec, register_op


def rms_norm_cat_rope(x_a: Tensor, w_a: Tensor | None, eps_a: float | None, x_b: Tensor, w_b: Tensor | None,
                      eps_b: float | None, dim: int, cos: Tensor, sin: Tensor) -> Tensor:
    return rope(torch.cat([fused_rms_norm(x_a, w_a, eps_a), fused_rms_norm(x_b, w_b, eps_b)], dim), cos, sin)


def cat_shape(x_a: Tensor, x_b: Tensor, dim: int) -> torch.Size:
    shape = list(x_a.shape)
    shape[dim] = x_a.shape[dim] + x_b.shape[dim]
    return torch.Size(shape)


def can_use_rms_norm_cat_rope(a) -> tuple[bool, str]:
    """Both norms as ``rms_norm``'s guard takes them; the cat along a row dim of same-dtype, same-shape halves;
    cos/sin as ``rms_norm_rope``'s guard checks them, against the concatenated shape."""
    x_a, x_b, dim = a.x_a, a.x_b, a.dim
    why = check_norm(x_a, a.w_a) or check_norm(x_b, a.w_b)
    if not why and (x_a.dtype != x_b.dtype or x_a.device != x_b.device or x_a.dim() != x_b.dim()):
        why = f"halves differ: {x_a.dtype}/{x_b.dtype} on {x_a.device}/{x_b.device}, {x_a.dim()}/{x_b.dim()} dims"
    if not why and not 0 <= dim < x_a.dim() - 1:
        why = f"cat dim {dim} is not a row dim of {x_a.dim()}-dim inputs"
    if not why and any(p != q for i, (p, q) in enumerate(zip(x_a.shape, x_b.shape)) if i != dim):
        why = f"halves {tuple(x_a.shape)} and {tuple(x_b.shape)} differ outside the cat dim"
    why = why or check_rope_tables(cat_shape(x_a, x_b, dim), dim, a.cos, a.sin, [(x_a, 0), (x_b, x_a.shape[dim])])
    return not why, why


def plan(a):
    shape = cat_shape(a.x_a, a.x_b, a.dim)
    out_strides = contiguous_strides(shape)
    dim = a.dim
    parts = []
    for x, w, eps, start in ((a.x_a, a.w_a, a.eps_a, 0), (a.x_b, a.w_b, a.eps_b, a.x_a.shape[dim])):
        n = x.shape[dim]
        c, s = (narrow_rows(t, len(shape), dim, start, n) for t in (a.cos, a.sin))
        parts.append((plan_part(x, w, eps, c, s, out_strides), start, n))

    def launch(a):
        out = torch.empty_strided(shape, out_strides, dtype=a.x_a.dtype, device=a.x_a.device)
        for (run, start, n), x, w in zip(parts, (a.x_a, a.x_b), (a.w_a, a.w_b)):
            c, s = (narrow_rows(t, len(shape), dim, start, n) for t in (a.cos, a.sin))
            run(x, w, None, c, s, out=out.narrow(dim, start, n))
        return out

    return launch


SPEC = register_op(OpSpec("rms_norm_cat_rope", rms_norm_cat_rope, guard=can_use_rms_norm_cat_rope, plan=plan))
