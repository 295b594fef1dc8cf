"""What eager computes for each ATen pointwise op the pointwise pass fuses: the numerics contract.

Every fused group becomes one Triton kernel (kernels/pointwise.py) that evaluates the
group's ops element by element, in fp32 registers, rounding where eager rounds. For each op
eager launches one CUDA kernel (TensorIterator, ``gpu_kernel``) that, per element:

1. loads every *tensor* operand and converts it to the op's common dtype (an fp32 0-dim tensor
   in a bf16 op is rounded to bf16 first: ``fetch_and_cast``), then to ``opmath`` (fp32 for
   bf16/fp16/fp32);
2. takes a *Python scalar* operand (a CPU scalar: ``iter.scalar_value<opmath_t>``) straight
   in fp32 (the double rounded once to float), never rounded to bf16;
3. computes the op's expression in fp32 as nvcc compiled it (no fast-math: IEEE ``/``,
   libdevice ``expf``/``tanhf``/``erff``/``sinf``/``cosf``/``rsqrtf``; FMA contraction ON, so
   ``a*b + c`` inside one op may be one FMA: the recipes below say where);
4. rounds the result once to the output dtype (round to nearest even; ``cvt.rn``).

The kernels reproduce that: every value lives in fp32 holding exactly a value of its node's
dtype; operands are rounded to the common dtype where (1) says; each recipe's expression is
emitted as separate fp32 operations (launched with ``enable_fp_fusion=False``, so only the
explicit ``tl.fma`` are FMAs, and ``/`` is ``div_rn``; libdevice without its FTZ reflect,
``Variants.reflect_ftz``); the result is rounded to the node's dtype. One exception computes nothing:
a LUT16_OPS op from bf16 to bf16 in a flat kernel is looked up in a table of eager's own outputs for
all 65,536 bf16 inputs (kernels/lut16.py; ``Variants.lut16``), whatever its recipe below. Recipes,
per op (``x``, ``a``, ``b`` fp32 operands; ``s`` a scalar as fp32):

=========================== =================================================================
op                          fp32 expression (source: aten/src/ATen/native/cuda/...)
=========================== =================================================================
add / sub (alpha 1)         ``a + b`` / ``a - b``; ``a + alpha*b`` with alpha 1 is exact either
                            way (BinaryAddSubKernel: AddFunctor, opmath)
rsub.Scalar (alpha 1)       ``s - x``
addcmul (value 1)           ``fma(b, c, a)``: eager's ``a + alpha * b * c`` in opmath, whose last
                            multiply and the add nvcc contracts to one FMA; ``alpha * b`` is exact at
                            alpha 1 (PointwiseOpsKernel.cu: addcmul_cuda_kernel; measured on the GPU,
                            where the rounded-product form differs)
mul                         ``a * b`` (BinaryMulKernel)
div (tensor divisor)        ``div_rn(a, b)`` (BinaryDivTrueKernel: DivFunctor)
div (Python scalar divisor) ``a * r`` with ``r = fp32(1) / fp32(s)`` computed on the host
                            (BinaryDivTrueKernel: "a * reciprocal(b)" for a CPU scalar)
neg                         ``-x`` as PTX ``neg.f32`` (inline asm): what nvcc emits for C++ ``-a``
                            (variant ``neg="xor"``: the sign bit flipped, NaN payload kept)
_to_copy / clone            the value, rounded to the new dtype (Copy.cu: static_cast)
exp, sin, cos, tanh         libdevice ``__nv_expf`` ... on fp32 (UnaryOpsKernel: std::exp(opmath))
rsqrt                       libdevice ``__nv_rsqrtf`` (``rsqrt.approx.f32``) (::rsqrt(float))
sqrt                        ``sqrt_rn`` (std::sqrt(float), IEEE without fast-math)
reciprocal                  ``div_rn(1, x)``
sigmoid                     ``div_rn(1, 1 + expf(-x))`` (UnarySpecialOpsKernel, opmath)
silu                        ``div_rn(x, 1 + expf(-x))`` (ActivationSiluKernel)
gelu (none)                 ``(x * 0.5) * (1 + erff(x * fp32(M_SQRT1_2)))`` (ActivationGeluKernel);
                            not fused: ``__nv_erff`` differs on the H200 (ERF_NOT_REPRODUCED)
gelu (tanh)                 ``c = (x*x)*x``; ``inner = kBeta * fma(kKappa, c, x)`` (nvcc contracts
                            ``x + kKappa*c``; variant ``gelu_tanh_fma=False``: two roundings);
                            ``(0.5*x) * (1 + tanhf(inner))``; kBeta = fp32(M_SQRT2*M_2_SQRTPI*0.5),
                            kKappa = fp32(0.044715)
relu                        ``x`` if NaN else ``max(x, 0)`` (clamp_min, opmath)
clamp / clamp_min/max       NaN stays; else ``min(max(x, lo), hi)`` with fp32 bounds
                            (TensorCompare.cu launch_clamp_scalar: bounds in opmath)
pow.Tensor_Scalar(x, 2)     ``x * x`` (PowKernel: exponent 2 specialization)
where(c, a, b)              ``a`` if c else ``b``, both at the common dtype
mul (complex tensors)       ``fma(a, c, -(b*d))`` + ``fma(a, d, b*c)`` i (``complex_mul``, the
                            components as fp32 pairs, fp64 for complex128: in through
                            view_as_complex or a complex input, out through view_as_real)
                            (BinaryMulKernel, c10::complex<float> / <double>)
_to_copy from fp64          to fp32, then to the output dtype (a double to c10::BFloat16 goes
                            through float: two roundings); fp64 values only narrow
cat, stack                  the selected input, converted to the output dtype
=========================== =================================================================

Not reproduced (the op stays an eager op): integer tensors, fp64 arithmetic, ``alpha != 1``, addcmul's ``value != 1``
(its FMA rounds alpha's product once), ``pow`` with
other exponents (bf16 ``x*x*x`` rounds between the products), division with a rounding mode,
non-finite scalars. Which libdevice function equals eager's on the GPU, and whether nvcc
contracted gelu-tanh's inner product, is decided by ``tests/gpu/test_pointwise_gpu.py`` (the
``Variants`` below are the candidates; the default is the expected one).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.fx as fx

from . import triton_interpret
from .optional_triton import tl, triton

aten = torch.ops.aten

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True)
class Variants:
    """Candidate numerics where the source alone does not settle what nvcc emitted."""

    gelu_tanh_fma: bool = True  # x + kKappa*x^3 contracted to one FMA
    addcmul_fma: bool = True  # addcmul as fma(b, c, a), the product unrounded (False: the product rounded)
    # fp32 negation: "asm" is PTX ``neg.f32``, what nvcc emits for C++ ``-a`` (ptxas then picks the
    # instruction); "xor" flips the sign bit, which keeps a NaN's payload where the H200's eager
    # neg does not (3 of 3 NaNs differ). (Triton's own ``-x`` and even ``-0.0 - x`` are ``0 - x``:
    # the literal's minus is Triton's unary minus too, so +0 gives +0.)
    neg: str = "asm"
    # compile with FMA contraction on (as nvcc does by default). Off in every shipped kernel (a fused
    # group would contract across ops); a candidate for libdevice functions whose bitcode leaves
    # mul + add pairs to the code generator (erff: see ERF_NOT_REPRODUCED)
    fp_fusion: bool = False
    # libdevice built with its flush-to-zero reflect on (Triton's default, ``enable_reflect_ftz``): then
    # __nv_tanhf and __nv_sinf flush a subnormal input and __nv_rsqrtf is rsqrt.approx.ftz (all 2**23 - 1
    # subnormals of each sign differ from eager on the H200: tests/gpu/test_pointwise_gpu.py
    # ::test_subnormal_inputs_per_variant). Off (the default, as in launch.EAGER_NUMERICS) is what nvcc
    # builds eager's kernels with (no -ftz): every subnormal input of every libdevice op is eager's.
    reflect_ftz: bool = False
    # 16-bit unary ops (LUT16_OPS) on a bf16 input, rounded to bf16, looked up in eager's own output table
    # (kernels/lut16.py): exact by construction, and fewer sm_90 instructions per element than the recipe
    # (tests/kernels/test_compile_sm90.py::test_lut16_gelu_takes_fewer_instructions_than_its_recipe)
    lut16: bool = True


DEFAULT_VARIANTS = Variants()


def f32(x: float) -> float:
    """``x`` rounded to fp32 (round to nearest even), as a Python float that holds it exactly."""
    return float(np.float32(x))


def lit(x: float) -> str:
    """A Triton literal for an fp32 value (exact: the repr of an fp32 value parses back to it)."""
    v = f32(x)
    if not math.isfinite(v):
        raise ValueError(f"non-finite constant {x!r}")
    return repr(v)


# Constants as eager's kernels build them: the double expression, then static_cast<float>.
GELU_TANH_BETA = f32(1.41421356237309504880 * 1.12837916709551257390 * 0.5)  # M_SQRT2*M_2_SQRTPI*0.5
GELU_TANH_KAPPA = f32(0.044715)
GELU_ERF_ALPHA = f32(0.70710678118654752440)  # M_SQRT1_2


@dataclasses.dataclass(frozen=True)
class Val:
    """A value in the kernel: fp32 code (a variable or literal) holding a value of ``dtype``."""

    code: str
    dtype: torch.dtype


class Emit:
    """What recipes emit into: fp32 temporaries (common subexpressions shared)."""

    def tmp(self, expr: str) -> str:  # pragma: no cover - implemented by the code generator
        raise NotImplementedError


Operand = Val | float | int


def _is_scalar(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def to_common(em: Emit, v: Operand, common: torch.dtype) -> str:
    """An operand as the op's kernel sees it: a tensor converted to ``common``, a scalar in fp32."""
    if not isinstance(v, Val):
        return lit(v)
    if v.dtype == common or common == torch.float32 or v.dtype == torch.bool:
        return v.code  # narrower float types are exact in fp32
    return em.tmp(round_code(v.code, common))


