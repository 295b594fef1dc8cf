"""Static FP8 (e4m3fn) quantization in Triton: the quantizer every FP8 kernel shares, and the norm kernels' epilogue.

Numerics contract (lossless tier). Eager quantizes a tensor ``x`` with a per-tensor static
scale as four elementwise kernels; per element, in fp32::

    a = float(x)                       # _to_copy(x, f32)   (absent when x is fp32)
    y = a / s                          # div.Tensor(a, s):   IEEE division (nvcc: div.rn)    Q_MODE 0
      | a * r                          # mul.Tensor(a, r):   the `* (1 / s)` form, r given   Q_MODE 1
    c = y if isnan(y) else min(max(y, lo), hi)   # clamp.default(y, lo, hi), -448 <= lo <= hi <= 448
    q = e4m3fn(c)                      # _to_copy(c, float8_e4m3fn)

``s``/``r`` is a one-element tensor on the GPU, loaded once and converted to fp32 (RNE). (Eager
multiplies by the reciprocal of a *CPU* scalar instead, which the guards send to the reference path.)

The cast: after the clamp every finite value lies in [-448, 448], where c10's software
conversion (``c10/util/Float8_e4m3fn.h``: round to nearest even, subnormals by an fp32 add)
and the hardware ``cvt.rn.satfinite.e4m3x2.f32`` that ``.to(tl.float8e4nv)`` emits on sm_89+
(and that torch built with CUDA >= 13 uses in ``float8_copy_kernel_cuda``) give the same
bits, signed zeros included. They differ on NaN: c10 keeps the sign (``0x7F | sign``), the
hardware returns ``0x7F``. Which one this torch build runs is read off the GPU once
(``eager_nan_keeps_sign``) and passed as NAN_SIGN; the kernel writes NaN bits explicitly.

The standalone quantizer is kernels/static_quant.py, the concatenation's kernels/cat_quant.py.
Verified shapes: tests/gpu/test_fp8_quant_gpu.py.
"""

from __future__ import annotations

import functools

import torch

from .optional_triton import tl, triton

BLOCK = 1024  # elements per program along D (standalone and cat kernels)
Q_MODES = {"div": 0, "mul": 1}  # an op's q_mode -> the kernels' Q_MODE: x / scale, or x * scale (scale = 1 / s)
MAX_QUANTS = 4  # quantizers one norm kernel feeds (S0..S3)
NUM_WARPS = 4


@triton.jit
def quantize_e4m3(v, s, lo, hi, Q_MODE: tl.constexpr, NAN_SIGN: tl.constexpr):
    """fp32 ``v`` → e4m3fn bits (uint8) as eager's ``(v / s | v * s).clamp(lo, hi).to(e4m3fn)`` (contract above)."""
    if Q_MODE == 0:
        y = tl.math.div_rn(v, s + tl.zeros_like(v))
    else:
        y = v * s
    is_nan = y != y
    c = tl.minimum(tl.maximum(y, lo), hi)
    bits = c.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    if NAN_SIGN:
        nan_bits = ((y.to(tl.uint32, bitcast=True) >> 24) & 0x80) | 0x7F
    else:
        nan_bits = tl.full(y.shape, 0x7F, tl.uint32)
    return tl.where(is_nan, nan_bits.to(tl.uint8), bits)


@functools.cache
def eager_nan_keeps_sign(device: torch.device) -> bool:
    """Whether eager's float → e4m3fn cast on ``device`` keeps a NaN's sign (c10's software path)."""
    q = torch.tensor([-float("nan")], device=device).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return int(q.view(torch.uint8).item()) == 0xFF


def row_strides(x: torch.Tensor) -> tuple[int, int, int]:
    """(S, batch stride, row stride) of x read as rows of its last dim ([D], [M, D] or [B, S, D])."""
    if x.dim() == 3:
        return x.shape[1], x.stride(0), x.stride(1)
    if x.dim() == 2:
        return 1, x.stride(0), 0
    return 1, 0, 0


