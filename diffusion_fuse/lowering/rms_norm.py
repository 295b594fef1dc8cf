"""``diffusion_fuse::rms_norm`` and ``diffusion_fuse::rms_norm_chain``: RMSNorm [+ AdaLN modulate] as one op.

Semantics are those of the ATen chains the patterns replace (patterns/rms_norm.py).

``rms_norm`` (family ``rms_norm``, lossless)::

    y   = aten._fused_rms_norm(x, [D], weight, eps)[0]     # torch.nn.RMSNorm / F.rms_norm on CUDA
    out = y * (scale + 1) [+ shift] [→ out_dtype]           # optional, each op rounded to its eager dtype

``rms_norm_chain`` (family ``rms_norm_chain``, tier high, not bit-exact)::

    xf = x.to(float32)                                      # absent for an fp32 x
    h  = x * rsqrt(mean(pow(xf, 2), -1, keepdim=True) + eps)
    h  = h.to(cast1); h = h * weight; h = h + bias; h = h.to(cast2)     # each optional, in this order
    out = h * (scale + 1) [+ shift] [→ out_dtype]           # optional

``rms_norm_rope`` (family ``rms_norm_rope``, lossless): ``rms_norm`` without modulate, then diffusers'
``apply_rotary_emb`` (``use_real=True``, ``use_real_unbind_dim=-1``: the FLUX/FLUX.2 single-block q and k)::

    re, im = y.unflatten(-1, (-1, 2)).unbind(-1)
    out = (y.float() * cos + stack([-im, re], -1).flatten(-2).float() * sin).to(y.dtype)

``rms_norm_cat_rope`` (family ``rms_norm_cat_rope``, lossless): two ``rms_norm`` outputs concatenated along a row
dim, then the same RoPE (the FLUX / FLUX.2 double blocks: text and image q, k)::

    out = rope(cat([rms_norm(x_a, w_a, eps_a), rms_norm(x_b, w_b, eps_b)], dim), cos, sin)

run as two launches of the ``rms_norm_rope`` kernel writing the two halves of one output.

(diffusers' RMSNorm is ``cast1 = weight dtype`` then ``* weight`` for a half-precision weight,
``cast2 = x.dtype`` without a weight; PyTorch's composite ``rms_norm`` is ``* weight`` then
``cast2 = x.dtype``.) The reference impls *are* these chains (CPU, and every input a guard
rejects); CUDA inputs the guards accept run kernels/rms_norm.py. ``rms_norm``'s output is
contiguous, as ``_fused_rms_norm``'s; ``rms_norm_chain``'s has x's layout (``empty_like``).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from ..kernels.rows import row_layout
from .dispatch import GuardedKernel, impl
from .norm_modulate import (KERNEL_DTYPES, MAX_D, VEC, check_broadcast, check_device_and_dtypes, modulate_reference,
                            result_dtypes)


# ----------------------------------------------------------------------------------------
# Reference impls and result dtypes
# ----------------------------------------------------------------------------------------


def rms_norm_reference(x, weight, eps, scale, shift, out_dtype) -> Tensor:
    y = torch.ops.aten._fused_rms_norm.default(x, [x.shape[-1]], weight, eps)[0]
    return y if scale is None else modulate_reference(y, scale, shift, out_dtype)


def rope_reference(y: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """diffusers' ``apply_rotary_emb`` (use_real, unbind -1) on y, op for op as eager runs it."""
    re, im = y.unflatten(-1, (-1, 2)).unbind(-1)
    rot = torch.stack([-im, re], -1).flatten(-2)
    return (y.float() * cos + rot.float() * sin).to(y.dtype)


def rms_norm_rope_reference(x, weight, eps, cos, sin) -> Tensor:
    return rope_reference(rms_norm_reference(x, weight, eps, None, None, None), cos, sin)


def rms_norm_cat_rope_reference(x_a, w_a, eps_a, x_b, w_b, eps_b, dim, cos, sin) -> Tensor:
    y = torch.cat([rms_norm_reference(x_a, w_a, eps_a, None, None, None),
                   rms_norm_reference(x_b, w_b, eps_b, None, None, None)], dim)
    return rope_reference(y, cos, sin)