def round_code(code: str, dtype: torch.dtype) -> str:
    """fp32 ``code`` rounded to ``dtype`` (nearest even), back in fp32."""
    if dtype == torch.bfloat16:
        return f"{code}.to(tl.bfloat16).to(tl.float32)"
    if dtype == torch.float16:
        return f"{code}.to(tl.float16).to(tl.float32)"
    return code


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One ATen op: which calls it takes (``check``: '' or why not) and its fp32 expression."""

    name: str
    tensor_args: tuple[int, ...]  # positions of the operands (tensors or scalars)
    build: Callable[[Emit, fx.Node, list[str], Variants], str]
    check: Callable[[fx.Node], str] = lambda n: ""
    selects: bool = False  # the result is one of its (converted) operands: no rounding after it


def _alpha_one(n: fx.Node) -> str:
    alpha = n.kwargs.get("alpha", 1)
    return "" if alpha == 1 else f"alpha={alpha!r} (only 1 is reproduced)"


def _value_one(n: fx.Node) -> str:
    value = n.kwargs.get("value", 1)
    return "" if value == 1 else f"value={value!r} (only 1 is reproduced)"


def _div_check(n: fx.Node) -> str:
    if n.kwargs.get("rounding_mode") is not None:
        return "div with a rounding mode"
    if _is_scalar(n.args[1]) and float(n.args[1]) == 0.0:
        return "division by a scalar zero"
    return _finite_scalars(n)


# The H200 run of tests/gpu/test_pointwise_gpu.py (torch 2.11, Triton 3.6): gelu (erf) differs from
# eager in 90 / 145 / 1231 of 196,608 bf16 / fp16 / fp32 elements with libdevice's __nv_erff; exp,
# sin, cos and tanh from the same libdevice are exact. Compiled with FMA contraction the counts are the
# same; the differences sit at x ~ -2..-3, where 1 + erf(x/sqrt2) cancels: the two erff differ by an
# ulp there. Until a variant matches, erf stays eager.
ERF_NOT_REPRODUCED = "erf: libdevice __nv_erff differs from eager's erff on the H200 (not reproduced)"


def _gelu_check(n: fx.Node) -> str:
    approximate = n.kwargs.get("approximate", "none")
    if approximate == "none":
        return ERF_NOT_REPRODUCED
    return "" if approximate == "tanh" else "unknown gelu approximation"


def _pow_check(n: fx.Node) -> str:
    return "" if _is_scalar(n.args[1]) and float(n.args[1]) == 2.0 else f"pow exponent {n.args[1]!r} (only 2)"


def clamp_bounds(n: fx.Node) -> tuple[object, object]:
    """(lo, hi) of a clamp / clamp_min / clamp_max call (None: no bound)."""
    if n.target is aten.clamp_min.default:
        return n.args[1] if len(n.args) > 1 else n.kwargs.get("min"), None
    if n.target is aten.clamp_max.default:
        return None, n.args[1] if len(n.args) > 1 else n.kwargs.get("max")
    lo = n.args[1] if len(n.args) > 1 else n.kwargs.get("min")
    hi = n.args[2] if len(n.args) > 2 else n.kwargs.get("max")
    return lo, hi


def _clamp_check(n: fx.Node) -> str:
    bounds = [b for b in clamp_bounds(n) if b is not None]
    if not all(_is_scalar(b) and math.isfinite(float(b)) for b in bounds):
        return "clamp bounds are not finite Python scalars"
    return ""


def _copy_check(n: fx.Node) -> str:
    kwargs = dict(n.kwargs)
    kwargs.pop("dtype", None)
    kwargs.pop("device", None)  # same device: checked by the pass on the values
    kwargs.pop("non_blocking", None)
    if kwargs.pop("layout", torch.strided) != torch.strided:
        return "layout change"
    if kwargs.pop("pin_memory", None):
        return "pin_memory"
    if kwargs.pop("memory_format", None) not in (None, torch.preserve_format, torch.contiguous_format):
        return "memory format"
    return f"unexpected kwargs {sorted(kwargs)}" if kwargs else ""


def _copy_into_check(n: fx.Node) -> str:
    return "copy with non_blocking" if (n.args[2] if len(n.args) > 2 else n.kwargs.get("non_blocking", False)) else ""


def _gelu(em: Emit, n: fx.Node, a: list[str], var: Variants) -> str:
    x = a[0]
    if n.kwargs.get("approximate", "none") == "tanh":
        sq = em.tmp(f"{x} * {x}")
        cube = em.tmp(f"{sq} * {x}")
        kappa, beta = lit(GELU_TANH_KAPPA), lit(GELU_TANH_BETA)
        if var.gelu_tanh_fma:
            s = em.tmp(f"tl.fma({kappa}, {cube}, {x})")
        else:
            s = em.tmp(f"{x} + {em.tmp(f'{kappa} * {cube}')}")
        t = em.tmp(f"libdevice.tanh({em.tmp(f'{beta} * {s}')})")
        half = em.tmp(f"0.5 * {x}")
        return f"{half} * {em.tmp(f'1.0 + {t}')}"
    scaled = em.tmp(f"{x} * {lit(GELU_ERF_ALPHA)}")
    e = em.tmp(f"libdevice.erf({scaled})")
    half = em.tmp(f"{x} * 0.5")
    return f"{half} * {em.tmp(f'1.0 + {e}')}"


def neg_code(x: str, var: Variants, dtype: torch.dtype = torch.float32) -> str:
    """``-x`` as C++ negates a float (or, ``dtype`` float64, a double). (Triton's unary minus is ``0 - x``: +0 for
    +0, not -0.)"""
    wide = dtype == torch.float64
    # Triton's interpreter runs no inline PTX: there the sign flip, equal to neg.f32 but on NaN
    if var.neg == "xor" or triton_interpret():
        if wide:
            return f"({x}.to(tl.int64, bitcast=True) ^ -9223372036854775808).to(tl.float64, bitcast=True)"
        return f"({x}.to(tl.int32, bitcast=True) ^ -2147483648).to(tl.float32, bitcast=True)"
    if wide:
        return f'tl.inline_asm_elementwise("neg.f64 $0, $1;", "=d,d", [{x}], dtype=tl.float64, is_pure=True, pack=1)'
    return f'tl.inline_asm_elementwise("neg.f32 $0, $1;", "=f,f", [{x}], dtype=tl.float32, is_pure=True, pack=1)'


def complex_mul(em: Emit, a: str, b: str, c: str, d: str, var: Variants,
                dtype: torch.dtype = torch.float32) -> tuple[str, str]:
    """``(a + bi) * (c + di)`` as eager's CUDA kernel computes it: ``c10::complex<T>``'s ``real = a*c - b*d``,
    ``imag = a*d + b*c`` as nvcc contracted them, ``fma(a, c, -(b*d))`` and ``fma(a, d, b*c)`` (of nine candidate
    formulas the one that gives eager's bits for complex64 on the H200: tests/gpu/test_pointwise_gpu.py's
    ``qwen_rope_cat`` chain holds the kernel to it; its ``lumina_rope`` chain holds the complex128 one, the same
    template on doubles). ``dtype``: the components' (float32, or float64 for complex128)."""
    bd, bc = em.tmp(f"{b} * {d}"), em.tmp(f"{b} * {c}")
    return f"tl.fma({a}, {c}, {em.tmp(neg_code(bd, var, dtype))})", f"tl.fma({a}, {d}, {bc})"