# --- the quant epilogue of the norm kernels (kernels/norm_modulate.py, kernels/gated_residual_norm_modulate.py)
@triton.jit
def load_scales(S0, S1, S2, S3, N_Q: tl.constexpr):
    """The epilogue's scales as fp32 (1.0 for the unused ones)."""
    s0 = 1.0
    s1 = 1.0
    s2 = 1.0
    s3 = 1.0
    if N_Q > 0:
        s0 = tl.load(S0).to(tl.float32)
    if N_Q > 1:
        s1 = tl.load(S1).to(tl.float32)
    if N_Q > 2:
        s2 = tl.load(S2).to(tl.float32)
    if N_Q > 3:
        s3 = tl.load(S3).to(tl.float32)
    return s0, s1, s2, s3


@triton.jit
def store_quants(q_row, q_plane, offs, mask, v, s0, s1, s2, s3, q_lo, q_hi, N_Q: tl.constexpr, Q_MODE: tl.constexpr,
                 NAN_SIGN: tl.constexpr):
    """Quantize fp32 ``v`` with each of the N_Q scales; quantizer i stores at ``q_row + i * q_plane``."""
    tl.store(q_row + offs, quantize_e4m3(v, s0, q_lo, q_hi, Q_MODE, NAN_SIGN), mask=mask)
    if N_Q > 1:
        tl.store(q_row + q_plane + offs, quantize_e4m3(v, s1, q_lo, q_hi, Q_MODE, NAN_SIGN), mask=mask)
    if N_Q > 2:
        tl.store(q_row + 2 * q_plane + offs, quantize_e4m3(v, s2, q_lo, q_hi, Q_MODE, NAN_SIGN), mask=mask)
    if N_Q > 3:
        tl.store(q_row + 3 * q_plane + offs, quantize_e4m3(v, s3, q_lo, q_hi, Q_MODE, NAN_SIGN), mask=mask)


class QuantEpilogue:
    """Host side of the epilogue for one layout: constexprs, the e4m3 buffer, the runtime arguments.

    ``quant`` is None (no epilogue) or ``(n_quantizers, q_mode, keep_out)``. The quantized
    outputs are planes of one [n, *shape] buffer (contiguous views, one allocation).
    """

    def __init__(self, quant: tuple[int, str, bool] | None, shape, out_dt_code: int, device) -> None:
        self.n, q_mode, self.keep_out = quant if quant else (0, "div", True)
        self.shape, self.device = tuple(shape), device
        self.plane = 1
        for d in self.shape:
            self.plane *= d
        nan_sign = eager_nan_keeps_sign(device) if self.n else False
        self.constexprs = dict(N_Q=self.n, STORE_OUT=self.keep_out, OUT_DT=out_dt_code, Q_MODE=Q_MODES[q_mode],
                               NAN_SIGN=nan_sign)

    def args(self, dummy: torch.Tensor, a=None) -> tuple[tuple, torch.Tensor | None]:
        """(runtime arguments Q, q_plane, S0..S3, q_lo, q_hi; the e4m3 buffer or None), from a ``_quant`` op's
        arguments ``a`` (``q_scales``, ``lo``, ``hi``; none without an epilogue)."""
        if not self.n:
            return (dummy, 0, dummy, dummy, dummy, dummy, 0.0, 0.0), None
        q = torch.empty((self.n, *self.shape), dtype=torch.float8_e4m3fn, device=self.device)
        s = list(a.q_scales) + [a.q_scales[0]] * (MAX_QUANTS - len(a.q_scales))
        return (q.view(torch.uint8), self.plane, *s, a.lo, a.hi), q

    def outputs(self, leading: list, out, q) -> list:
        """The op's Tensor[] result: ``leading`` outputs, ``out`` if kept, then the quantized planes."""
        return leading + ([out] if self.keep_out else []) + list(q.unbind(0))