def rms_norm_chain_reference(x, eps, cast1, weight, bias, cast2, scale, shift, out_dtype) -> Tensor:
    xf = x.to(torch.float32)
    # x * r: a bf16/fp16 x is promoted exactly, so this is the graph's mul(x, r) or mul(xf, r) alike.
    h = x * torch.rsqrt(torch.mean(torch.pow(xf, 2), dim=-1, keepdim=True) + eps)
    if cast1 is not None:
        h = h.to(cast1)
    if weight is not None:
        h = h * weight
    if bias is not None:
        h = h + bias
    if cast2 is not None:
        h = h.to(cast2)
    out = h if scale is None else modulate_reference(h, scale, shift, out_dtype)
    like = torch.empty_like(x, dtype=out.dtype)
    if out.stride() != like.stride():  # keep the op's layout that of its fake impl
        like.copy_(out)
        out = like
    return out


@dataclasses.dataclass(frozen=True)
class Tail:
    """The ops after ``h = x * rstd`` (fp32), by the dtype each rounds to (None: the op is absent).

    ``c1``/``c2``: casts before/after the weight and bias; ``w``/``b``/``t``/``u``/``v``: result
    dtypes of ``* weight``, ``+ bias``, ``scale + 1``, ``* (scale + 1)``, ``+ shift``.
    """

    c1: torch.dtype | None = None
    w: torch.dtype | None = None
    b: torch.dtype | None = None
    c2: torch.dtype | None = None
    t: torch.dtype | None = None
    u: torch.dtype | None = None
    v: torch.dtype | None = None


def _dt(t: Tensor | None) -> torch.dtype | None:
    return None if t is None else t.dtype


def _modulate_tail(y_dtype, scale, shift, out_dtype, **tail):
    if scale is None:
        return Tail(**tail), y_dtype
    _, t_dt, u_dt, v_dt, final = result_dtypes(y_dtype, scale.dtype, _dt(shift), None, out_dtype)
    return Tail(**tail, t=t_dt, u=u_dt, v=v_dt if shift is not None else None), final


def rms_norm_tail(x_dtype, weight, scale, shift, out_dtype):
    """(Tail, output dtype) of ``rms_norm``: round_T(w * (x * rstd)), then the modulate."""
    return _modulate_tail(x_dtype, scale, shift, out_dtype, w=torch.float32 if weight is not None else None,
                          c2=x_dtype)


def rms_norm_chain_tail(cast1, weight, bias, cast2, scale, shift, out_dtype):
    """(Tail, output dtype) of ``rms_norm_chain`` under eager's type promotion."""
    h = cast1 or torch.float32
    w_dt = None if weight is None else torch.promote_types(h, weight.dtype)
    h = w_dt or h
    b_dt = None if bias is None else torch.promote_types(h, bias.dtype)
    h = cast2 or b_dt or h
    return _modulate_tail(h, scale, shift, out_dtype, c1=cast1, w=w_dt, b=b_dt, c2=cast2)


# ----------------------------------------------------------------------------------------
# Guards
# ----------------------------------------------------------------------------------------


def _rows(x: Tensor, out_strides, scale: Tensor | None, shift: Tensor | None):
    mods = ((0,) * x.dim() if t is None else t.expand(x.shape).stride() for t in (scale, shift))
    return row_layout(x.shape, x.stride(), *mods, out_strides)


def _check_x(x: Tensor, vec_only: bool) -> str:
    if x.dim() == 0 or x.numel() == 0:
        return "empty input" if x.dim() else "x is a scalar"
    D = x.shape[-1]
    if D > MAX_D or (vec_only and D % VEC):
        what = f"multiples of {VEC} up to {MAX_D}: eager's vectorized RMSNorm" if vec_only else f"up to {MAX_D}"
        return f"D={D} (kernel takes {what})"
    return ""


def _check_param(name: str, p: Tensor | None, D: int, dtype: torch.dtype | None = None, align: int = 1) -> str:
    if p is None:
        return ""
    if p.shape != (D,) or not p.is_contiguous() or (dtype is not None and p.dtype != dtype):
        return f"{name} is not a contiguous [{D}] {dtype or ''} tensor".replace("  ", " ")
    if p.data_ptr() % align:
        return f"{name} is not {align}-byte aligned (eager takes its non-vectorized RMSNorm)"
    return ""