def _neg(em: Emit, n: fx.Node, a: list[str], var: Variants) -> str:
    return neg_code(a[0], var)


def _silu(em: Emit, n: fx.Node, a: list[str], var: Variants) -> str:
    e = em.tmp(f"libdevice.exp({em.tmp(neg_code(a[0], var))})")
    return f"tl.math.div_rn({a[0]}, {em.tmp(f'1.0 + {e}')})"


def _sigmoid(em: Emit, n: fx.Node, a: list[str], var: Variants) -> str:
    e = em.tmp(f"libdevice.exp({em.tmp(neg_code(a[0], var))})")
    return f"tl.math.div_rn(1.0, {em.tmp(f'1.0 + {e}')})"


def _nan_kept(x: str, expr: str) -> str:
    return f"tl.where({x} != {x}, {x}, {expr})"


def _relu(em: Emit, n: fx.Node, a: list[str], var: Variants) -> str:
    return _nan_kept(a[0], f"tl.maximum({a[0]}, 0.0)")


def _clamp(em: Emit, n: fx.Node, a: list[str], var: Variants) -> str:
    x, (lo, hi) = a[0], clamp_bounds(n)
    v = x
    if lo is not None:
        v = em.tmp(f"tl.maximum({v}, {lit(lo)})")
    if hi is not None:
        v = em.tmp(f"tl.minimum({v}, {lit(hi)})")
    return _nan_kept(x, v)


