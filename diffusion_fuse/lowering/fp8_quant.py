"""Static FP8 quantization ops: the quantizer alone, and fused into the kernel that produces its input.

Every op quantizes as eager's ATen chain does (patterns/static_quant.py), per quantizer::

    a = x.to(float32)                          # absent when x is fp32
    y = a / scale          (q_mode 0)  |  a * scale   (q_mode 1: the `* (1 / s)` form; scale is 1/s)
    q = y.clamp(lo, hi).to(float8_e4m3fn)      # -448 <= lo <= hi <= 448

``scale`` is a one-element tensor. The ops:

- ``static_quant(x, scale, q_mode, lo, hi) -> q``: the quantizer alone, in one pass.
- ``cat_quant(a, b, scale, q_mode, lo, hi, keep_cat) -> [cat?, q]``: ``cat([a, b], -1)``
  quantized without writing the cat (written too when ``keep_cat``: something else reads it).
- ``ln_modulate_quant(<ln_modulate args>, q_scales, q_mode, lo, hi, keep_out) -> [out?, q_1..q_n]``:
  LayerNorm + modulate whose output feeds n <= 4 quantizers (one per linear reading it).
- ``gated_residual_ln_modulate_quant(<gated args>, q_scales, ..., keep_out) -> [r, out?, q_1..q_n]``.

The base op's optional trailing arguments (a timestep table's second addends, Wan's casts) follow
``keep_out`` in the two norm ops.

The reference impls are those chains (CPU, and whatever a guard rejects); CUDA inputs the
guards accept run the kernels in kernels/fp8_quant.py, kernels/cat_quant.py and, for the
norm ops, kernels/ln_modulate.py and kernels/gated_residual_ln.py with their quant epilogue.
"""

from __future__ import annotations

import torch

from .dispatch import GuardedKernel, impl
from .gated_residual import can_use_gated_residual_ln_modulate, gated_residual_ln_modulate_reference
from .gated_residual import layout_key as gated_layout_key
from .norm_modulate import can_use_ln_modulate, check_device_and_dtypes, ln_modulate_reference
from .norm_modulate import layout_key as ln_layout_key

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
Q_DIV, Q_MUL = 0, 1
MAX_QUANTS = 4  # quantizers one norm kernel feeds (FLUX single block: proj_mlp, to_q, to_k, to_v)


def quant_reference(x, scale, q_mode, lo, hi):
    a = x if x.dtype == torch.float32 else x.to(torch.float32)
    y = a / scale if q_mode == Q_DIV else a * scale
    return y.clamp(lo, hi).to(FP8)


def check_quant(scale, q_mode, lo, hi, device) -> str:
    """'' if the kernels' quantizer reproduces eager for this scale and these bounds, else why not."""
    if q_mode not in (Q_DIV, Q_MUL):
        return f"q_mode {q_mode}"
    if not -FP8_MAX <= lo <= hi <= FP8_MAX:
        return f"clamp bounds ({lo}, {hi}) reach past the e4m3 range (casts that saturate differ)"
    if scale.numel() != 1:
        return f"scale has {scale.numel()} elements (per-tensor scales only)"
    if scale.device != device:
        return f"scale is on {scale.device} (eager multiplies by a host reciprocal for CPU scalars)"
    if scale.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"scale dtype {scale.dtype}"
    return ""


def check_quant_rows(name: str, t) -> str:
    if t.dim() not in (1, 2, 3):
        return f"{name} has rank {t.dim()} (kernel takes 1 to 3)"
    if t.numel() == 0:
        return "empty input"
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        return f"{name} is not contiguous along the last dim"
    return ""


def _ptr_key(t):
    return None if t is None else (t.dtype, t.shape, t.stride(), t.data_ptr() & 15)


# --- static_quant -------------------------------------------------------------------------
def can_use_static_quant(x, scale, q_mode, lo, hi) -> tuple[bool, str]:
    why = check_device_and_dtypes(x, ()) or check_quant(scale, q_mode, lo, hi, x.device)
    why = why or check_quant_rows("x", x)
    return not why, why


def static_quant_layout_key(x, scale, q_mode, lo, hi) -> tuple:
    return (x.device, _ptr_key(x), _ptr_key(scale), q_mode)


def _plan_static_quant(*args):
    from ..kernels.fp8_quant import plan_static_quant

    return plan_static_quant(*args)