def can_use_rms_norm(x, weight, eps, scale, shift, out_dtype) -> tuple[bool, str]:
    """Whether the Triton kernel reproduces eager's ``_fused_rms_norm`` (+ modulate) bits; else the reason."""
    why = check_device_and_dtypes(x, (weight, scale, shift))
    if not why and out_dtype not in (None,) + KERNEL_DTYPES:
        why = f"unsupported cast (out_dtype {out_dtype})"
    why = why or _check_x(x, vec_only=True)
    align = VEC * x.element_size()
    why = why or _check_param("weight", weight, x.shape[-1], x.dtype, align)
    # Eager normalizes a contiguous x in place of memory, a non-contiguous one from an aligned copy.
    if not why and x.is_contiguous() and x.data_ptr() % align:
        why = f"x is not {align}-byte aligned (eager takes its non-vectorized RMSNorm)"
    why = why or check_broadcast(x.shape, scale=scale, shift=shift)
    if not why and _rows(x, _contiguous(x.shape), scale, shift) is None:
        why = "x's rows span more than 3 strided dims"
    return not why, why


def _check_rope_tables(shape, dim: int, cos: Tensor, sin: Tensor, parts) -> str:
    """'' if cos/sin are fp32 on the parts' device, broadcast to the output ``shape`` with unit stride along D,
    and each part (x, its first position along ``dim``) has rows the kernel can address with its slice of them."""
    device = parts[0][0].device
    if any(t.dtype != torch.float32 or t.device != device for t in (cos, sin)):
        return f"cos/sin are {cos.dtype}/{sin.dtype} on {cos.device}/{sin.device}, not float32 on {device}"
    why = check_broadcast(shape, cos=cos, sin=sin)
    out_strides = _contiguous(shape)
    for x, start in parts:
        c, s = (narrow_rows(t, len(shape), dim, start, x.shape[dim]) for t in (cos, sin))
        if not why and _rows(x, out_strides, c, s) is None:
            why = "x's rows span more than 3 strided dims"
    return why


def can_use_rms_norm_rope(x, weight, eps, cos, sin) -> tuple[bool, str]:
    """``can_use_rms_norm`` for the norm; cos/sin: fp32, broadcast to x over its rows with unit stride along D."""
    ok, why = can_use_rms_norm(x, weight, eps, None, None, None)
    why = why or _check_rope_tables(x.shape, 0, cos, sin, [(x, 0)])
    return not why, why


def cat_shape(x_a: Tensor, x_b: Tensor, dim: int) -> torch.Size:
    shape = list(x_a.shape)
    shape[dim] = x_a.shape[dim] + x_b.shape[dim]
    return torch.Size(shape)


def narrow_rows(t: Tensor, ndim: int, dim: int, start: int, length: int) -> Tensor:
    """``t`` (broadcasting to an ``ndim``-dim output) restricted to output positions [start, start+length) of ``dim``."""
    d = dim - (ndim - t.dim())
    return t if d < 0 or t.shape[d] == 1 else t.narrow(d, start, length)


def can_use_rms_norm_cat_rope(x_a, w_a, eps_a, x_b, w_b, eps_b, dim, cos, sin) -> tuple[bool, str]:
    """Both norms as ``can_use_rms_norm``; the cat along a row dim of same-dtype, same-shape halves; cos/sin as
    ``can_use_rms_norm_rope`` checks them, against the concatenated shape."""
    ok, why = can_use_rms_norm(x_a, w_a, eps_a, None, None, None)
    if ok:
        ok, why = can_use_rms_norm(x_b, w_b, eps_b, None, None, None)
    if ok and (x_a.dtype != x_b.dtype or x_a.device != x_b.device or x_a.dim() != x_b.dim()):
        why = f"halves differ: {x_a.dtype}/{x_b.dtype} on {x_a.device}/{x_b.device}, {x_a.dim()}/{x_b.dim()} dims"
    if not why and not 0 <= dim < x_a.dim() - 1:
        why = f"cat dim {dim} is not a row dim of {x_a.dim()}-dim inputs"
    if not why and any(a != b for i, (a, b) in enumerate(zip(x_a.shape, x_b.shape)) if i != dim):
        why = f"halves {tuple(x_a.shape)} and {tuple(x_b.shape)} differ outside the cat dim"
    why = why or _check_rope_tables(cat_shape(x_a, x_b, dim), dim, cos, sin, [(x_a, 0), (x_b, x_a.shape[dim])])
    return not why, why