def _div(em: Emit, n: fx.Node, a: list[str], var: Variants) -> str:
    divisor = n.args[1]
    if _is_scalar(divisor):  # eager multiplies by the fp32 reciprocal, computed on the host
        return f"{a[0]} * {lit(np.float32(1.0) / np.float32(divisor))}"
    return f"tl.math.div_rn({a[0]}, {a[1]})"


def _addcmul(em: Emit, n: fx.Node, a: list[str], var: Variants) -> str:
    if var.addcmul_fma:
        return f"tl.fma({a[1]}, {a[2]}, {a[0]})"
    return f"{a[0]} + {em.tmp(f'{a[1]} * {a[2]}')}"


def _binary(sym: str) -> Callable[[Emit, fx.Node, list[str], Variants], str]:
    return lambda em, n, a, var: f"{a[0]} {sym} {a[1]}"


def _unary(fmt: str) -> Callable[[Emit, fx.Node, list[str], Variants], str]:
    return lambda em, n, a, var: fmt.format(x=a[0])


def _where(em: Emit, n: fx.Node, a: list[str], var: Variants) -> str:
    return f"tl.where({a[0]}, {a[1]}, {a[2]})"


def _finite_scalars(n: fx.Node) -> str:
    for x in n.args:
        if _is_scalar(x) and not math.isfinite(float(x)):
            return f"non-finite scalar {x!r}"
    return ""