_static_quant = GuardedKernel("static_quant", static_quant_layout_key, can_use_static_quant, _plan_static_quant,
                              quant_reference)


# --- cat_quant ----------------------------------------------------------------------------
def cat_quant_reference(a, b, scale, q_mode, lo, hi, keep_cat):
    c = torch.cat([a, b], -1)
    q = quant_reference(c, scale, q_mode, lo, hi)
    return [c, q] if keep_cat else [q]


def can_use_cat_quant(a, b, scale, q_mode, lo, hi, keep_cat) -> tuple[bool, str]:
    why = check_device_and_dtypes(a, (b,)) or check_quant(scale, q_mode, lo, hi, a.device)
    why = why or check_quant_rows("a", a) or check_quant_rows("b", b)
    if not why and (a.dtype != b.dtype or a.shape[:-1] != b.shape[:-1]):
        why = f"a {a.dtype}{list(a.shape)} and b {b.dtype}{list(b.shape)} differ in dtype or rows"
    return not why, why


def cat_quant_layout_key(a, b, scale, q_mode, lo, hi, keep_cat) -> tuple:
    return (a.device, _ptr_key(a), _ptr_key(b), _ptr_key(scale), q_mode, keep_cat)


def _plan_cat_quant(*args):
    from ..kernels.cat_quant import plan_cat_quant

    return plan_cat_quant(*args)


_cat_quant = GuardedKernel("cat_quant", cat_quant_layout_key, can_use_cat_quant, _plan_cat_quant,
                           cat_quant_reference)


# --- norm ops with a quant epilogue ---------------------------------------------------------
def check_quant_list(q_scales, q_mode, lo, hi, device) -> str:
    if not 1 <= len(q_scales) <= MAX_QUANTS:
        return f"{len(q_scales)} quantizers (kernel feeds 1 to {MAX_QUANTS})"
    return next((w for w in (check_quant(s, q_mode, lo, hi, device) for s in q_scales) if w), "")


def ln_modulate_quant_reference(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype, q_scales, q_mode, lo, hi,
                                keep_out, *base_tail):
    out = ln_modulate_reference(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype, *base_tail)
    qs = [quant_reference(out, s, q_mode, lo, hi) for s in q_scales]
    return ([out] if keep_out else []) + qs


def can_use_ln_modulate_quant(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype, q_scales, q_mode, lo, hi,
                              keep_out, *base_tail) -> tuple[bool, str]:
    ok, why = can_use_ln_modulate(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype, *base_tail)
    why = why or check_quant_list(q_scales, q_mode, lo, hi, x.device)
    return not why, why


def ln_modulate_quant_layout_key(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype, q_scales, q_mode, lo, hi,
                                 keep_out, *base_tail) -> tuple:
    return (ln_layout_key(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype, *base_tail),
            tuple(_ptr_key(s) for s in q_scales), q_mode, keep_out)


def _plan_ln_modulate_quant(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype, q_scales, q_mode, lo, hi,
                            keep_out, *base_tail):
    from ..kernels.ln_modulate import plan_ln_modulate

    return plan_ln_modulate(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype, *base_tail,
                            quant=(len(q_scales), q_mode, keep_out))


_ln_modulate_quant = GuardedKernel("ln_modulate_quant", ln_modulate_quant_layout_key, can_use_ln_modulate_quant,
                                   _plan_ln_modulate_quant, ln_modulate_quant_reference)


def gated_residual_ln_modulate_quant_reference(residual, x, gate, weight, bias, eps, scale, shift, out_dtype, q_scales,
                                               q_mode, lo, hi, keep_out, *base_tail):
    r, out = gated_residual_ln_modulate_reference(residual, x, gate, weight, bias, eps, scale, shift, out_dtype,
                                                  *base_tail)
    qs = [quant_reference(out, s, q_mode, lo, hi) for s in q_scales]
    return [r] + ([out] if keep_out else []) + qs


def can_use_gated_residual_ln_modulate_quant(residual, x, gate, weight, bias, eps, scale, shift, out_dtype, q_scales,
                                             q_mode, lo, hi, keep_out, *base_tail) -> tuple[bool, str]:
    ok, why = can_use_gated_residual_ln_modulate(residual, x, gate, weight, bias, eps, scale, shift, out_dtype,
                                                 *base_tail)
    why = why or check_quant_list(q_scales, q_mode, lo, hi, x.device)
    return not why, why


