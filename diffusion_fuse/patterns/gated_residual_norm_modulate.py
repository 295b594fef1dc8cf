"""Family ``gated_residual_norm_modulate``: ``r = residual + gate * x`` feeding LN [+ AdaLN modulate].

Becomes ``diffusion_fuse::gated_residual_norm_modulate`` (lowering/gated_residual_norm_modulate.py), which
returns the new residual ``r`` (read by later ops) and the normalized [modulated] output, without
writing ``gate * x`` or the normalized tensor. Covered ATen forms (bf16 or fp32 models, no
decomposition table; ``inspect --model flux --diff`` prints FLUX.1's):

- FLUX double block, SD3.5, Qwen-Image, SANA, FLUX.2:
  ``mul(unsqueeze(gate,1), x) → add(residual, ·) → native_layer_norm → modulate``;
  ``x`` may be a ``clone`` (Dropout p=0) or a ``view``/``_unsafe_view`` of a matmul;
  either operand order of the ``mul`` and of the ``add``.
- Wan (``(hidden_states.float() + out * gate).type_as(hidden_states)`` then an FP32LayerNorm):
  ``mul(x, gate_f32) → add(_to_copy(residual, f32), ·) → _to_copy(bf16) → _to_copy(f32) →
  native_layer_norm → …``; ``x`` may be ``_to_copy(ff_out, f32)`` (the FFN residual). The widening
  casts of ``residual`` and ``x`` are folded (eager's type promotion computes the same fp32 values);
  the bf16 ``r`` is the op's first output. In fp32 models the casts are absent.
- an ungated residual ``add(residual, x)``, x a linear's output of the residual's shape and dtype (Wan's
  cross-attention residual before norm3): the op's gate is ones (``UnitGate``, patterns/gated_residual.py),
  and ``1 * x`` is x, so the op computes eager's add.
- the LN + modulate part is exactly what family ``norm_modulate`` accepts, with one
  modulate reading the LN (several modulates stay with ``norm_modulate``); or no modulate: an LN
  whose output (optionally cast) only feeds something else (Wan's norm2, the cross-attention input).
- the output read by up to 4 static FP8 quantizers (patterns/static_quant.py) → the ``_quant`` op.
- gate/scale/shift slices of a chunked timestep-embedding table (Wan's ``(table + temb.float()).chunk(6)``,
  patterns/table_slice.py): the op reads table and temb and adds them itself. Wan's FFN residual is
  normalized by the next block's norm1 or by ``norm_out``, whose modulation comes from another table.

It is tried before ``norm_modulate`` (priority), which takes the LayerNorm when the
residual is not a gated one.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .gated_residual import match_gated_residual
from .match_utils import aten, cast_dtype, getitem_users, is_op, single_user, trim_defaults
from .norm_modulate import ModulateChain, match_ln_chains
from .quant_chain import emit_quant_op, quant_chain, quant_consumers
from .registry import Example, NearMiss, PatternFamily, Site, example_tensor, register_family


def _plain_ln_output(ln_node: fx.Node) -> tuple[fx.Node, torch.dtype | None] | None:
    """(output node, cast dtype) of a LayerNorm whose output feeds no modulate, else None."""
    try:
        outs = getitem_users(ln_node)
    except LookupError:
        return None
    ln = outs.get(0)
    if set(outs) != {0} or len(ln.users) != 1 or is_op(next(iter(ln.users)), aten.mul.Tensor):
        return None
    cast = single_user(ln)
    # (the fp32 copy that starts an FP8 quantizer is not the output's cast: the quantizer joins the site)
    if cast_dtype(cast) is not None and isinstance(quant_chain(ln, cast), str):
        return cast, cast_dtype(cast)
    return ln, None


@register_family
class GatedResidualNormModulate(PatternFamily):
    name = "gated_residual_norm_modulate"
    tier = "lossless"
    priority = 10
    anchors = (aten.native_layer_norm.default,)
    description = "r = residual + gate * x; LN(r) [* (1 + scale) [+ shift]]; returns r and the output"
    variants = (
        "add(residual, mul(unsqueeze(gate,1), x)) → LN → modulate  (FLUX/SD3.5/Qwen-Image/SANA/FLUX.2, bf16/fp32)",
        "operands of mul and add in either order; x a clone/view of a linear's output",
        "cast(add(residual.float(), x[.float()] * gate), bf16) → LN(.float()) → [modulate] → cast  (Wan, bf16)",
        "LN read by no modulate, output optionally cast  (Wan norm2)",
        "add(residual, linear(a)) → LN → ...: ungated, a gate of ones  (Wan's cross-attention residual)",
        "gate/scale/shift = (table + temb.float()).chunk(n)[j] [.squeeze]  (Wan, read as table + temb in the op)",
        "the output read by up to 4 static FP8 quantizers (patterns/static_quant.py) → ..._quant op",
    )


    def example(self) -> Example:
        def block_end(residual, x, gate, scale, shift):  # the next residual, and the next norm's modulated output
            r = residual + gate[:, None] * x
            ln = torch.nn.functional.layer_norm(r, (r.shape[-1],), eps=1e-6)
            return r, ln * (1 + scale[:, None]) + shift[:, None]

        return block_end, (example_tensor(2, 8, 64), example_tensor(2, 8, 64, seed=1), example_tensor(2, 64, seed=2),
                           example_tensor(2, 64, seed=3), example_tensor(2, 64, seed=4))

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        x_in, _, weight, bias, eps = node.args[:5]
        # Wan: LN(r_bf16.float()) with r_bf16 = (residual.float() + x * gate).type_as(residual)
        r_end, ln_dtype, ln_cast = x_in, None, None
        if cast_dtype(x_in) is not None and len(x_in.users) == 1:
            r_end, ln_dtype, ln_cast = x_in.args[0], cast_dtype(x_in), x_in
        r_add = r_end.args[0] if cast_dtype(r_end) is not None else r_end
        gated = match_gated_residual(r_add, ungated=True)
        if gated is None:
            return None  # not a gated residual: family norm_modulate takes (and explains) this LayerNorm
        if r_add is not r_end:
            gated.r_cast, gated.r_dtype = r_end, cast_dtype(r_end)
        if gated.mul is not None and single_user(gated.mul) is None:
            return NearMiss(self.name, node, f"gate * x has {len(gated.mul.users)} users (needs 1: the residual add)")
        found = match_ln_chains(self.name, node)
        chain: ModulateChain | None = None
        if isinstance(found, tuple) and len(found[1]) == 1:
            ln, (chain,) = found
            ln_nodes, out, out_dtype = [ln, *chain.nodes], chain.last, chain.out_dtype
        else:
            plain = _plain_ln_output(node)
            if plain is None:
                return None  # norm_modulate decides (and reports) what happens to this LayerNorm
            out, out_dtype = plain
            ln_nodes = [getitem_users(node)[0]] + ([out] if out_dtype is not None else [])
        has_w, has_b = isinstance(weight, fx.Node), isinstance(bias, fx.Node)
        inputs = gated.inputs + ([weight] if has_w else []) + ([bias] if has_b else [])
        inputs += chain.inputs if chain is not None else []
        quants, others = quant_consumers(out)  # FP8-static linears reading the output join the op
        inputs += [q.scale for q in quants]

        def emit(graph: fx.Graph, ins):
            it = iter(ins)
            res_n, x_n = next(it), next(it)
            gate_n, gate_t = gated.gate.emit(graph, it)
            w_n = next(it) if has_w else None
            b_n = next(it) if has_b else None
            scale_n = scale_t = shift_n = shift_t = None
            if chain is not None:
                scale_n, scale_t, shift_n, shift_t = chain.emit_operands(graph, it)
            base = (res_n, x_n, gate_n, w_n, b_n, float(eps), scale_n, shift_n, out_dtype)
            tail = (gate_t, scale_t, shift_t, gated.r_dtype, ln_dtype, gated.mul_first)
            if quants:
                return emit_quant_op(graph, torch.ops.diffusion_fuse.gated_residual_norm_modulate_quant.default,
                                     (*base, *tail, list(it)), 1, others > 0, quants)
            both = graph.call_function(torch.ops.diffusion_fuse.gated_residual_norm_modulate.default,
                                       trim_defaults(*base, *tail, required=9))
            return [graph.call_function(operator.getitem, (both, 0)), graph.call_function(operator.getitem, (both, 1))]

        return Site(
            pattern=self.name,
            anchor=node,
            nodes=[*gated.nodes] + ([ln_cast] if ln_cast is not None else []) + [node, *ln_nodes]
            + [n for q in quants for n in q.nodes],
            inputs=inputs,
            outputs=[gated.r] + ([out] if not quants or others else []) + [q.out for q in quants],
            emit=emit,
            op="diffusion_fuse::gated_residual_norm_modulate" + ("_quant" if quants else ""),
            n_ops=1,
            where=out,
        )
