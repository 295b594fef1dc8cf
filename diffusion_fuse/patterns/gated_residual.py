"""Family ``gated_residual``: a gated residual no LayerNorm reads in the same graph.

Becomes ``diffusion_fuse::gated_residual`` (lowering/gated_residual.py): ``r = residual + gate * x``
[→ cast], written once, without ``gate * x``, fp32 copies of residual and x, or an fp32 table sum.
Under regional compilation (``compile_repeated_blocks``) a Wan block's graph ends with its FFN residual
``(hidden_states.float() + ff_output.float() * c_gate_msa).type_as(hidden_states)``: the LayerNorm that
reads it (the next block's norm1, or norm_out) is in another graph, so family gated_residual_norm_modulate
cannot take it, and without this family its gate would keep the whole [B,S,6,D] fp32 table sum alive.

Covered ATen forms (``match_gated_residual``, also the residual of gated_residual_norm_modulate), only those
that otherwise write fp32 tensors:

- ``add(_to_copy(residual, f32), mul(x[.float()], gate)) → _to_copy(residual's dtype)``
  (Wan's ``(residual.float() + x * gate).type_as(residual)``, bf16/fp16 model);
- ``add(residual, mul(x, gate))`` [→ cast] whose gate is a chunked timestep-embedding table slice
  (patterns/table_slice.py: Wan in fp32, SANA in fp32).

Plain gated residuals (FLUX, SD3.5, ... and SANA in bf16: one dtype, no table) are not covered yet.
A residual a LayerNorm reads (directly or through a cast) is left to gated_residual_norm_modulate, which
is matched at the LayerNorm, later in graph order.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import guard_or_false

from .match_utils import aten, cast_dtype, dtype_of, fold_upcast, is_op, linear_of, single_user, trim_defaults, val
from .registry import Example, NearMiss, PatternFamily, Site, example_tensor, register_family
from .table_slice import ModOperand, temb_slice


class UnitGate:
    """The gate of an ungated residual ``residual + x``: ones of x's dtype, made in the graph, shaped [1, ..., 1, D].
    ``1 * x`` is ``x`` in every float dtype (signed zeros, subnormals and infinities included; a NaN stays a NaN,
    and the add after it gives eager's), so the op's ``residual + gate * x`` is eager's add, and its kernel runs
    the form it runs for a broadcast gate."""

    slice = None

    def __init__(self, x: fx.Node) -> None:
        v = val(x)
        self.shape = [1] * (v.dim() - 1) + [v.shape[-1]]
        self.dtype, self.device = v.dtype, v.device

    @property
    def inputs(self) -> list[fx.Node]:
        return []

    def emit(self, graph: fx.Graph, it) -> tuple[fx.Node, None]:
        # ``full``, not ``ones``: Inductor's post-grad graph (tier high) lowers ``full`` and refuses ``ones``
        ones = graph.call_function(aten.full.default, (self.shape, 1.0), {"dtype": self.dtype, "device": self.device})
        return ones, None


class GatedResidualForm:
    """``r = residual + gate * x`` [→ cast]: the nodes, the operands as the op reads them (``mul`` None: an
    ungated ``residual + x``, whose gate is a ``UnitGate``)."""

    def __init__(self, add: fx.Node, mul: fx.Node | None, residual: fx.Node, gate: fx.Node | UnitGate, x: fx.Node,
                 casts: list[fx.Node], residual_widened: bool) -> None:
        self.add, self.mul, self.residual, self.x, self.casts = add, mul, residual, x, casts
        # the add's operand order (``gate * x + residual``): its output's layout follows the first operand's
        self.mul_first = True if mul is not None and add.args[0] is mul else None
        self.residual_widened = residual_widened  # the graph reads residual.float() (folded into the op)
        self.gate = gate if isinstance(gate, UnitGate) else ModOperand(gate)
        self.r_cast: fx.Node | None = None  # Wan's .type_as(residual)
        self.r_dtype: torch.dtype | None = None

    @property
    def r(self) -> fx.Node:
        """The node whose value is the new residual."""
        return self.r_cast if self.r_cast is not None else self.add

    @property
    def nodes(self) -> list[fx.Node]:
        return [*self.casts, *([self.mul] if self.mul is not None else []), self.add] + (
            [self.r_cast] if self.r_cast is not None else [])

    @property
    def inputs(self) -> list[fx.Node]:
        return [self.residual, self.x, *self.gate.inputs]


def _same_shape(a, b) -> bool:
    """Shape equality that is False, not an error, where a size is data-dependent (an unbacked symbol)."""
    return len(a) == len(b) and all(guard_or_false(x == y) for x, y in zip(a, b))


def match_gated_residual(r: object, ungated: bool = False) -> GatedResidualForm | None:
    """``r`` as ``residual + gate * x`` (any operand order) with widening casts folded, else None.

    ``ungated``: also ``residual + x`` with ``x`` a linear's output (or its eval-mode Dropout's clone) of the
    residual's shape and dtype (Wan's cross-attention residual), gated by a ``UnitGate``. Only a linear's output:
    an ``x`` the pointwise pass could compute in the kernel that adds it stays there."""
    if not is_op(r, aten.add.Tensor) or r.kwargs.get("alpha", 1) != 1 or len(r.args) != 2:
        return None
    for mul, residual in (r.args, r.args[::-1]):
        if is_op(mul, aten.mul.Tensor) and isinstance(residual, fx.Node) and len(mul.args) == 2:
            a, b = mul.args
            if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
                continue
            va, vb, vr = val(a), val(b), val(r)
            if va is None or vb is None or vr is None:
                continue
            # A table slice is the gate; else x has the full shape and the gate broadcasts ([B,1,D]).
            if temb_slice(a) is not None or temb_slice(b) is not None:
                gate, x = (a, b) if temb_slice(a) is not None else (b, a)
            else:
                gate, x = (a, b) if _same_shape(vb.shape, vr.shape) else (b, a)
            if not (_same_shape(val(x).shape, vr.shape) and _same_shape(val(residual).shape, vr.shape)):
                continue
            x, x_cast = fold_upcast(x, dtype_of(gate))
            residual, res_cast = fold_upcast(residual, dtype_of(mul))
            casts = [c for c in (res_cast, x_cast) if c is not None and len(c.users) == 1]
            return GatedResidualForm(r, mul, residual, gate, x, casts, res_cast is not None)
    return _ungated(r) if ungated else None


def _is_linear_output(x: object) -> bool:
    """``x`` is a linear's output, ``[view](addmm | mm)``, through an eval-mode Dropout's plain ``clone`` (traced up
    to torch 2.13); Inductor's post-grad graph (tier high) spells the view ``reshape``."""
    if is_op(x, aten.clone.default) and not x.kwargs and len(x.args) == 1:
        x = x.args[0]
    if is_op(x, aten.reshape.default):
        x = x.args[0]
    return linear_of(x) is not None


