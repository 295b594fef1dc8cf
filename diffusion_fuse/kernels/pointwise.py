"""Code generation for ``diffusion_fuse::pointwise``: one Triton kernel per fused group and input layout.

A group (fxpasses/pointwise.py) is a small ATen graph of pointwise ops, the views between
them, ``cat``/``stack`` and copies. For one layout of its inputs (shapes, strides, dtypes,
known on the first call) this module writes a Triton kernel that computes every output of the
group in one pass:

* the iteration space is the outputs' element count; program ``p`` covers flat indices
  ``f = p*BLOCK + arange(BLOCK)``; each output unravels ``f`` in its own shape (row-major) and
  stores at its own strides (those eager gives it, from fake-tensor propagation);
* tiled, when that flat order would read or write some tensor with a stride (a transpose:
  SANA's linear attention reads q/k/v and writes its output across heads): the outputs' common
  shape is walked as ``[BY, BX]`` tiles of two of its dimensions, ``x`` along the one the first
  output is contiguous in, ``y`` along the one the strided accesses are contiguous in, and the
  program id ``z`` over the rest. Each load and store is then contiguous along ``x`` or ``y``;
  Triton gives each its own layout and moves values between them through shared memory.
  ``choose_layout`` generates the flat kernel and each tiling and keeps the one with the fewest
  bytes accessed with a stride (the flat one on a tie), and logs (INFO) a kernel it leaves reading
  at a stride. Masked lanes past the edge tiles compute offsets beyond a tensor's end: where those
  could wrap int32, the tiles index in int64 rather than give the tiling up to a flat kernel (which
  reads a channels-last GLU's input at a stride of its channels);
* a single ``cat`` output whose every program's ``BLOCK`` of indices lies in one input (the
  inputs' extents along the cat dimension are multiples of ``BLOCK``, as FLUX's single-block
  ``cat([attn, gelu(mlp)], 2)`` at widths 3072 + 12288) branches once per program on that input
  (``_uniform_cat``): one unmasked-by-branch load, and only that input's chain computed. Otherwise
  each lane selects its input and every input's chain runs on every lane (gelu on the attention's
  lanes too), which is slower;
* RoPE reads pairs (``x.unflatten(-1, (-1, 2)).unbind(-1)``) at the pair's index, each element in
  every branch of the ``stack`` that rotates them: in the flat kernel lanes 2p and 2p + 1 hold one
  pair, so each lane loads its own element (contiguous) and takes its partner from the neighbouring
  lane in registers (``_paired``), once per value, instead of loads at stride 2 per element and branch;
* a node's value at a multi-index is an fp32 expression: views map the index to their input's
  index (no copy), compute nodes apply their recipe (kernels/pointwise_ops.py, the numerics
  contract) to their operands at the broadcast index, ``cat``/``stack`` select an input by the
  index along their dimension (loads masked to the selected input), inputs are loaded at their
  strides;
* indices are symbolic ``sum(c * (f // div % mod)) + const`` expressions, simplified so that a
  view of a view of contiguous data loads at ``f`` again (vectorized); common subexpressions
  are emitted once.

The generated source is written to a cache directory (Triton reads kernel source from a file)
and named by its hash, so equal groups share one kernel and Triton's on-disk cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import math
import operator
import os
import threading
from collections.abc import Callable, Sequence

import torch
import torch.fx as fx

from ..config import cache_root
from ..log import get_logger
from . import triton_interpret
from .mean_square import MIN_ROWS, mean_factor, row_sum_form
from .optional_triton import triton
from .pointwise_ops import (
    DEFAULT_VARIANTS,
    FLOAT_DTYPES,
    LUT16_OPS,
    RECIPES,
    Emit,
    Val,
    Variants,
    complex_mul,
    lit,
    lookup_only,
    round_code,
    to_common,
)

aten = torch.ops.aten
_log = get_logger("pointwise")
BLOCK = 1024
# A kernel that looks a 16-bit op up in a table (kernels/lut16.py) fills the table into shared memory once per
# program: larger programs amortize it (8192 elements over 16 warps run a gelu-tanh lookup at an SM copy's speed)
LUT_BLOCK, LUT_WARPS = 8192, 16
CAT_ROWS = LUT_BLOCK // BLOCK  # rows of a row-tiled program (Generator._cat_row_tiles): LUT_BLOCK elements
NUM_WARPS = 4
TILE_X, TILE_Y = 64, 32  # tiled kernels: 2048 elements per program; a row of 64 bf16 / 32 fp32 is 128 bytes
_MIN_RUN = 16  # elements an access must have contiguous along the fast index to count as coalesced
_TL_DTYPE = {torch.float32: "tl.float32", torch.bfloat16: "tl.bfloat16", torch.float16: "tl.float16"}


class Unsupported(Exception):
    """The group cannot be generated for this layout (the reference path runs instead)."""


# ---------------------------------------------------------------------------------------------
# index algebra
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, order=True)
class Term:
    """``var // div % mod`` (``mod == 0``: no modulo)."""

    var: str
    div: int
    mod: int

    def code(self) -> str:
        s = self.var if self.div == 1 else f"{self.var} // {self.div}"
        return s if self.mod == 0 else f"{s} % {self.mod}"


