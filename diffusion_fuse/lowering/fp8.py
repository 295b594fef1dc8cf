"""Static FP8 quantization as the ATen chain computes it, and the ``_quant`` twin of an op that feeds quantizers.

Per quantizer, as eager runs it (patterns/static_quant.py)::

    a = x.to(float32)                          # absent when x is fp32
    y = a / scale        (q_mode "div")  |  a * scale   (q_mode "mul": the `* (1 / s)` form; scale is 1/s)
    q = y.clamp(lo, hi).to(float8_e4m3fn)      # -448 <= lo <= hi <= 448

``scale`` is a one-element tensor. ``quant_twin(spec)`` derives, from an op whose last output a norm kernel
writes, the op ``<name>_quant`` that also quantizes that output with n <= ``MAX_QUANTS`` scales (one per FP8
linear reading it): its arguments are the base op's, then ``q_scales, q_mode, lo, hi, keep_out``; it returns the
base op's outputs (the last only if ``keep_out``: something else reads it), then the n quantized tensors. Its
reference, guard and fake impl are derived from the base op's, so its argument list is written nowhere.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..kernels.fp8_quant import MAX_QUANTS, Q_MODES
from .spec import OpSpec, register_op

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)
_SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def quantize(x: Tensor, scale: Tensor, q_mode: str, lo: float, hi: float) -> Tensor:
    a = x if x.dtype == torch.float32 else x.to(torch.float32)
    y = a / scale if q_mode == "div" else a * scale
    return y.clamp(lo, hi).to(FP8)


def check_quant(scale: Tensor, q_mode: str, lo: float, hi: float, device: torch.device) -> str:
    """'' if the kernels' quantizer reproduces eager for this scale and these bounds, else why not."""
    if q_mode not in Q_MODES:
        return f"q_mode {q_mode!r} (kernels take {sorted(Q_MODES)})"
    if not -FP8_MAX <= lo <= hi <= FP8_MAX:
        return f"clamp bounds ({lo}, {hi}) reach past the e4m3 range (casts that saturate differ)"
    if scale.numel() != 1:
        return f"scale has {scale.numel()} elements (per-tensor scales only)"
    if scale.device != device:
        return f"scale is on {scale.device} (eager multiplies by a host reciprocal for CPU scalars)"
    if scale.dtype not in _SCALE_DTYPES:
        return f"scale dtype {scale.dtype}"
    return ""


def check_rows(name: str, t: Tensor) -> str:
    """'' if the quant kernels can read ``t`` as rows of its last dim."""
    if t.dim() not in (1, 2, 3):
        return f"{name} has rank {t.dim()} (kernel takes 1 to 3)"
    if t.numel() == 0:
        return "empty input"
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        return f"{name} is not contiguous along the last dim"
    return ""


_QUANT_PARAMS = (("q_scales", list[Tensor]), ("q_mode", str), ("lo", float), ("hi", float), ("keep_out", bool))


def quant_twin(base: OpSpec, plan: Callable[[Any, tuple[int, str, bool]], Callable[[Any], Any]]) -> OpSpec:
    """Register ``<base.name>_quant`` (module docstring). ``plan(a, (n, q_mode, keep_out))`` is the base kernel's
    planner with its quant epilogue; its launch takes the twin's arguments and returns the twin's outputs."""
    sig = inspect.signature(base.reference, eval_str=True)
    n_base = len(sig.parameters)

    def reference(*args: Any) -> list[Tensor]:
        outs = base.reference(*args[:n_base])
        q_scales, q_mode, lo, hi, keep_out = args[n_base:]
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        last = outs.pop()
        return outs + ([last] if keep_out else []) + [quantize(last, s, q_mode, lo, hi) for s in q_scales]

    extra = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=t) for name, t in _QUANT_PARAMS]
    base_params = [p.replace(default=inspect.Parameter.empty) for p in sig.parameters.values()]  # all given
    reference.__signature__ = inspect.Signature([*base_params, *extra], return_annotation=list[Tensor])
    reference.__name__ = reference.__qualname__ = f"{base.name}_quant"

    def guard(a) -> tuple[bool, str]:
        ok, why = base.guard(base.bind(a[:n_base]))
        device = a[0].device
        if ok and not 1 <= len(a.q_scales) <= MAX_QUANTS:
            why = f"{len(a.q_scales)} quantizers (kernel feeds 1 to {MAX_QUANTS})"
        why = why or next((w for w in (check_quant(s, a.q_mode, a.lo, a.hi, device) for s in a.q_scales) if w), "")
        return not why, why

    def static_guard(a) -> str:
        if not 1 <= len(a.q_scales) <= MAX_QUANTS:
            return f"{len(a.q_scales)} quantizers (kernel feeds 1 to {MAX_QUANTS})"
        return base.static_guard(base.bind(a[:n_base])) if base.static_guard is not None else ""

    return register_op(OpSpec(f"{base.name}_quant", reference, guard=guard, static_guard=static_guard,
                              plan=lambda a: plan(a, (len(a.q_scales), a.q_mode, a.keep_out))))