def _ungated(r: fx.Node) -> GatedResidualForm | None:
    """``residual + x`` as the gated form with a unit gate (``match_gated_residual``), else None."""
    for residual, x in (r.args, r.args[::-1]):
        vr, vres, vx = val(r), val(residual), val(x)
        if not all(isinstance(v, torch.Tensor) for v in (vr, vres, vx)):
            continue
        if not _is_linear_output(x):
            continue
        if vx.dtype != vres.dtype or not vx.dtype.is_floating_point or not isinstance(vx.shape[-1], int):
            continue
        if _same_shape(vx.shape, vr.shape) and _same_shape(vres.shape, vr.shape):
            form = GatedResidualForm(r, None, residual, UnitGate(x), x, [], False)
            # eager's output follows the add's first operand: the op adds in the traced order either way
            form.mul_first = True if r.args[0] is x else None
            return form
    return None


def _normalized(r: fx.Node) -> bool:
    """Whether a LayerNorm reads ``r``, directly or through a dtype cast."""
    for u in r.users:
        if is_op(u, aten.native_layer_norm.default) and u.args[0] is r:
            return True
        if cast_dtype(u) is not None and any(is_op(v, aten.native_layer_norm.default) for v in u.users):
            return True
    return False


@register_family
class GatedResidual(PatternFamily):
    name = "gated_residual"
    tier = "lossless"
    anchors = (aten.add.Tensor,)
    description = "r = residual + gate * x read by no LayerNorm: Wan's fp32 round trip or a timestep-table gate"
    variants = (
        "cast(add(residual.float(), x[.float()] * gate), residual dtype)  (Wan FFN residual at a block's end)",
        "add(residual, x * gate), gate = (table + temb.float()).chunk(n)[j]  (Wan/SANA, fp32 model)",
    )


    def example(self) -> Example:
        def residual_round_trip(residual, x, gate):  # (residual.float() + x * gate).type_as(residual), gate fp32
            return (residual.float() + x * gate[:, None]).type_as(residual)

        return residual_round_trip, (example_tensor(2, 8, 64), example_tensor(2, 8, 64, seed=1),
                                     example_tensor(2, 64, dtype=torch.float32, seed=2))

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        gated = match_gated_residual(node)
        if gated is None:
            return None
        cast = single_user(node)
        if cast_dtype(cast) is not None:
            gated.r_cast, gated.r_dtype = cast, cast_dtype(cast)
        # (residual.float() + ...).type_as(residual): a widening cast of the residual, narrowed back.
        round_trip = gated.residual_widened and gated.r_dtype == dtype_of(gated.residual)
        if not round_trip and gated.gate.slice is None:
            return None
        if _normalized(gated.r):
            return None  # gated_residual_norm_modulate takes it with the LayerNorm
        if single_user(gated.mul) is None:
            return NearMiss(self.name, node, f"gate * x has {len(gated.mul.users)} users (needs 1: the residual add)")
        inputs = gated.inputs

        def emit(graph: fx.Graph, ins):
            it = iter(ins)
            res_n, x_n = next(it), next(it)
            gate_n, gate_t = gated.gate.emit(graph, it)
            args = trim_defaults(res_n, x_n, gate_n, gate_t, gated.r_dtype, gated.mul_first, required=3)
            return [graph.call_function(torch.ops.diffusion_fuse.gated_residual.default, args)]

        return Site(
            pattern=self.name,
            anchor=node,
            nodes=gated.nodes,
            inputs=inputs,
            outputs=[gated.r],
            emit=emit,
            op="diffusion_fuse::gated_residual",
        )