@dataclasses.dataclass(frozen=True)
class Lin:
    """``sum(coeff * term) + const`` over non-negative integer terms."""

    terms: tuple[tuple[Term, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(term: Term) -> Lin:
        return Lin(((term, 1),))

    def is_const(self) -> bool:
        return not self.terms

    def pure(self) -> Term | None:
        """The term itself if this is exactly one term with coefficient 1 and no constant."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and self.const == 0:
            return self.terms[0][0]
        return None

    def __add__(self, other: Lin | int) -> Lin:
        if isinstance(other, int):
            return Lin(self.terms, self.const + other)
        acc: dict[Term, int] = dict(self.terms)
        for t, c in other.terms:
            acc[t] = acc.get(t, 0) + c
        return _simplify(acc, self.const + other.const)

    def scale(self, k: int) -> Lin:
        if k == 0:
            return Lin()
        return Lin(tuple((t, c * k) for t, c in self.terms), self.const * k)

    def code(self) -> str:
        parts = [t.code() if c == 1 else f"({t.code()}) * {c}" for t, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


def _simplify(acc: dict[Term, int], const: int) -> Lin:
    """Merge ``c*(v//d % m) + c*m*(v//(d*m) % m2)`` into ``c*(v//d % (m*m2))`` until nothing changes."""
    acc = {t: c for t, c in acc.items() if c}
    changed = True
    while changed:
        changed = False
        for t1, c1 in list(acc.items()):
            if t1.mod == 0:
                continue
            for t2, c2 in list(acc.items()):
                if t2 is t1 or t2.var != t1.var or t2.div != t1.div * t1.mod or c2 != c1 * t1.mod:
                    continue
                del acc[t1], acc[t2]
                merged = Term(t1.var, t1.div, 0 if t2.mod == 0 else t1.mod * t2.mod)
                acc[merged] = acc.get(merged, 0) + c1
                changed = True
                break
            if changed:
                break
    return Lin(tuple(sorted(acc.items())), const)


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    out, acc = [0] * len(shape), 1
    for k in range(len(shape) - 1, -1, -1):
        out[k] = acc
        acc *= shape[k]
    return out


def flatten(idx: Sequence[Lin], strides: Sequence[int], shape: Sequence[int]) -> Lin:
    out = Lin()
    for i, s, n in zip(idx, strides, shape):
        if n != 1:
            out = out + i.scale(s)
    return out


# ---------------------------------------------------------------------------------------------
# views: the index of a view's input for an index of the view
# ---------------------------------------------------------------------------------------------
def _norm_dim(d: int, ndim: int) -> int:
    return d % ndim if ndim else 0


def _arg(n: fx.Node, i: int, name: str, default=None):
    return n.args[i] if len(n.args) > i else n.kwargs.get(name, default)


def _slice_start(n: fx.Node, size: int) -> int:
    start = _arg(n, 2, "start", 0)
    start = 0 if start is None else start
    start = start + size if start < 0 else start
    return min(max(start, 0), size)


def _squeezed_dims(n: fx.Node, in_shape: Sequence[int]) -> set[int]:
    nd = len(in_shape)
    if n.target is aten.squeeze.default:
        dims = range(nd)
    elif n.target is aten.squeeze.dim:
        dims = [n.args[1]]
    else:
        dims = n.args[1]
    return {_norm_dim(d, nd) for d in dims if in_shape[_norm_dim(d, nd)] == 1}


def view_input_index(gen: Generator, n: fx.Node, idx: list[Lin]) -> tuple[fx.Node, list[Lin]]:
    """(input node, its index) for view node ``n`` at ``idx``."""
    t = n.target
    if t is operator.getitem:
        parent, k = n.args
        x = parent.args[0]
        in_shape = gen.shape(x)
        dim = _norm_dim(_arg(parent, 1 if parent.target is aten.unbind.int else 2, "dim", 0), len(in_shape))
        if parent.target is aten.unbind.int:
            return x, idx[:dim] + [Lin((), k)] + idx[dim:]
        if parent.target is aten.split.Tensor:
            offset = parent.args[1] * k
        else:  # split_with_sizes
            offset = sum(parent.args[1][:k])
        return x, idx[:dim] + [idx[dim] + offset] + idx[dim + 1:]
    x = n.args[0]
    in_shape, out_shape = gen.shape(x), gen.shape(n)
    if t in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
        return x, gen.unravel(flatten(idx, contiguous_strides(out_shape), out_shape), in_shape)
    if t in (aten.alias.default, aten.detach.default):
        return x, idx
    if t is aten.unsqueeze.default:
        d = _norm_dim(n.args[1], len(out_shape))
        return x, idx[:d] + idx[d + 1:]
    if t in (aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims):
        gone, it, out = _squeezed_dims(n, in_shape), iter(idx), []
        for k in range(len(in_shape)):
            out.append(Lin() if k in gone else next(it))
        return x, out
    if t is aten.expand.default:
        lead = len(out_shape) - len(in_shape)
        return x, [Lin() if in_shape[k] == 1 else idx[k + lead] for k in range(len(in_shape))]
    if t is aten.permute.default:
        dims = [_norm_dim(d, len(in_shape)) for d in n.args[1]]
        out = [Lin()] * len(in_shape)
        for k, d in enumerate(dims):
            out[d] = idx[k]
        return x, out
    if t in (aten.t.default, aten.transpose.int):
        if len(in_shape) < 2:
            return x, idx
        d0, d1 = (0, 1) if t is aten.t.default else (_norm_dim(n.args[1], len(in_shape)),
                                                     _norm_dim(n.args[2], len(in_shape)))
        out = list(idx)
        out[d0], out[d1] = idx[d1], idx[d0]
        return x, out
    if t is aten.slice.Tensor:
        d = _norm_dim(_arg(n, 1, "dim", 0), len(in_shape))
        step = _arg(n, 4, "step", 1)
        return x, idx[:d] + [idx[d].scale(step) + _slice_start(n, in_shape[d])] + idx[d + 1:]
    if t is aten.select.int:
        d = _norm_dim(n.args[1], len(in_shape))
        i = n.args[2] + in_shape[d] if n.args[2] < 0 else n.args[2]
        return x, idx[:d] + [Lin((), i)] + idx[d:]
    raise Unsupported(f"view op {t}")  # pragma: no cover - the pass only groups the ops above


VIEW_OPS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.alias.default, aten.detach.default,
    aten.unsqueeze.default, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.expand.default,
    aten.permute.default, aten.t.default, aten.transpose.int, aten.slice.Tensor, aten.select.int,
})
MULTI_VIEW_OPS = frozenset({aten.unbind.int, aten.split.Tensor, aten.split_with_sizes.default})
STRUCTURAL_OPS = frozenset({aten.cat.default, aten.stack.default, aten.constant_pad_nd.default,
                            aten.slice_scatter.default, aten.select_scatter.default, aten.repeat.default})
# Complex values (Qwen-Image's RoPE: ``view_as_real(view_as_complex(x.float()...) * freqs)``) live in the kernel as
# (real, imaginary) pairs of their component dtype: view_as_complex and view_as_real are the only ways in and out,
# complex inputs are passed as their view_as_real, and the one complex op is ``mul`` of two complex tensors
# (pointwise_ops.complex_mul). complex128 (Lumina's RoPE table, built in float64 by ``torch.polar``) promotes a
# complex64 operand exactly; its fp64 values reach the output only through ``_to_copy`` (``WIDE_DTYPES``).
COMPLEX_DTYPES = (torch.complex64, torch.complex128)
# fp64 values: a complex128 value's components (or an fp64 input) on their way to a narrowing ``_to_copy``
WIDE_DTYPES = (torch.float64,)
COMPLEX_VIEWS = frozenset({aten.view_as_complex.default, aten.view_as_real.default})


def component_dtype(dtype: torch.dtype) -> torch.dtype:
    """complex64 → float32, complex128 → float64."""
    return torch.float64 if dtype == torch.complex128 else torch.float32


def pad_fill(n: fx.Node, dtype: torch.dtype) -> float | None:
    """``constant_pad_nd``'s fill value as its output stores it (rounded to ``dtype``), or None where the kernel
    does not take the call: a negative pad (a crop), or a fill that is not finite."""
    pads = list(_arg(n, 1, "pad", ()))
    if len(pads) % 2 or any(not isinstance(p, int) or p < 0 for p in pads):
        return None
    fill = float(torch.tensor(float(_arg(n, 2, "value", 0.0)), dtype=dtype).float())
    return fill if math.isfinite(fill) else None


_PARITY = Term("f", 1, 2)  # a flat kernel's lane parity: which element of its pair lane f holds


def _pair_invariant(i: Lin) -> bool:
    """Whether ``i`` is the same on lanes 2p and 2p + 1 of a flat kernel (it moves with ``f // 2`` only)."""
    return all(t.var == "f" and t.div % 2 == 0 for t, _ in i.terms)


# ---------------------------------------------------------------------------------------------
# the generator
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclasses.dataclass
class KernelSource:
    source: str
    name: str
    outputs: list[TensorSpec]  # what to allocate, in the group's output order
    numel: int
    grid: tuple[int, ...] = ()
    constexprs: dict = dataclasses.field(default_factory=dict)  # BLOCK, or BX and BY when tiled
    strided_bytes: int = 0  # bytes this kernel loads or stores with a stride along its fast index
    tile: tuple[int, int] | None = None  # (x dim, y dim) of the outputs' shape when tiled
    num_warps: int = 4
    tables: list = dataclasses.field(default_factory=list)  # lut16 tables, passed after numel


class Generator(Emit):
    def __init__(self, gm: fx.GraphModule, metas: dict[fx.Node, object], inputs: Sequence[TensorSpec],
                 variants: Variants = DEFAULT_VARIANTS, index_dtype: str = "int32", device=None) -> None:
        self.gm, self.metas, self.inputs, self.variants = gm, metas, list(inputs), variants
        self.placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
        self.lines: list[str] = []
        self._cse: dict[str, str] = {}
        self._memo: dict[tuple, Val] = {}
        self.index_dtype = index_dtype
        self.bounds: dict[str, int] = {}  # iteration variable -> its extent (f, or x, y and z when tiled)
        self.block_shape = "[BLOCK]"  # the shape of the kernel's lanes ([BY, BX] when tiled)
        self.accesses: list[tuple[Lin, int]] = []  # (offset, bytes per element) of every load and store
        self.device = device
        self.block = BLOCK  # LUT_BLOCK in a flat kernel that looks an op up (generate decides)
        # A flat kernel over row tiles: programs of CAT_ROWS rows x BLOCK columns of a last-dim cat's output, each
        # inside one input (generate decides; see _cat_row_tiles)
        self.row_tiles = False
        self.tables: list[tuple[tuple, object]] = []  # (table key, Lut16) of the lut{i} parameters
        # Lanes 2p and 2p + 1 of a flat kernel form a pair (_paired). mask -> a mask that is the same on both
        # lanes of a pair and under which every index read under ``mask`` is valid on both (generate fills it)
        self._pair_mask: dict[str, str] = {}
        self._swapped: dict[str, str] = {}
        self._mask_tests: dict[str, tuple[Lin, ...]] = {}  # mask -> the indices it tests beyond the kernel's own
        self._mask_parent: dict[str, str] = {}  # a narrowed mask -> the mask it narrowed
        self.row_means = False  # a row mean's lanes (_row_mean): the source imports row_sums

    # --- emission --------------------------------------------------------------------------
    def tmp(self, expr: str) -> str:
        if expr.isidentifier():
            return expr
        name = self._cse.get(expr)
        if name is None:
            name = f"t{len(self._cse)}"
            self._cse[expr] = name
            self.lines.append(f"{name} = {expr}")
        return name

    def block_ptr(self, base: str, off: Lin) -> str:
        """``base + off`` as a pointer of the kernel's block shape: an offset that does not move with the lane
        (a constant, a program's own index, or a materialized index) is broadcast so that a mask can go with it."""
        ptr = f"{base} + {self.index_code(off)}"
        if any(t.var in ("f", "x", "y") for t, _ in off.terms):
            return ptr
        return f"tl.broadcast_to({ptr}, {self.block_shape})"

    def index_code(self, i: Lin) -> str:
        return str(i.const) if i.is_const() else self.tmp(i.code())

    def unravel(self, flat: Lin, shape: Sequence[int]) -> list[Lin]:
        """Row-major multi-index of ``flat`` in ``shape``; the outermost dimension needs no modulo."""
        cs = contiguous_strides(shape)
        if flat.is_const():
            return [Lin((), (flat.const // cs[k]) % shape[k] if shape[k] else 0) for k in range(len(shape))]
        base = flat.pure()
        first = next((k for k, s in enumerate(shape) if s != 1), None)

        def term_for(b: Term, k: int) -> Term | None:
            if k == first:
                if b.mod and b.mod % cs[k]:
                    return None
                return Term(b.var, b.div * cs[k], b.mod // cs[k] if b.mod else 0)
            if b.mod and b.mod % (cs[k] * shape[k]):
                return None
            return Term(b.var, b.div * cs[k], shape[k])

        if base is None or any(term_for(base, k) is None for k in range(len(shape)) if shape[k] != 1):
            digits = self.digits(flat, shape)
            if digits is not None:
                return digits
            base = Term(self.tmp(flat.code()), 1, 0)
        out = []
        for k in range(len(shape)):
            t = term_for(base, k) if shape[k] != 1 else None
            out.append(Lin() if t is None or t.mod == 1 else Lin.of(t))
        return out

    def term_range(self, t: Term) -> int | None:
        """How many values ``t`` takes (None: its variable's extent is unknown)."""
        bound = self.bounds.get(t.var)
        if bound is None:
            return None
        r = -(-bound // t.div)
        return min(r, t.mod) if t.mod else r

    def digits(self, flat: Lin, shape: Sequence[int]) -> list[Lin] | None:
        """Row-major multi-index of ``flat = sum(c * term) + const`` in ``shape`` without dividing ``flat``
        itself: a term ``c * t`` with ``c = a * stride[k]`` (``a < shape[k]``) puts ``a * (t // p % cap)`` in digit
        ``k`` (``cap = shape[k] / a``) and the rest of ``t`` in the digits outside it. Exact when no digit
        overflows (the largest values of what lands in it sum to less than its size: no carry); None otherwise,
        and the caller divides the materialized flat index."""
        nd = len(shape)
        cs = contiguous_strides(shape)
        first = next((k for k, s in enumerate(shape) if s != 1), None)
        if first is None:
            return None
        parts: list[list[tuple[int, Term | None, int]]] = [[] for _ in shape]  # (a, term or const, largest value)
        for t, c in flat.terms:
            r = self.term_range(t)
            if r is None or c <= 0:
                return None
            k = next((k for k in range(nd)
                      if shape[k] != 1 and c % cs[k] == 0 and (k == first or c // cs[k] < shape[k])), None)
            if k is None:
                return None
            a, p = c // cs[k], 1
            while True:
                top = k == first or -(-r // p) * a <= shape[k]
                if not top and shape[k] % a:
                    return None
                cap = 0 if top else shape[k] // a
                d = _compose(t, p, cap)
                if d is None:
                    return None
                parts[k].append((a, d, a * (min(-(-r // p), cap or r) - 1)))
                if top:
                    break
                p, a = p * cap, 1
                k -= 1
                while k >= 0 and shape[k] == 1:
                    k -= 1
                if k < 0:
                    return None
        rest = flat.const
        if rest < 0:
            # whole outermost rows back (a later input of a cat: f - lo): the outermost digit has no modulo and
            # takes the offset; where it goes negative, the flat index is before the tensor and masked off
            if rest % cs[first]:
                return None
            parts[first].append((rest // cs[first], None, 0))
            rest = 0
        for k in range(nd - 1, -1, -1):
            digit = rest // cs[k] if k == first else (rest // cs[k]) % shape[k]
            if digit:
                parts[k].append((digit, None, digit))
            rest -= digit * cs[k]
        if rest:
            return None
        out: list[Lin] = []
        for k in range(nd):
            if k != first and sum(m for _, _, m in parts[k]) >= shape[k]:
                return None  # a carry into the next digit
            lin = Lin()
            for a, d, _ in parts[k]:
                lin = lin + (a if d is None else Lin.of(d).scale(a))
            out.append(lin)
        return out

    # --- metadata --------------------------------------------------------------------------
    def meta(self, n: fx.Node) -> TensorSpec:
        if n.op == "placeholder":
            return self.inputs[self.placeholders[n]]
        m = self.metas[n]
        if not isinstance(m, TensorSpec):
            raise Unsupported(f"{n.name} is not a tensor")
        return m

    def shape(self, n: fx.Node) -> tuple[int, ...]:
        return self.meta(n).shape

    # --- values ----------------------------------------------------------------------------
    def value(self, n: fx.Node, idx: list[Lin], mask: str) -> Val:
        key = (n, tuple(idx), mask)
        v = self._memo.get(key)
        if v is None:
            pair_mask = self._pair_mask.get(mask)
            v = self._paired(n, idx, pair_mask) if pair_mask is not None else None
            if v is None and pair_mask not in (None, mask) and all(_pair_invariant(i) for i in idx):
                v = self.value(n, idx, pair_mask)  # the same element on both lanes of a pair: one for every branch
            if v is None:
                v = self._value(n, idx, mask)
            self._memo[key] = v
        return v

    def _paired(self, n: fx.Node, idx: list[Lin], pair_mask: str) -> Val | None:
        """Element ``c`` of a pair (``idx[d] = 2 * (...) + c`` along a dim ``d`` of even size, every other index the
        same on both lanes of a pair): RoPE's ``x.unflatten(-1, (-1, 2)).unbind(-1)`` read at its pair index. Each
        lane ``2p + q`` computes element ``q`` of pair ``p`` (loads contiguous where the pairs are) and takes element
        ``1 - q`` from its neighbour in registers, where reading element ``c`` on every lane is a load at stride 2,
        repeated in every branch that reads it. The same elements: bits unchanged. None where the form differs, and
        for views (their input pairs, once)."""
        if n.op == "call_function" and (n.target in VIEW_OPS or n.target in COMPLEX_VIEWS
                                        or n.target is operator.getitem):
            return None
        spec = self.meta(n) if n.op == "placeholder" else self.metas.get(n)
        if not isinstance(spec, TensorSpec) or spec.dtype not in FLOAT_DTYPES:
            return None
        for d, i in enumerate(idx):
            if (spec.shape[d] % 2 or not i.terms or any(c % 2 for _, c in i.terms) or not _pair_invariant(i)
                    or not all(_pair_invariant(j) for j in idx[:d] + idx[d + 1:])):
                continue
            c = i.const % 2
            own = self.value(n, idx[:d] + [i + (-c) + Lin.of(_PARITY)] + idx[d + 1:], pair_mask)
            other = self._swap_neighbours(own.code)
            return Val(self.tmp(f"tl.where({self.index_code(Lin.of(_PARITY))} == {c}, {own.code}, {other})"), own.dtype)
        return None

    def _value(self, n: fx.Node, idx: list[Lin], mask: str) -> Val:
        spec = self.meta(n) if n.op == "placeholder" else self.metas.get(n)
        if isinstance(spec, TensorSpec) and spec.dtype in COMPLEX_DTYPES:
            raise Unsupported(f"{n.name} is complex: read through view_as_real only")
        if n.op == "placeholder":
            return self._load(self.placeholders[n], spec, idx, mask)
        t = n.target
        if t in VIEW_OPS or t is operator.getitem:
            x, in_idx = view_input_index(self, n, idx)
            return self.value(x, in_idx, mask)
        if t is aten.view_as_real.default:
            return self._view_as_real(n, idx, mask)
        if t is aten.constant_pad_nd.default:
            return self._pad(n, idx, mask)
        if t in (aten.slice_scatter.default, aten.select_scatter.default):
            return self._scatter(n, idx, mask)
        if t is aten.repeat.default:
            return self._repeat(n, idx, mask)
        if t in STRUCTURAL_OPS:
            return self._select(n, idx, mask)
        if t is aten.mean.dim:
            return self._row_mean(n, idx, mask)
        if t is aten._to_copy.default and self.meta(n.args[0]).dtype in WIDE_DTYPES:
            return self._narrow(n, idx, mask)
        r = RECIPES.get(t)
        if r is None:
            raise Unsupported(f"op {t}")
        looked = self._lut16(n, idx, mask)
        if looked is not None:
            return looked
        why = r.check(n)
        if why:
            raise Unsupported(why)
        out = self.meta(n)
        if out.dtype not in FLOAT_DTYPES:
            raise Unsupported(f"{n.name} has dtype {out.dtype}")
        ops = []
        for i in r.tensor_args:
            a = n.args[i]
            if isinstance(a, fx.Node):
                v = self.value(a, self._broadcast(a, idx, out.shape), mask)
                if v.dtype in WIDE_DTYPES:
                    raise Unsupported(f"{a.name} ({v.dtype}) is read by {t}: fp64 values only narrow")
                ops.append(to_common(self, v, out.dtype))
            else:
                ops.append(to_common(self, a, out.dtype))
        v = self.tmp(r.build(self, n, ops, self.variants))
        return Val(v if r.selects else self.tmp(round_code(v, out.dtype)), out.dtype)

    def _narrow(self, n: fx.Node, idx: list[Lin], mask: str) -> Val:
        """``_to_copy`` of an fp64 value to a narrower float: to fp32 (nearest even), then to the output dtype, as
        C++'s ``static_cast`` of a double to ``c10::BFloat16``/``c10::Half`` goes (their constructors take a float:
        two roundings)."""
        out = self.meta(n).dtype
        if out not in FLOAT_DTYPES or n.kwargs.keys() - {"dtype", "layout", "device", "memory_format"}:
            raise Unsupported(f"{n.name}: fp64 to {out}")
        x = self.value(n.args[0], idx, mask)
        return Val(self.tmp(round_code(self.tmp(f"{x.code}.to(tl.float32)"), out)), out)

    def _load(self, k: int, spec: TensorSpec, idx: list[Lin], mask: str) -> Val:
        """Input ``in{k}`` (laid out as ``spec``) at ``idx``, as fp32 code holding a value of its dtype (fp64 and
        bool inputs as they are)."""
        off = flatten(idx, spec.stride, spec.shape)
        self.accesses.append((off, spec.dtype.itemsize))
        if off.is_const():
            load = f"tl.load(in{k} + {off.const})"  # one element: a valid address, no mask needed
        elif mask == "m" and all(t.var == "z" for t, _ in off.terms):
            # a tiled kernel's per-program element under the kernel's own mask: z is in range in every
            # program, so the element exists; one scalar load
            load = f"tl.load(in{k} + {self.index_code(off)})"
        else:
            # under a narrower mask (a cat branch) the index may be out of the input's range where the mask
            # is off: the mask must apply, so a scalar address becomes a block
            load = f"tl.load({self.block_ptr(f'in{k}', off)}, mask={mask}, other=0)"
        if spec.dtype in (torch.bool,) + WIDE_DTYPES:
            return Val(self.tmp(load), spec.dtype)
        if spec.dtype not in FLOAT_DTYPES:
            raise Unsupported(f"input dtype {spec.dtype}")
        return Val(self.tmp(f"{load}.to(tl.float32)" if spec.dtype != torch.float32 else load), spec.dtype)

    def _narrowed(self, mask: str, cond: str, on: Sequence[Lin], parity_split: bool = False) -> str:
        """``mask & cond``, where ``cond`` tests the indices ``on``. Recorded for _paired: a mask the same on
        both lanes of a pair stays so under a test of such indices; ``parity_split`` (the test is of the lane's
        parity alone, and holds for one lane of each pair: a stack's or a size-2 cat's input) keeps the unnarrowed
        mask as the one both lanes may load under."""
        new = self.tmp(f"{mask} & {cond}")
        self._mask_tests[new] = (*self._mask_tests.get(mask, ()), *on)
        self._mask_parent.setdefault(new, mask)
        base = self._pair_mask.get(mask)
        if base is not None and new not in self._pair_mask:
            if all(_pair_invariant(i) for i in on):  # (a cat inside a stack's input: the same test of the base)
                self._pair_mask[new] = new if base == mask else self._narrowed(base, cond, on)
            elif parity_split and base == mask:
                self._pair_mask[new] = mask
        return new

    # --- row means --------------------------------------------------------------------------
    def _row_mean(self, n: fx.Node, idx: list[Lin], mask: str) -> Val:
        """``mean.dim(v, [-1], keepdim=True)`` of a value ``v`` of the group (an RMSNorm's squares, which the pass
        groups only with a tail that reads the mean on every element: fxpasses/pointwise.py) at ``idx``. In a flat
        kernel whose lanes ``f`` hold element ``f % D`` of the row ``f // D`` selects, a program's ``BLOCK`` lanes
        are whole rows: they compute ``v`` there and sum each row in eager's order (kernels/mean_square.py's
        ``row_sums``, the order ``mean_square`` reproduces), then ``* factor`` as ATen's mean does. Every lane gets
        its row's mean; ``v`` is never stored."""
        v = n.args[0]
        spec = self.meta(v)
        d = spec.shape[-1]
        if self.block_shape != "[BLOCK]" or self.block % d or self.bounds.get("f", 0) % d:
            raise Unsupported(f"a mean over rows of {d} needs a flat kernel whose programs hold whole rows")

        def per_row(i: Lin) -> bool:  # the same on the D lanes of a row
            return all(t.var == "f" and t.div % d == 0 for t, _ in i.terms)

        row = idx[:-1]
        if not all(map(per_row, row)):
            raise Unsupported(f"a mean over rows of {d} read where a program's lanes are not whole rows")
        rows = math.prod(spec.shape[:-1])
        if rows < MIN_ROWS or rows * d >= 2**31:
            raise Unsupported(f"{rows} rows of {d}: eager sums them in another order")
        # under a mask that tests an index inside the row (a cat or slice write along it), the row is summed under
        # the nearest enclosing mask that holds on all of its lanes: its elements are read there, whichever lanes
        # use the mean
        while not all(map(per_row, self._mask_tests.get(mask, ()))):
            mask = self._mask_parent[mask]
        form = row_sum_form(self.device, d) if self.device is not None else None
        if form is None:
            raise Unsupported(f"no known eager order of a mean over rows of {d} on {self.device}")
        sq = self.value(v, [*row, Lin.of(Term("f", 1, d))], mask)
        r = self.block // d
        self.row_means = True
        s = self.tmp(f"row_sums(tl.reshape(tl.broadcast_to({sq.code}, [BLOCK]), [{r}, {d}]), {r}, {d}, "
                     f"{form[0]}, {form[1]}, {form[2]})")
        factor = mean_factor(rows, d)
        return Val(self.tmp(f"tl.reshape(tl.broadcast_to(({s} * {lit(factor)})[:, None], [{r}, {d}]), [BLOCK])"),
                   torch.float32)

    # --- complex values ---------------------------------------------------------------------
    def _view_as_real(self, n: fx.Node, idx: list[Lin], mask: str) -> Val:
        """``view_as_real(c)`` at ``idx``: component ``idx[-1]`` of ``c`` at ``idx[:-1]`` (fp32)."""
        q, at = idx[-1], idx[:-1]
        if q.is_const():
            return self.cvalue(n.args[0], at, mask)[q.const]
        # The flat kernel's lanes 2p and 2p + 1 hold one complex element's two components when the component is
        # f % 2 and the element's index moves with f // 2 only: each lane loads its own component, contiguous, and
        # takes the other from its neighbour (_swap_neighbours), as _paired does for RoPE's real form
        pairs = (self.block_shape == "[BLOCK]" and self.block % 2 == 0 and q == Lin.of(_PARITY)
                 and all(_pair_invariant(i) for i in at))
        re, im = self.cvalue(n.args[0], at, mask, q if pairs else None)
        return Val(self.tmp(f"tl.where({self.index_code(q)} == 0, {re.code}, {im.code})"), re.dtype)

    def cvalue(self, n: fx.Node, idx: list[Lin], mask: str, lane: Lin | None = None) -> tuple[Val, Val]:
        """Complex node ``n`` at ``idx`` as its (real, imaginary) values (fp32, fp64 for complex128). ``lane``: the
        lane's own component (f % 2) where the two components sit in neighbouring lanes (``_view_as_real``), else
        None."""
        key = ("complex", n, tuple(idx), mask, lane)
        v = self._memo.get(key)
        if v is None:
            v = self._cvalue(n, idx, mask, lane)
            self._memo[key] = v
        return v

    def _cvalue(self, n: fx.Node, idx: list[Lin], mask: str, lane: Lin | None) -> tuple[Val, Val]:
        spec = self.meta(n)
        if spec.dtype not in COMPLEX_DTYPES:
            raise Unsupported(f"{n.name} is not complex")
        if n.op == "placeholder":  # passed as view_as_real: pairs of its component dtype
            real = TensorSpec((*spec.shape, 2), (*(2 * st for st in spec.stride), 1), component_dtype(spec.dtype))
            k = self.placeholders[n]
            return self._components(lambda q, m: self._load(k, real, [*idx, q], m), lane, mask)
        t = n.target
        if t is aten.view_as_complex.default:
            r = n.args[0]
            return self._components(lambda q, m: self.value(r, [*idx, q], m), lane, mask)
        if t in VIEW_OPS:
            x, in_idx = view_input_index(self, n, idx)
            return self.cvalue(x, in_idx, mask, lane)
        if t is aten.mul.Tensor and len(n.args) == 2 and all(isinstance(a, fx.Node) for a in n.args):
            comp = component_dtype(spec.dtype)
            # a complex64 operand of a complex128 product: its fp32 components widen exactly
            (a, b), (c, d) = ((self._widened(v, comp) for v in self.cvalue(x, self._broadcast(x, idx, spec.shape),
                                                                            mask, lane)) for x in n.args)
            re, im = complex_mul(self, a, b, c, d, self.variants, comp)
            return Val(self.tmp(re), comp), Val(self.tmp(im), comp)
        raise Unsupported(f"complex op {t}")

    def _widened(self, v: Val, dtype: torch.dtype) -> str:
        return v.code if v.dtype == dtype else self.tmp(f"{v.code}.to(tl.float64)")

    def _components(self, load: Callable[[Lin, str], Val], lane: Lin | None, mask: str) -> tuple[Val, Val]:
        """(real, imaginary) of a complex element stored as a pair; ``load(q, mask)`` gives component q."""
        if lane is None:
            return load(Lin(), mask), load(Lin((), 1), mask)
        own = load(lane, mask)
        other = self._swap_neighbours(own.code)
        q = self.index_code(lane)
        return (Val(self.tmp(f"tl.where({q} == 0, {own.code}, {other})"), own.dtype),
                Val(self.tmp(f"tl.where({q} == 0, {other}, {own.code})"), own.dtype))

    def _swap_neighbours(self, code: str) -> str:
        """In a flat kernel, the value of lane ``f ^ 1`` (lanes 2p and 2p + 1 trade, in registers)."""
        done = self._swapped.get(code)
        if done is not None:
            return done
        a, b = f"t{len(self._cse)}a", f"t{len(self._cse)}b"
        # (broadcast first: the value may not depend on the lane, e.g. a constant expanded)
        self.lines.append(f"{a}, {b} = tl.split(tl.reshape(tl.broadcast_to({code}, [BLOCK]), [BLOCK // 2, 2]))")
        self._swapped[code] = self.tmp(f"tl.reshape(tl.join({b}, {a}), [BLOCK])")
        return self._swapped[code]

    def _lut16_candidate(self, n: fx.Node) -> bool:
        """``n`` is a LUT16_OPS call from bf16 to bf16 that passes its recipe's check."""
        if not (self.variants.lut16 and n.op == "call_function" and n.target in LUT16_OPS and self.device is not None):
            return False
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return False  # building a table runs eager's op and reads results back: not inside a graph capture
        a = n.args[0]
        if not isinstance(a, fx.Node) or self.meta(n).dtype != torch.bfloat16 or self.meta(a).dtype != torch.bfloat16:
            return False
        exact = not RECIPES[n.target].check(n) or lookup_only(n)
        return exact and _table(self._lut16_key(n), n, self.device) is not None

    def _lut16_key(self, n: fx.Node) -> tuple:
        return (str(n.target), tuple(map(repr, n.args[1:])), tuple(sorted(n.kwargs.items())), str(self.device))

    def _lut16(self, n: fx.Node, idx: list[Lin], mask: str) -> Val | None:
        """``n`` looked up in eager's table (kernels/lut16.py), in a flat kernel; None: the recipe computes it."""
        if (self.block != LUT_BLOCK and not self.row_tiles) or not self._lut16_candidate(n):
            return None
        a = n.args[0]
        v = self.value(a, self._broadcast(a, idx, self.meta(n).shape), mask)
        if v.dtype != torch.bfloat16:  # the operand's value must be a bf16 (its storage dtype)
            return None
        key = self._lut16_key(n)
        lut = _table(key, n, self.device)
        i = next((k for k, (tk, _) in enumerate(self.tables) if tk == key), None)
        if i is None:
            i = len(self.tables)
            self.tables.append((key, lut))
        c = lut.constexprs()
        b = self.tmp(f"tl.broadcast_to({v.code}, {self.block_shape}).to(tl.bfloat16).to(tl.uint16, bitcast=True)"
                     ".to(tl.int32)")
        if self.row_tiles:  # tl.gather takes an index of the table's rank: the tile's lanes as one row
            flat = self.tmp(f"tl.reshape({b}, [CAT_ROWS * BLOCK])")
            r1 = self.tmp(f"lut16_apply({flat}, lut{i}_t, {c['LO']}, {c['SPAN']}, {c['SPECIAL']})")
            r = self.tmp(f"tl.reshape({r1}, [CAT_ROWS, BLOCK])")
        else:
            r = self.tmp(f"lut16_apply({b}, lut{i}_t, {c['LO']}, {c['SPAN']}, {c['SPECIAL']})")
        return Val(self.tmp(f"{r}.to(tl.uint16).to(tl.bfloat16, bitcast=True).to(tl.float32)"), torch.bfloat16)

    def _uniform_cat(self, o: fx.Node, idx: list[Lin]) -> tuple[Term, list] | None:
        """An output ``cat`` in which every program's ``BLOCK`` indices fall in one input (its index along the cat
        dimension is ``f // s % W`` and ``BLOCK`` divides ``s`` or every input's extent times ``s``): the term and
        the inputs. Such a kernel branches once per program instead of loading every input under a mask and
        computing every input's chain on every lane (FLUX's ``cat([attn, gelu(mlp)], 2)``: the gelu ran on the
        attention's lanes too)."""
        if o.op != "call_function" or o.target is not aten.cat.default:
            return None
        dim, branches = self._branches(o, idx)
        t = idx[dim].pure()
        if len(branches) < 2 or t is None or t.var != "f" or t.mod not in (0, branches[-1][1]):
            return None
        if t.div % self.block == 0:
            return t, branches
        if self.block % t.div or any(hi % (self.block // t.div) for _, hi, _, _ in branches):
            return None
        return t, branches

    def _cat_branches_only_at(self, block: int, outs: list[fx.Node], shape: Sequence[int]) -> bool:
        """The one output is a cat whose programs each lie in one input at ``block`` elements, not at LUT_BLOCK.
        Such a kernel keeps its branch per program: in row tiles with the lookup where ``_cat_row_tiles`` allows
        (the fastest), else flat ``block``-element programs with the recipe (faster than LUT_BLOCK programs with
        the lookup whose lanes select their input)."""
        if len(outs) != 1:
            return False
        flat_idx = self.unravel(Lin.of(Term("f", 1, 0)), shape)
        saved, branches = self.block, []
        for b in (block, LUT_BLOCK):
            self.block = b
            branches.append(self._uniform_cat(outs[0], flat_idx) is not None)
        self.block = saved
        return branches[0] and not branches[1]

    def _cat_row_tiles(self, outs: list[fx.Node], shape: Sequence[int]) -> bool:
        """Whether the one output is a cat along its last dim whose inputs' widths ``BLOCK`` divides, with a lookup
        in it: then programs of ``CAT_ROWS`` rows x ``BLOCK`` columns each lie in one input (one branch per program)
        and are as large as LUT_BLOCK, which amortizes the table (FLUX's single block: ``cat([attn, gelu(mlp)], 2)``
        of widths 3072 + 12288, where flat LUT_BLOCK programs straddle the inputs and 1024-element ones would fill
        the table once per 1024 elements)."""
        if len(outs) != 1 or len(shape) < 2 or shape[-1] % BLOCK:
            return False
        if any(n.target in (aten.unbind.int, aten.mean.dim) for n in self.gm.graph.nodes):
            return False  # the pair rotation (RoPE) and row means reshape flat [BLOCK] lanes
        uniform = self._uniform_cat(outs[0], self.unravel(Lin.of(Term("f", 1, 0)), shape))
        return uniform is not None and uniform[0].div == 1

    def _branch_per_program(self, spec: TensorSpec, idx: list[Lin], uniform: tuple[Term, list],
                            i64: bool) -> list[str]:
        """The store of a ``_uniform_cat`` output: ``if c0 < hi: <that input's chain, stored>`` per input, where
        ``c0`` is the cat index of the program's first element. Each branch has its own temporaries."""
        t, branches = uniform
        pid = "tl.program_id(0).to(tl.int64)" if i64 else "tl.program_id(0)"
        first = "b0" if self.row_tiles else f"({pid} * BLOCK)"  # the flat index of the program's first element
        self.lines.append(f"c0 = {Term('f0', t.div, t.mod).code()}".replace("f0", first, 1))
        flat_off = flatten(idx, spec.stride, spec.shape)
        self.accesses.append((flat_off, spec.dtype.itemsize))
        ptr = self.block_ptr("out0", flat_off)
        cast = "" if spec.dtype == torch.float32 else f".to({_TL_DTYPE[spec.dtype]})"
        head_cse, head_lines = dict(self._cse), self.lines
        out: list[str] = []
        for k, (_, hi, x, xi) in enumerate(branches):
            self.lines, self._cse, self._memo = [], dict(head_cse), {}
            v = self.value(x, xi, "m")
            code = v.code if v.dtype == spec.dtype or spec.dtype == torch.float32 else self.tmp(
                round_code(v.code, spec.dtype))
            out.append("else:" if k == len(branches) - 1 else f"{'if' if k == 0 else 'elif'} c0 < {hi}:")
            out += [f"    {ln}" for ln in self.lines] + [f"    tl.store({ptr}, {code}{cast}, mask=m)"]
            # temporaries are named by count: later branches must not reuse an earlier branch's names
            head_cse.update({f"#branch{k}:{e}": n for e, n in self._cse.items() if e not in head_cse})
        self.lines, self._cse, self._memo = head_lines, head_cse, {}
        return out

    def _broadcast(self, a: fx.Node, idx: list[Lin], out_shape: Sequence[int]) -> list[Lin]:
        shape = self.shape(a)
        lead = len(out_shape) - len(shape)
        return [Lin() if shape[k] == 1 else idx[k + lead] for k in range(len(shape))]

    def _branches(self, n: fx.Node, idx: list[Lin]) -> tuple[int, list[tuple[int, int, fx.Node, list[Lin]]]]:
        """``cat`` / ``stack``'s dim and its inputs as ``(lo, hi, input, index into it)`` along that dim."""
        tensors = list(n.args[0])
        stack = n.target is aten.stack.default
        dim = _norm_dim(_arg(n, 1, "dim", 0), len(self.meta(n).shape))
        branches = []
        lo = 0
        for x in tensors:
            xs = self.shape(x)
            if stack:
                branches.append((lo, lo + 1, x, idx[:dim] + idx[dim + 1:]))
                lo += 1
                continue
            if len(xs) == 1 and xs[0] == 0 or xs[dim] == 0:
                continue  # cat skips empty inputs
            branches.append((lo, lo + xs[dim], x, idx[:dim] + [idx[dim] + (-lo)] + idx[dim + 1:]))
            lo += xs[dim]
        return dim, branches

    def _pad(self, n: fx.Node, idx: list[Lin], mask: str) -> Val:
        """``constant_pad_nd`` (non-negative pads): the input at the index less the leading pad where the index
        lies inside it (its load masked to that), else the fill, rounded to the output dtype as eager fills it:
        copies and a constant, exact (SANA's ``F.pad(value.float(), (0, 0, 0, 1), value=1.0)``)."""
        out = self.meta(n)
        fill = pad_fill(n, out.dtype)
        if fill is None:
            raise Unsupported("constant_pad_nd with a negative pad or a non-finite fill")
        x = n.args[0]
        xs = self.shape(x)
        pads = list(_arg(n, 1, "pad", ()))
        inner, conds, tested = list(idx), [], []
        for j in range(len(pads) // 2):
            d = len(xs) - 1 - j
            lo, hi = pads[2 * j], pads[2 * j + 1]
            if lo == hi == 0:
                continue
            inner[d] = idx[d] + (-lo)
            if idx[d].is_const():
                if not lo <= idx[d].const < lo + xs[d]:  # this index is all fill
                    return Val(self.tmp(f"tl.full({self.block_shape}, {fill!r}, tl.float32)"), out.dtype)
                continue
            dc = self.index_code(idx[d])
            tested.append(idx[d])
            conds += ([f"({dc} >= {lo})"] if lo else []) + ([f"({dc} < {lo + xs[d]})"] if hi else [])
        if not conds:
            return self.value(x, inner, mask)
        inside = self.tmp(" & ".join(conds))
        # an index variable (a tile's x or y, a 1-D output's f) padded at its end only: where the load is unmasked
        # it is below the input's extent, which lets the view index algebra keep it linear (digits: no carry)
        # instead of dividing a materialized index, so a tiled kernel reads the input contiguously (SANA's padded
        # value read through a transpose). Only loads under the pad's own mask see the narrower bound
        saved = dict(self.bounds)
        for j in range(len(pads) // 2):
            d, term = len(xs) - 1 - j, idx[len(xs) - 1 - j].pure()
            if pads[2 * j] == 0 and term is not None and term.div == 1 and term.mod == 0 and term.var in self.bounds:
                self.bounds[term.var] = min(self.bounds[term.var], xs[d])
        try:
            v = self.value(x, inner, self._narrowed(mask, inside, tested))
        finally:
            self.bounds = saved
        return Val(self.tmp(f"tl.where({inside}, {v.code}, {fill!r})"), out.dtype)

    def _scatter(self, n: fx.Node, idx: list[Lin], mask: str) -> Val:
        """``slice_scatter(base, src, dim, start, end, 1)`` / ``select_scatter(base, src, dim, index)``: ``src`` where
        the index along ``dim`` lies in the slice (loads masked to it), ``base`` elsewhere: copies, exact. What a
        write into a slice or a row (``q[:, n:] = f(q[:, n:])``, ``x[:, 0] = y``) becomes once functionalized."""
        out = self.meta(n)
        base, src = n.args[0], n.args[1]
        dim = _norm_dim(_arg(n, 2, "dim", 0), len(out.shape))
        size = out.shape[dim]
        if n.target is aten.select_scatter.default:
            index = _arg(n, 3, "index", 0)
            start = index + size if index < 0 else index
            end = start + 1
            inner = idx[:dim] + idx[dim + 1:]  # src has no ``dim``
        else:
            start, end, step = _arg(n, 3, "start", None), _arg(n, 4, "end", None), _arg(n, 5, "step", 1)
            if step != 1:
                raise Unsupported("slice_scatter with a step")
            start = 0 if start is None else (start + size if start < 0 else start)
            end = size if end is None else (end + size if end < 0 else end)
            start, end = max(0, min(start, size)), max(0, min(end, size))
            inner = idx[:dim] + [idx[dim] + (-start)] + idx[dim + 1:]
        d = idx[dim]
        if d.is_const():
            v = self.value(src, inner, mask) if start <= d.const < end else self.value(base, idx, mask)
            return Val(v.code if v.dtype == out.dtype else self.tmp(round_code(v.code, out.dtype)), out.dtype)
        dc = self.index_code(d)
        inside = self.tmp(f"({dc} == {start})" if end == start + 1 else f"({dc} >= {start}) & ({dc} < {end})")
        vs = self.value(src, inner, self._narrowed(mask, inside, [d]))
        vb = self.value(base, idx, mask)
        codes = [v.code if v.dtype == out.dtype else self.tmp(round_code(v.code, out.dtype)) for v in (vs, vb)]
        return Val(self.tmp(f"tl.where({inside}, {codes[0]}, {codes[1]})"), out.dtype)

    def _repeat(self, n: fx.Node, idx: list[Lin], mask: str) -> Val:
        """``repeat(x, reps)`` at ``idx``: x at each index modulo x's size along it (a size-1 dim at 0; the leading
        dims ``repeat`` adds are dropped), as GQA's ``k.unsqueeze(3).repeat(1, 1, 1, n_rep, 1)`` copies."""
        x = n.args[0]
        shape = self.meta(x).shape
        reps = list(n.args[1])
        lead = len(reps) - len(shape)
        in_idx = []
        for i, size, rep in zip(idx[lead:], shape, reps[lead:]):
            term = i.pure()
            if size == 1:
                in_idx.append(Lin())
            elif rep == 1:
                in_idx.append(i)
            elif term is not None and (term.mod == 0 or term.mod % size == 0):
                in_idx.append(Lin.of(Term(term.var, term.div, size)))
            else:
                raise Unsupported(f"{n.name}: a repeat along an index that is not one term")
        return self.value(x, in_idx, mask)

    def _select(self, n: fx.Node, idx: list[Lin], mask: str) -> Val:
        """``cat`` / ``stack``: the input the index along ``dim`` falls in, loads masked to it."""
        out = self.meta(n)
        dim, branches = self._branches(n, idx)
        d = idx[dim]
        if d.is_const():  # the branch is known: no select
            for b_lo, b_hi, x, xi in branches:
                if b_lo <= d.const < b_hi:
                    v = self.value(x, xi, mask)
                    return Val(self.tmp(round_code(v.code, out.dtype)) if v.dtype != out.dtype else v.code, out.dtype)
            raise Unsupported("cat index out of range")  # pragma: no cover
        dc = self.index_code(d)
        vals = []
        for b_lo, b_hi, x, xi in branches:
            # the index is never negative where the enclosing mask holds: no lower bound at 0
            cond = (f"({dc} == {b_lo})" if b_hi == b_lo + 1 else
                    f"({dc} < {b_hi})" if b_lo == 0 else f"({dc} >= {b_lo}) & ({dc} < {b_hi})")
            # along a dim of size 2 indexed by the lane's parity each input holds one lane of every pair
            v = self.value(x, xi, self._narrowed(mask, cond, [d], parity_split=d == Lin.of(_PARITY)))
            exact = v.dtype == out.dtype or out.dtype == torch.float32
            code = v.code if exact else self.tmp(round_code(v.code, out.dtype))
            vals.append((b_hi, code))
        acc = vals[-1][1]
        for b_hi, code in reversed(vals[:-1]):
            acc = self.tmp(f"tl.where({dc} < {b_hi}, {code}, {acc})")
        return Val(acc, out.dtype)

    # --- the kernel ------------------------------------------------------------------------
    def generate(self, title: str = "", tile: tuple[int, int] | None = None) -> KernelSource:
        """The kernel: flat (``tile`` None) or walking ``[BY, BX]`` tiles of dims ``tile = (x, y)`` of the outputs'
        common shape."""
        out_node = next(n for n in self.gm.graph.nodes if n.op == "output")
        outs = list(out_node.args[0])
        specs = [self.meta(o) for o in outs]
        numel = math.prod(specs[0].shape)
        if any(math.prod(s.shape) != numel for s in specs):
            raise Unsupported("outputs differ in element count")
        if numel == 0:
            raise Unsupported("empty output")
        i64 = self.index_dtype != "int32"
        if tile is None:
            if any(self._lut16_candidate(n) for n in self.gm.graph.nodes):
                if not self._cat_branches_only_at(BLOCK, outs, specs[0].shape):
                    self.block = LUT_BLOCK
                else:
                    self.row_tiles = self._cat_row_tiles(outs, specs[0].shape)
                    if not self.row_tiles and any(map(lookup_only, self.gm.graph.nodes)):
                        self.block = LUT_BLOCK  # an op exact only as a lookup: no recipe branch
            self.bounds = {"f": numel}
            pid = "tl.program_id(0).to(tl.int64)" if i64 else "tl.program_id(0)"
            index_of = lambda shape: self.unravel(Lin.of(Term("f", 1, 0)), shape)  # noqa: E731
            if self.row_tiles:
                width = specs[0].shape[-1]
                rows = numel // width
                pid1 = "tl.program_id(1).to(tl.int64)" if i64 else "tl.program_id(1)"
                # the last program's rows past the end address the last row (masked): no index runs past the
                # tensors, so lowering/pointwise.py's int32 margin holds. b0: the first column's flat index in a
                # row, all the cat's branch needs (its index is f % width)
                head = [f"ri = {pid} * CAT_ROWS + tl.arange(0, CAT_ROWS)[:, None]",
                        f"r = tl.minimum(ri, {rows - 1})",
                        f"f = r * {width} + ({pid1} * BLOCK + tl.arange(0, BLOCK)[None, :])",
                        f"m = tl.broadcast_to(ri < {rows}, [CAT_ROWS, BLOCK])",
                        f"b0 = {pid1} * BLOCK"]
                grid = (triton.cdiv(rows, CAT_ROWS), width // BLOCK)
                constexprs = {"BLOCK": self.block, "CAT_ROWS": CAT_ROWS}
                tparams = ["BLOCK: tl.constexpr", "CAT_ROWS: tl.constexpr"]
                self.block_shape = "[CAT_ROWS, BLOCK]"
            else:
                head = [f"f = {pid} * BLOCK + tl.arange(0, BLOCK)", "m = f < numel"]
                if numel % 2 == 0:  # lanes 2p and 2p + 1 are both in range or both past the end
                    self._pair_mask["m"] = "m"
                grid, constexprs = (triton.cdiv(numel, self.block),), {"BLOCK": self.block}
                tparams = ["BLOCK: tl.constexpr"]
        else:
            shape = specs[0].shape
            if any(s.shape != shape for s in specs):
                raise Unsupported("a tiled kernel needs outputs of one shape")
            dx, dy = tile
            rest = [k for k in range(len(shape)) if k not in tile]
            nz = math.prod(shape[k] for k in rest)
            bx, by = min(TILE_X, triton.next_power_of_2(shape[dx])), min(TILE_Y, triton.next_power_of_2(shape[dy]))
            grid = (nz, triton.cdiv(shape[dx], bx), triton.cdiv(shape[dy], by))
            if max(grid[1:]) > 65535:
                raise Unsupported("too many tiles for the grid")
            # masked lanes past the edge tiles compute offsets up to (BX + BY) strides past a tensor's end: where
            # int32 indices could wrap there, the kernel indexes in int64 (the flat kernel's margin is BLOCK
            # elements, lowering/pointwise.py). A size-1 dim's stride is in no offset (flatten): batch 1's is not
            # a reason
            if not i64 and any(1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride))
                               + (bx + by) * max((abs(st) for n, st in zip(t.shape, t.stride) if n != 1), default=0)
                               >= 2**31 for t in [*self.inputs, *specs]):
                i64 = True
            self.bounds = {"x": shape[dx], "y": shape[dy], "z": nz}
            z_idx = self.unravel(Lin.of(Term("z", 1, 0)), [shape[k] for k in rest])
            base: list[Lin] = [Lin()] * len(shape)
            base[dx], base[dy] = Lin.of(Term("x", 1, 0)), Lin.of(Term("y", 1, 0))
            for k, i in zip(rest, z_idx):
                base[k] = i
            cast = ".to(tl.int64)" if i64 else ""
            head = [f"z = tl.program_id(0){cast}",
                    f"x = tl.program_id(1){cast} * BX + tl.arange(0, BX)[None, :]",
                    f"y = tl.program_id(2){cast} * BY + tl.arange(0, BY)[:, None]",
                    f"m = (x < {shape[dx]}) & (y < {shape[dy]})"]
            index_of = lambda _shape: list(base)  # noqa: E731
            constexprs, tparams = {"BX": bx, "BY": by}, ["BX: tl.constexpr", "BY: tl.constexpr"]
            self.block_shape = "[BY, BX]"
        body_start = len(self.lines)
        stores = []
        uniform = self._uniform_cat(outs[0], index_of(specs[0].shape)) if tile is None and len(outs) == 1 else None
        if uniform is not None:
            stores = self._branch_per_program(specs[0], index_of(specs[0].shape), uniform, i64)
        for j, (o, spec) in enumerate([] if uniform is not None else zip(outs, specs)):
            if spec.dtype not in FLOAT_DTYPES:
                raise Unsupported(f"output dtype {spec.dtype}")
            idx = index_of(spec.shape)
            v = self.value(o, idx, "m")
            flat_off = flatten(idx, spec.stride, spec.shape)
            self.accesses.append((flat_off, spec.dtype.itemsize))
            cast = "" if spec.dtype == torch.float32 else f".to({_TL_DTYPE[spec.dtype]})"
            stores.append(f"tl.store({self.block_ptr(f'out{j}', flat_off)}, {v.code}{cast}, mask=m)")
        body = self.lines[body_start:] + stores
        n_in, n_out = len(self.inputs), len(outs)
        # each table once per program, before the lanes' work (tl.gather reads it through shared memory)
        head += [f"lut{i}_t = tl.load(lut{i} + tl.arange(0, {lut.table.numel()}))"
                 for i, (_, lut) in enumerate(self.tables)]
        # numel in both forms (a tiled kernel masks by its dims): one launch signature for the op's plan
        params = [f"in{k}" for k in range(n_in)] + [f"out{j}" for j in range(n_out)] + ["numel"]
        params += [f"lut{i}" for i in range(len(self.tables))] + tparams
        text = "\n".join(f"    {ln}" for ln in [*head, *body])
        libdevice = ("from diffusion_fuse.kernels.pointwise_ops import interpreter_libdevice\n"
                     "libdevice = interpreter_libdevice()\n" if triton_interpret()
                     else "from triton.language.extra import libdevice\n")
        if self.tables:
            libdevice += "from diffusion_fuse.kernels.lut16 import lut16_apply\n"
        if self.row_means:
            libdevice += "from diffusion_fuse.kernels.mean_square import row_sums\n"
        digest = hashlib.sha256(f"{libdevice}{','.join(params)}{text}".encode()).hexdigest()[:16]
        name = f"pointwise_{digest}"
        header = "".join(f"# {ln}\n" for ln in title.splitlines())
        source = (f"{header}import triton\nimport triton.language as tl\n{libdevice}\n\n"
                  f"@triton.jit\ndef {name}({', '.join(params)}):\n{text}\n")
        fast = ("f",) if tile is None else ("x", "y")
        strided = sum(size for off, size in self.accesses if not _coalesced(off, fast)) * numel
        warps = LUT_WARPS if self.tables else NUM_WARPS
        return KernelSource(source, name, specs, numel, grid, constexprs, strided, tile, warps,
                            [lut.table for _, lut in self.tables])


_tables: dict[tuple, object] = {}
_tables_lock = threading.Lock()


def _table(key: tuple, n: fx.Node, device):
    """The lut16 table of ``n``'s op (its non-tensor arguments in ``key``) on ``device``, built once; None when no
    table fits (the recipe computes the op then)."""
    from .lut16 import build_lut16

    with _tables_lock:
        if key not in _tables:
            target, extra, kwargs = n.target, n.args[1:], dict(n.kwargs)
            try:
                lut, why = build_lut16(lambda x: target(x, *extra, **kwargs), torch.bfloat16, device)
            except Exception as e:  # noqa: BLE001 - no table is no error: the recipe computes the op
                lut, why = None, f"building the table failed: {type(e).__name__}: {e}"
            if lut is None:
                _log.info("pointwise: %s keeps its recipe: %s", key[0], why)
            else:
                _log.debug("pointwise: %s on %s through its bf16 %s", key[0], device, lut.describe())
            _tables[key] = lut
        return _tables[key]


def _compose(t: Term, p: int, q: int) -> Term | None:
    """``t // p % q`` (``q == 0``: no modulo) as one term, when it is one."""
    if p == 1 and q == 0:
        return t
    if t.mod == 0:
        return Term(t.var, t.div * p, q)
    if t.mod % p:
        return None
    m = t.mod // p  # (v // d % mod) // p == v // (d * p) % (mod / p) when p divides mod
    if q == 0 or m <= q:
        return Term(t.var, t.div * p, m)
    return Term(t.var, t.div * p, q) if m % q == 0 else None


def _coalesced(off: Lin, fast: Sequence[str]) -> bool:
    """Whether neighbouring lanes along one of the ``fast`` indices touch neighbouring elements: a term
    ``c * (i // c)`` over a run of at least _MIN_RUN lanes (``c == 1``: one element a lane; ``c == 2``: a pair's
    shared element, as Wan's RoPE reads ``cos[..., 0::2]``, whose lanes span the same sectors as a contiguous
    read), on whichever index a tiled kernel lays its lanes along, or no fast index moving it faster than every
    _MIN_RUN lanes (a broadcast row or column)."""
    if any(t.var not in ("f", "x", "y", "z") for t, _ in off.terms):
        return False  # through a materialized index: unknown
    for var in fast:
        if any(t.var == var and c == t.div <= 2 and (t.mod == 0 or t.mod * t.div >= _MIN_RUN) for t, c in off.terms):
            return True
    return all(t.div >= _MIN_RUN for t, _ in off.terms if t.var in fast)


def choose_layout(make: Callable[[], Generator], title: str = "") -> KernelSource:
    """The flat kernel, or a tiled one when that accesses fewer bytes with a stride (module docstring)."""
    best = _least_strided(make, title)
    if best.strided_bytes:  # a layout no tiling reads contiguously: the kernel runs below its bandwidth
        _log.info("pointwise: %s accesses %.1f MB at a stride (%s)", title.split(": ")[0] or best.name,
                  best.strided_bytes / 1e6, f"tiles {best.tile}" if best.tile else "flat")
    return best


def _least_strided(make: Callable[[], Generator], title: str) -> KernelSource:
    best = make().generate(title)
    if not best.strided_bytes:
        return best
    shape, stride = best.outputs[0].shape, best.outputs[0].stride
    if any(o.shape != shape for o in best.outputs):
        return best
    inner = [k for k in range(len(shape)) if shape[k] > 1 and stride[k] == 1]
    if not inner:
        return best
    dx = inner[-1]
    for dy in range(len(shape)):
        if dy == dx or shape[dy] < _MIN_RUN:
            continue
        try:
            src = make().generate(title, tile=(dx, dy))
        except Unsupported:
            continue
        except Exception as e:  # noqa: BLE001 - a codegen bug in a tiling must leave the flat kernel standing
            _log.warning("pointwise: tiling (%d, %d) not generated, the flat kernel stays: %s: %s", dx, dy,
                         type(e).__name__, e)
            continue
        if src.strided_bytes < best.strided_bytes:
            best = src
    return best


# ---------------------------------------------------------------------------------------------
# loading generated kernels
# ---------------------------------------------------------------------------------------------
_loaded: dict[str, object] = {}
_load_lock = threading.Lock()


def cache_dir() -> str:
    path = os.path.join(cache_root(), "pointwise")
    os.makedirs(path, exist_ok=True)
    return path


def source_path(src: KernelSource) -> str:
    """The file ``load_kernel`` writes ``src`` to (and Triton reads it from)."""
    return os.path.join(cache_dir(), f"{src.name}.py")


def load_kernel(src: KernelSource):
    """The ``@triton.jit`` function of ``src`` (one per distinct source in the process)."""
    with _load_lock:
        fn = _loaded.get(src.name)
        if fn is not None:
            return fn
        path = source_path(src)
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as fh:
                fh.write(src.source)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(f"diffusion_fuse_generated.{src.name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, src.name)
        _loaded[src.name] = fn
        return fn
