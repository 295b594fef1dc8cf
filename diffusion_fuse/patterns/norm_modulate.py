"""Family ``norm_modulate``: LayerNorm followed by AdaLN modulate, ``LN(x) * (1 + scale) [+ shift]``.

Becomes ``diffusion_fuse::norm_modulate`` (lowering/norm_modulate.py). Covered ATen forms
(no decomposition table; `python -m diffusion_fuse inspect --model flux --diff` prints them):

- FLUX / SD3.5 / SANA / Qwen-Image (bf16 or fp32 model):
  ``native_layer_norm(x,[D],w?,b?,eps)[0] → mul(ln, add(unsqueeze(scale,1), 1)) → add(·, shift)``
- AdaLayerNormContinuous: ``add(scale, 1)`` before the ``unsqueeze``.
- FLUX.2: ``mul(add(scale, 1), ln)`` (operands swapped).
- without shift (the ``add`` is absent), elementwise-affine LN (weight, bias).
- Wan FP32LayerNorm: ``_to_copy(x, f32) → native_layer_norm → mul(ln, add(scale_f32, 1)) →
  add(·, shift_f32) → _to_copy(bf16)``, scale/shift [B,1,D] or per-token [B,S,D].
- Inductor's post-grad form of the casts (``prims.convert_element_type``).
- scale/shift a slice of a chunked timestep-embedding table (Wan ``(table + temb.float()).chunk(6)``, per
  token or not; patterns/table_slice.py): the op reads the table and temb and adds them itself, so the fp32
  sum is never written.

The site keeps eager's rounding points: the op's reference impl is this very ATen chain.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .match_utils import (
    add_scalar_operand,
    aten,
    cast_dtype,
    depends_on,
    getitem_users,
    is_op,
    other_operand,
    same_shape,
    single_user,
    trim_defaults,
    val,
)
from .quant_chain import emit_quant_op, quant_chain, quant_consumers
from .registry import Example, NearMiss, PatternFamily, Site, example_tensor, register_family
from .table_slice import ModOperand


def _scale_of(t: object) -> tuple[fx.Node, int | None] | None:
    """If ``t`` is ``1 + scale`` (optionally around an unsqueeze), return (scale, unsqueeze dim).

    ``unsqueeze dim`` is set when the add comes *before* the unsqueeze, so the replacement has
    to re-insert the view; when the unsqueeze comes first, the unsqueezed node is the scale.
    """
    if is_op(t, aten.unsqueeze.default):
        inner = add_scalar_operand(t.args[0], 1.0)
        if inner is not None:
            return inner, t.args[1]
        return None
    scale = add_scalar_operand(t, 1.0)
    if scale is not None:
        return scale, None
    return None


@register_family
class NormModulate(PatternFamily):
    name = "norm_modulate"
    tier = "lossless"
    anchors = (aten.native_layer_norm.default,)
    description = "LayerNorm + AdaLN modulate: LN(x) * (1 + scale) [+ shift] [→ cast]"
    variants = (
        "ln*(1+unsqueeze(scale))+unsqueeze(shift)  (FLUX AdaLayerNormZero, SD3.5, SANA, Qwen-Image)",
        "ln*unsqueeze(1+scale)+unsqueeze(shift)    (AdaLayerNormContinuous)",
        "(1+scale)*ln+shift                         (FLUX.2, operands swapped)",
        "ln*(1+scale)                               (no shift)",
        "LN with weight/bias                        (elementwise affine)",
        "cast(LN(cast(x,f32))*(1+scale)+shift,bf16) (Wan FP32LayerNorm, [B,1,D] or per-token [B,S,D])",
        "scale/shift = (table + temb.float()).chunk(n)[j] [.squeeze]  (Wan, read as table + temb in the op)",
        "any of these read by up to 4 static FP8 quantizers (patterns/static_quant.py) → norm_modulate_quant",
    )


    def example(self) -> Example:
        def adaln(x, scale, shift):  # LN(x) * (1 + scale) + shift, scale and shift per batch
            ln = torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-6)
            return ln * (1 + scale[:, None]) + shift[:, None]

        return adaln, (example_tensor(2, 8, 64), example_tensor(2, 64, seed=1), example_tensor(2, 64, seed=2))

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        x_in, _, weight, bias, eps = node.args[:5]
        found = match_ln_chains(self.name, node)
        if not isinstance(found, tuple):
            return found
        ln, chains = found
        nodes: list[fx.Node] = [node, ln]
        # A dtype cast feeding the LN (Wan's x.float()) is folded in when nothing else reads it.
        x, ln_dtype = x_in, None
        if cast_dtype(x_in) is not None and len(x_in.users) == 1:
            x, ln_dtype = x_in.args[0], cast_dtype(x_in)
            nodes.insert(0, x_in)
        has_w, has_b = isinstance(weight, fx.Node), isinstance(bias, fx.Node)
        inputs = [x] + ([weight] if has_w else []) + ([bias] if has_b else [])
        for c in chains:
            nodes += c.nodes
            inputs += c.inputs
        # Quantizers reading a single modulate's output join the op (FP8-static linears after it).
        quants, others = quant_consumers(chains[0].last) if len(chains) == 1 else ([], 0)
        nodes += [n for q in quants for n in q.nodes]
        inputs += [q.scale for q in quants]

        def emit(graph: fx.Graph, ins):
            it = iter(ins)
            x_n = next(it)
            w_n = next(it) if has_w else None
            b_n = next(it) if has_b else None
            results = []
            for c in chains:
                scale_n, scale_t, shift_n, shift_t = c.emit_operands(graph, it)
                if quants:
                    return emit_quant_op(graph, torch.ops.diffusion_fuse.norm_modulate_quant.default,
                                         (x_n, w_n, b_n, float(eps), scale_n, shift_n, ln_dtype, c.out_dtype, scale_t,
                                          shift_t, list(it)), 0, others > 0, quants)
                results.append(graph.call_function(
                    torch.ops.diffusion_fuse.norm_modulate.default,
                    trim_defaults(x_n, w_n, b_n, float(eps), scale_n, shift_n, ln_dtype, c.out_dtype, scale_t,
                                  shift_t, required=8),
                ))
            return results

        return Site(
            pattern=self.name,
            anchor=node,
            nodes=nodes,
            inputs=inputs,
            outputs=([c.last for c in chains] if not quants or others else []) + [q.out for q in quants],
            emit=emit,
            op="diffusion_fuse::norm_modulate_quant" if quants else "diffusion_fuse::norm_modulate",
            n_ops=1 if quants else None,
            where=chains[-1].last,
        )


def match_ln_chains(pattern: str, node: fx.Node) -> tuple[fx.Node, list[ModulateChain]] | NearMiss | None:
    """The LN output node and the modulate chains reading it, or why not (shared by families)."""
    normalized_shape = node.args[1]
    if len(normalized_shape) != 1:
        return NearMiss(pattern, node, f"normalized_shape {list(normalized_shape)} spans more than the last dim")
    try:
        outs = getitem_users(node)
    except LookupError as e:
        return NearMiss(pattern, node, str(e))
    if set(outs) != {0}:
        return NearMiss(pattern, node, f"mean/rstd outputs are used (getitems {sorted(outs)})")
    ln = outs[0]
    if not ln.users:
        return None
    # Every reader of the LN output must be a modulate (SD3.5's AdaLayerNormZeroX has two):
    # each becomes its own op, so the normalized tensor is never written.
    chains = []
    for user in ln.users:
        chain = modulate_chain(ln, user, node)
        if isinstance(chain, str):
            n = len(ln.users)
            return NearMiss(pattern, node, chain if n == 1 else f"one of the LN output's {n} users: {chain}")
        chains.append(chain)
    return ln, chains


class ModulateChain:
    """One modulate reading the LN output: ``ln * (1 + scale) [+ shift] [→ cast]``."""

    def __init__(self, nodes, scale: fx.Node, unsqueeze_dim, shift: fx.Node | None, out_dtype) -> None:
        self.nodes, self.unsqueeze_dim, self.out_dtype, self.last = nodes, unsqueeze_dim, out_dtype, nodes[-1]
        # A table slice under an unsqueeze does not occur (that form is AdaLayerNormContinuous's): read it as is.
        self.scale = ModOperand(scale, table=unsqueeze_dim is None)
        self.shift = None if shift is None else ModOperand(shift)

    @property
    def inputs(self) -> list[fx.Node]:
        return self.scale.inputs + (self.shift.inputs if self.shift is not None else [])

    def emit_operands(self, graph: fx.Graph, it) -> tuple[fx.Node, fx.Node | None, fx.Node | None, fx.Node | None]:
        """(scale, scale's second addend, shift, shift's second addend) as the op takes them, broadcastable
        to x: re-adds an unsqueeze the +1 sat inside."""
        scale, scale_t = self.scale.emit(graph, it, self.unsqueeze_dim)
        shift, shift_t = self.shift.emit(graph, it) if self.shift is not None else (None, None)
        return scale, scale_t, shift, shift_t


def modulate_chain(ln: fx.Node, mul: fx.Node, anchor: fx.Node) -> ModulateChain | str:
    """The modulate chain starting at ``mul``, or why it is not one."""
    if not is_op(mul, aten.mul.Tensor):
        return f"LN output feeds {mul.target}, not a mul by (1 + scale)"
    if list(mul.args[:2]).count(ln) != 1:
        return "LN output multiplied by itself"
    found = _scale_of(other_operand(mul, ln))
    if found is None:
        return "mul operand is not (1 + scale) (scalar not 1, or another expression)"
    scale, unsqueeze_dim = found
    if val(mul) is not None and not same_shape(mul, ln):
        return "the modulate broadcasts the LN output to a larger shape"
    nodes, last, shift = [mul], mul, None
    add = single_user(mul)
    if is_op(add, aten.add.Tensor) and add.kwargs.get("alpha", 1) == 1 and len(add.args) == 2 and mul in add.args:
        cand = other_operand(add, mul)
        if isinstance(cand, fx.Node) and not depends_on(cand, anchor) and (val(add) is None or same_shape(add, mul)):
            shift = cand
            nodes.append(add)
            last = add
    out_dtype = None
    cast = single_user(last)
    # (the fp32 copy that starts an FP8 quantizer is not the modulate's cast: the quantizer joins the site)
    if cast is not None and cast_dtype(cast) is not None and isinstance(quant_chain(last, cast), str):
        out_dtype = cast_dtype(cast)
        nodes.append(cast)
    return ModulateChain(nodes, scale, unsqueeze_dim, shift, out_dtype)