def _both(*checks: Callable[[fx.Node], str]) -> Callable[[fx.Node], str]:
    def check(n: fx.Node) -> str:
        for c in checks:
            why = c(n)
            if why:
                return why
        return ""

    return check


_BIN = _both(_alpha_one, _finite_scalars)
RECIPES: dict[object, Recipe] = {
    aten.add.Tensor: Recipe("add", (0, 1), _binary("+"), _BIN),
    aten.add.Scalar: Recipe("add", (0, 1), _binary("+"), _BIN),
    aten.sub.Tensor: Recipe("sub", (0, 1), _binary("-"), _BIN),
    aten.sub.Scalar: Recipe("sub", (0, 1), _binary("-"), _BIN),
    aten.rsub.Scalar: Recipe("rsub", (0, 1), lambda em, n, a, v: f"{a[1]} - {a[0]}", _BIN),
    aten.addcmul.default: Recipe("addcmul", (0, 1, 2), _addcmul, _value_one),
    aten.mul.Tensor: Recipe("mul", (0, 1), _binary("*"), _finite_scalars),
    aten.mul.Scalar: Recipe("mul", (0, 1), _binary("*"), _finite_scalars),
    aten.div.Tensor: Recipe("div", (0, 1), _div, _div_check),
    aten.div.Scalar: Recipe("div", (0, 1), _div, _div_check),
    aten.neg.default: Recipe("neg", (0,), _neg, selects=True),
    aten.exp.default: Recipe("exp", (0,), _unary("libdevice.exp({x})")),
    aten.sin.default: Recipe("sin", (0,), _unary("libdevice.sin({x})")),
    aten.cos.default: Recipe("cos", (0,), _unary("libdevice.cos({x})")),
    aten.tanh.default: Recipe("tanh", (0,), _unary("libdevice.tanh({x})")),
    aten.rsqrt.default: Recipe("rsqrt", (0,), _unary("libdevice.rsqrt({x})")),
    aten.sqrt.default: Recipe("sqrt", (0,), _unary("tl.math.sqrt_rn({x})")),
    aten.reciprocal.default: Recipe("reciprocal", (0,), _unary("tl.math.div_rn(1.0, {x})")),
    aten.sigmoid.default: Recipe("sigmoid", (0,), _sigmoid),
    aten.silu.default: Recipe("silu", (0,), _silu),
    aten.gelu.default: Recipe("gelu", (0,), _gelu, _gelu_check),
    aten.relu.default: Recipe("relu", (0,), _relu, selects=True),
    aten.clamp.default: Recipe("clamp", (0,), _clamp, _clamp_check),
    aten.clamp_min.default: Recipe("clamp_min", (0,), _clamp, _clamp_check),
    aten.clamp_max.default: Recipe("clamp_max", (0,), _clamp, _clamp_check),
    aten.pow.Tensor_Scalar: Recipe("pow", (0,), _unary("{x} * {x}"), _pow_check),
    aten.where.self: Recipe("where", (0, 1, 2), _where, selects=True),
    aten._to_copy.default: Recipe("_to_copy", (0,), _unary("{x}"), _copy_check, selects=True),
    aten.clone.default: Recipe("clone", (0,), _unary("{x}"), _copy_check, selects=True),
    # the functional form of ``dst.copy_(src)`` (a write into a slice): src broadcast to dst and converted to its dtype
    aten.copy.default: Recipe("copy", (1,), _unary("{x}"), _copy_into_check, selects=True),
}