def can_use_rms_norm_chain(x, eps, cast1, weight, bias, cast2, scale, shift, out_dtype) -> tuple[bool, str]:
    """Whether the Triton kernel can compute ``rms_norm_chain`` for these inputs; else the reason."""
    why = check_device_and_dtypes(x, (weight, bias, scale, shift))
    if not why and any(c not in (None,) + KERNEL_DTYPES for c in (cast1, cast2, out_dtype)):
        why = f"unsupported cast ({cast1}, {cast2}, {out_dtype})"
    why = why or _check_x(x, vec_only=False)
    why = why or _check_param("weight", weight, x.shape[-1]) or _check_param("bias", bias, x.shape[-1])
    why = why or check_broadcast(x.shape, scale=scale, shift=shift)
    if not why and _rows(x, _like_strides(x), scale, shift) is None:
        why = "x's rows span more than 3 strided dims"
    return not why, why


def _contiguous(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def _like_strides(x: Tensor) -> tuple[int, ...]:
    return torch.empty_like(x, device="meta").stride()


# ----------------------------------------------------------------------------------------
# Dispatch
# ----------------------------------------------------------------------------------------


def _key(t: Tensor | None):
    return None if t is None else (t.dtype, t.shape, t.stride(), t.data_ptr() & 15)


def rms_norm_layout_key(x, weight, eps, scale, shift, out_dtype) -> tuple:
    """Everything the guard and the launch plan depend on (eps is baked into the plan)."""
    return (x.device, _key(x), _key(weight), eps, _key(scale), _key(shift), out_dtype)


def rms_norm_rope_layout_key(x, weight, eps, cos, sin) -> tuple:
    return (x.device, _key(x), _key(weight), eps, _key(cos), _key(sin))


def rms_norm_cat_rope_layout_key(x_a, w_a, eps_a, x_b, w_b, eps_b, dim, cos, sin) -> tuple:
    return (x_a.device, _key(x_a), _key(w_a), eps_a, _key(x_b), _key(w_b), eps_b, dim, _key(cos), _key(sin))


def rms_norm_chain_layout_key(x, eps, cast1, weight, bias, cast2, scale, shift, out_dtype) -> tuple:
    return (x.device, _key(x), eps, cast1, _key(weight), _key(bias), cast2, _key(scale), _key(shift), out_dtype)


def _plan_rms_norm(x, weight, eps, scale, shift, out_dtype, push_fma: bool = True):
    from ..kernels.rms_norm import plan_rms_norm

    tail, final = rms_norm_tail(x.dtype, weight, scale, shift, out_dtype)
    out_strides = _contiguous(x.shape)
    eps = float(torch.finfo(torch.float32).eps) if eps is None else eps
    launch = plan_rms_norm(x, x.shape, out_strides, final, weight, None, eps, scale, shift, tail,
                           _rows(x, out_strides, scale, shift), push_fma=push_fma)
    return lambda x, weight, eps, scale, shift, out_dtype: launch(x, weight, None, scale, shift)[0]


def _plan_rope_part(x, weight, eps, cos, sin, out_strides):
    """The rms_norm_rope kernel for x, writing rows laid out as ``out_strides`` (x's own output or a part of one)."""
    from ..kernels.rms_norm import plan_rms_norm

    tail, final = rms_norm_tail(x.dtype, weight, None, None, None)
    eps = float(torch.finfo(torch.float32).eps) if eps is None else eps
    return plan_rms_norm(x, x.shape, out_strides, final, weight, None, eps, cos, sin, tail,
                         _rows(x, out_strides, cos, sin), rope=True)


def _plan_rms_norm_rope(x, weight, eps, cos, sin):
    launch = _plan_rope_part(x, weight, eps, cos, sin, _contiguous(x.shape))
    return lambda x, weight, eps, cos, sin: launch(x, weight, None, cos, sin)[0]


def _plan_rms_norm_cat_rope(x_a, w_a, eps_a, x_b, w_b, eps_b, dim, cos, sin):
    # Two launches of the rms_norm_rope kernel, each writing its half of one output: the cat is never a pass
    shape = cat_shape(x_a, x_b, dim)
    out_strides = _contiguous(shape)
    parts = []
    for x, w, eps, start in ((x_a, w_a, eps_a, 0), (x_b, w_b, eps_b, x_a.shape[dim])):
        n = x.shape[dim]
        c, s = (narrow_rows(t, len(shape), dim, start, n) for t in (cos, sin))
        parts.append((_plan_rope_part(x, w, eps, c, s, out_strides), start, n))

    def run(x_a, w_a, eps_a, x_b, w_b, eps_b, dim, cos, sin):
        out = torch.empty_strided(shape, out_strides, dtype=x_a.dtype, device=x_a.device)
        for (launch, start, n), x, w in zip(parts, (x_a, x_b), (w_a, w_b)):
            c, s = (narrow_rows(t, len(shape), dim, start, n) for t in (cos, sin))
            launch(x, w, None, c, s, out=out.narrow(dim, start, n))
        return out

    return run


def _plan_rms_norm_chain(x, eps, cast1, weight, bias, cast2, scale, shift, out_dtype):
    from ..kernels.rms_norm import plan_rms_norm

    tail, final = rms_norm_chain_tail(cast1, weight, bias, cast2, scale, shift, out_dtype)
    out_strides = _like_strides(x)
    launch = plan_rms_norm(x, x.shape, out_strides, final, weight, bias, eps, scale, shift, tail,
                           _rows(x, out_strides, scale, shift))
    return lambda x, eps, cast1, weight, bias, cast2, scale, shift, out_dtype: launch(x, weight, bias, scale, shift)[0]


_rms_norm = GuardedKernel("rms_norm", rms_norm_layout_key, can_use_rms_norm, _plan_rms_norm, rms_norm_reference)
_rms_norm_rope = GuardedKernel("rms_norm_rope", rms_norm_rope_layout_key, can_use_rms_norm_rope, _plan_rms_norm_rope,
                               rms_norm_rope_reference)
_rms_norm_cat_rope = GuardedKernel("rms_norm_cat_rope", rms_norm_cat_rope_layout_key, can_use_rms_norm_cat_rope,
                                   _plan_rms_norm_cat_rope, rms_norm_cat_rope_reference)
_rms_norm_chain = GuardedKernel("rms_norm_chain", rms_norm_chain_layout_key, can_use_rms_norm_chain,
                                _plan_rms_norm_chain, rms_norm_chain_reference)

_lib = torch.library.Library("diffusion_fuse", "FRAGMENT")
_lib.define("rms_norm(Tensor x, Tensor? weight, float? eps, Tensor? scale, Tensor? shift, ScalarType? out_dtype) "
            "-> Tensor")
_lib.define("rms_norm_chain(Tensor x, float eps, ScalarType? cast1, Tensor? weight, Tensor? bias, ScalarType? cast2, "
            "Tensor? scale, Tensor? shift, ScalarType? out_dtype) -> Tensor")
impl(_lib, "rms_norm", _rms_norm)
impl(_lib, "rms_norm_chain", _rms_norm_chain)
_lib.define("rms_norm_rope(Tensor x, Tensor? weight, float? eps, Tensor cos, Tensor sin) -> Tensor")
impl(_lib, "rms_norm_rope", _rms_norm_rope)
_lib.define("rms_norm_cat_rope(Tensor x_a, Tensor? w_a, float? eps_a, Tensor x_b, Tensor? w_b, float? eps_b, int dim, "
            "Tensor cos, Tensor sin) -> Tensor")
impl(_lib, "rms_norm_cat_rope", _rms_norm_cat_rope)


@torch.library.register_fake("diffusion_fuse::rms_norm", lib=_lib)
def _(x, weight, eps, scale, shift, out_dtype):
    return x.new_empty(x.shape, dtype=rms_norm_tail(x.dtype, weight, scale, shift, out_dtype)[1])


@torch.library.register_fake("diffusion_fuse::rms_norm_chain", lib=_lib)
def _(x, eps, cast1, weight, bias, cast2, scale, shift, out_dtype):
    return torch.empty_like(x, dtype=rms_norm_chain_tail(cast1, weight, bias, cast2, scale, shift, out_dtype)[1])


@torch.library.register_fake("diffusion_fuse::rms_norm_rope", lib=_lib)
def _(x, weight, eps, cos, sin):
    return x.new_empty(x.shape)


@torch.library.register_fake("diffusion_fuse::rms_norm_cat_rope", lib=_lib)
def _(x_a, w_a, eps_a, x_b, w_b, eps_b, dim, cos, sin):
    return x_a.new_empty(cat_shape(x_a, x_b, dim))
