"""``diffusion_fuse::cat_quant``: ``cat([a, b], -1)`` quantized to FP8 without writing the cat, unless something
else reads it (``keep_cat``; patterns/cat_quant.py). Returns ``[cat, q]`` or ``[q]``.

Semantics: the cat, then lowering/fp8.py's ``quantize``. CUDA inputs the guard accepts run kernels/cat_quant.py.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.cat_quant import plan_cat_quant
from . import checks
from .fp8 import check_quant, check_rows, quantize
from .spec import OpSpec, register_op


def cat_quant(a: Tensor, b: Tensor, scale: Tensor, q_mode: str, lo: float, hi: float,
              keep_cat: bool) -> list[Tensor]:
    c = torch.cat([a, b], -1)
    q = quantize(c, scale, q_mode, lo, hi)
    return [c, q] if keep_cat else [q]


def can_use_cat_quant(args) -> tuple[bool, str]:
    a, b = args.a, args.b
    why = checks.device_and_dtypes(a, (b,)) or check_quant(args.scale, args.q_mode, args.lo, args.hi, a.device)
    why = why or check_rows("a", a) or check_rows("b", b)
    if not why and (a.dtype != b.dtype or a.shape[:-1] != b.shape[:-1]):
        why = f"a {a.dtype}{list(a.shape)} and b {b.dtype}{list(b.shape)} differ in dtype or rows"
    return not why, why


SPEC = register_op(OpSpec("cat_quant", cat_quant, guard=can_use_cat_quant, plan=plan_cat_quant))