# Unary ops whose bf16 -> bf16 form the code generator looks up in eager's output table (kernels/lut16.py)
# when Variants.lut16 is on and the kernel is flat: eager's op on all 65,536 bf16 patterns builds the table on
# the kernel's device. erf's gelu is exact only so (``lookup_only``): its recipe is ERF_NOT_REPRODUCED.
LUT16_OPS = frozenset({aten.gelu.default, aten.silu.default, aten.sigmoid.default, aten.tanh.default,
                       aten.exp.default})


def lookup_only(n: fx.Node) -> bool:
    """``n``'s recipe is not exact, its bf16 -> bf16 table is: erf's gelu (nn.GELU()'s default form)."""
    return n.target is aten.gelu.default and n.kwargs.get("approximate", "none") == "none"


def recipe_operands(n: fx.Node, r: Recipe) -> Sequence[object]:
    """The operands of ``n`` in recipe order (tensors as fx nodes, scalars as numbers)."""
    return [n.args[i] for i in r.tensor_args]


# ---------------------------------------------------------------------------------------------
# Triton's interpreter has no libdevice: generated kernels import this stand-in there
# (tl.math's fp32 functions; numerics differ, which the interpreter tests allow for).
# ---------------------------------------------------------------------------------------------
@triton.jit
def _interp_exp(x):
    return tl.math.exp(x)


@triton.jit
def _interp_sin(x):
    return tl.math.sin(x)


@triton.jit
def _interp_cos(x):
    return tl.math.cos(x)


@triton.jit
def _interp_erf(x):
    return tl.math.erf(x)


@triton.jit
def _interp_rsqrt(x):
    return tl.math.rsqrt(x)


@triton.jit
def _interp_tanh(x):
    return 2.0 / (1.0 + tl.math.exp(-2.0 * x)) - 1.0


def interpreter_libdevice():
    """A namespace with the libdevice functions the recipes call, for the interpreter."""
    import types

    return types.SimpleNamespace(exp=_interp_exp, sin=_interp_sin, cos=_interp_cos, erf=_interp_erf,
                                 rsqrt=_interp_rsqrt, tanh=_interp_tanh)