def gated_residual_ln_modulate_quant_layout_key(residual, x, gate, weight, bias, eps, scale, shift, out_dtype,
                                                q_scales, q_mode, lo, hi, keep_out, *base_tail) -> tuple:
    return (gated_layout_key(residual, x, gate, weight, bias, eps, scale, shift, out_dtype, *base_tail),
            tuple(_ptr_key(s) for s in q_scales), q_mode, keep_out)


def _plan_gated_quant(residual, x, gate, weight, bias, eps, scale, shift, out_dtype, q_scales, q_mode, lo, hi,
                      keep_out, *base_tail):
    from ..kernels.gated_residual_ln import plan_gated_residual_ln_modulate

    return plan_gated_residual_ln_modulate(residual, x, gate, weight, bias, eps, scale, shift, out_dtype, *base_tail,
                                           quant=(len(q_scales), q_mode, keep_out))


_gated_quant = GuardedKernel("gated_residual_ln_modulate_quant", gated_residual_ln_modulate_quant_layout_key,
                             can_use_gated_residual_ln_modulate_quant, _plan_gated_quant,
                             gated_residual_ln_modulate_quant_reference)

# --- registration ---------------------------------------------------------------------------
_lib = torch.library.Library("diffusion_fuse", "FRAGMENT")
_QUANT_ARGS = "int q_mode, float lo, float hi"
_lib.define(f"static_quant(Tensor x, Tensor scale, {_QUANT_ARGS}) -> Tensor")
_lib.define(f"cat_quant(Tensor a, Tensor b, Tensor scale, {_QUANT_ARGS}, bool keep_cat) -> Tensor[]")
_lib.define("ln_modulate_quant(Tensor x, Tensor? weight, Tensor? bias, float eps, Tensor scale, Tensor? shift, "
            f"ScalarType? ln_dtype, ScalarType? out_dtype, Tensor[] q_scales, {_QUANT_ARGS}, bool keep_out, "
            "Tensor? scale_temb=None, Tensor? shift_temb=None) -> Tensor[]")
_lib.define("gated_residual_ln_modulate_quant(Tensor residual, Tensor x, Tensor gate, Tensor? weight, Tensor? bias, "
            f"float eps, Tensor? scale, Tensor? shift, ScalarType? out_dtype, Tensor[] q_scales, {_QUANT_ARGS}, "
            "bool keep_out, Tensor? gate_temb=None, Tensor? scale_temb=None, Tensor? shift_temb=None, "
            "ScalarType? r_dtype=None, ScalarType? ln_dtype=None) -> Tensor[]")
for _name, _impl in (("static_quant", _static_quant), ("cat_quant", _cat_quant),
                     ("ln_modulate_quant", _ln_modulate_quant),
                     ("gated_residual_ln_modulate_quant", _gated_quant)):
    impl(_lib, _name, _impl)


@torch.library.register_fake("diffusion_fuse::static_quant", lib=_lib)
def _(x, scale, q_mode, lo, hi):
    return x.new_empty(x.shape, dtype=FP8)


@torch.library.register_fake("diffusion_fuse::cat_quant", lib=_lib)
def _(a, b, scale, q_mode, lo, hi, keep_cat):
    shape = (*a.shape[:-1], a.shape[-1] + b.shape[-1])
    q = a.new_empty(shape, dtype=FP8)
    return [a.new_empty(shape, dtype=torch.promote_types(a.dtype, b.dtype)), q] if keep_cat else [q]


@torch.library.register_fake("diffusion_fuse::ln_modulate_quant", lib=_lib)
def _(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype, q_scales, q_mode, lo, hi, keep_out, *base_tail):
    out = torch.ops.diffusion_fuse.ln_modulate.default(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype,
                                                        *base_tail)
    return ([out] if keep_out else []) + [out.new_empty(out.shape, dtype=FP8) for _ in q_scales]


@torch.library.register_fake("diffusion_fuse::gated_residual_ln_modulate_quant", lib=_lib)
def _(residual, x, gate, weight, bias, eps, scale, shift, out_dtype, q_scales, q_mode, lo, hi, keep_out, *base_tail):
    r, out = torch.ops.diffusion_fuse.gated_residual_ln_modulate.default(
        residual, x, gate, weight, bias, eps, scale, shift, out_dtype, *base_tail)
    return [r] + ([out] if keep_out else []) + [out.new_empty(out.shape, dtype=FP8) for _ in q_scales]
