"""``diffusion_fuse::static_quant``: a static FP8 quantizer alone, in one pass (patterns/static_quant.py).

Semantics: lowering/fp8.py's ``quantize``. CUDA inputs the guard accepts run kernels/static_quant.py.
"""

from __future__ import annotations

from torch import Tensor

from ..kernels.static_quant import plan_static_quant
from . import checks
from .fp8 import check_quant, check_rows, quantize
from .spec import OpSpec, register_op


def static_quant(x: Tensor, scale: Tensor, q_mode: str, lo: float, hi: float) -> Tensor:
    return quantize(x, scale, q_mode, lo, hi)


def can_use_static_quant(a) -> tuple[bool, str]:
    why = checks.device_and_dtypes(a.x, ()) or check_quant(a.scale, a.q_mode, a.lo, a.hi, a.x.device)
    why = why or check_rows("x", a.x)
    return not why, why


SPEC = register_op(OpSpec("static_quant", static_quant, guard=can_use_static_quant, plan=plan_static_quant))
