"""Family ``rms_norm``: ``torch.nn.RMSNorm`` [+ AdaLN modulate] as one op, ``diffusion_fuse::rms_norm``.

It covers ``torch.nn.RMSNorm`` / ``F.rms_norm`` as a CUDA graph holds them (PyTorch routes them to
``aten._fused_rms_norm``, which has a CUDA kernel and so is not decomposed):

- ``_fused_rms_norm(x, [D], w?, eps) → getitem 0``: a QK norm over the head dim (``[B,S,H,Dh]``) or across heads
  (``[B,S,H*Dh]``);
- optionally followed by the modulate ``* (1 + scale) [+ shift] [→ cast]``, every spelling family
  ``norm_modulate`` accepts.

On a CPU build ``_fused_rms_norm`` is CompositeImplicit, so CPU graphs hold the pow → mean → rsqrt chain instead
(family ``rms_norm_chain`` in tier high, ``mean_square`` and ``pointwise`` in tier lossless). Sites are sized to
what only they read: a chain stops at a value read by more than one op.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .match_utils import arg, aten, getitem_users, single_user
from .norm_modulate import ModulateChain, modulate_chain
from .registry import Example, NearMiss, PatternFamily, Site, example_tensor, register_family
from .table_slice import ModOperand


def single_modulate(y: fx.Node, anchor: fx.Node) -> ModulateChain | None:
    """The modulate reading ``y`` if it is ``y``'s only reader, else None."""
    user = single_user(y)
    if user is None:
        return None
    chain = modulate_chain(y, user, anchor)
    return chain if isinstance(chain, ModulateChain) else None


def modulate_inputs(chain: ModulateChain | None) -> list[fx.Node]:
    # scale and shift as the nodes they are (a timestep-table slice is not split into its addends)
    if chain is None:
        return []
    return [chain.scale.node] + ([chain.shift.node] if chain.shift is not None else [])


def emit_modulate(graph: fx.Graph, chain: ModulateChain | None, it) -> tuple:
    """(scale, shift, out_dtype) arguments of the op, taking the modulate's inputs from ``it``."""
    if chain is None:
        return None, None, None
    scale = ModOperand(chain.scale.node, table=False).emit(graph, it, chain.unsqueeze_dim)[0]
    shift = next(it) if chain.shift is not None else None
    return scale, shift, chain.out_dtype


@register_family
class RmsNorm(PatternFamily):
    name = "rms_norm"
    tier = "lossless"
    anchors = (aten._fused_rms_norm.default,)
    description = "torch.nn.RMSNorm (_fused_rms_norm) [+ AdaLN modulate (1 + scale) [+ shift] [→ cast]]"
    variants = (
        "_fused_rms_norm(x, [D], w, eps)[0]                (QK norm over head_dim: FLUX/FLUX.2; across heads: Wan)",
        "_fused_rms_norm(x, [D], None, eps)[0]             (no weight)",
        "_fused_rms_norm(...)[0] * (1 + scale) [+ shift] [→ cast]   (modulate, any norm_modulate spelling)",
    )


    def example(self) -> Example:
        def qk_norm(x, w):  # torch.nn.RMSNorm over the head dim, then a modulate
            return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6) * 2

        return qk_norm, (example_tensor(2, 8, 4, 64), example_tensor(64, seed=1))

    def near_miss_example(self) -> Example:
        def norm_and_rstd(x):  # the rstd output read: the op does not return it
            y, rstd = torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], None, 1e-6)
            return y, rstd

        return norm_and_rstd, (example_tensor(2, 8, 64),)

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        x, normalized_shape = node.args[:2]
        weight, eps = arg(node, 2, "weight"), arg(node, 3, "eps")
        if len(normalized_shape) != 1:
            return NearMiss(self.name, node, f"normalized_shape {list(normalized_shape)} spans more than the last dim")
        try:
            outs = getitem_users(node)
        except LookupError as e:
            return NearMiss(self.name, node, str(e))
        if set(outs) != {0}:
            return NearMiss(self.name, node, f"rstd output is used (getitems {sorted(outs)})") if outs else None
        y = outs[0]
        if not y.users:
            return None
        chain = single_modulate(y, node)
        has_w = isinstance(weight, fx.Node)

        def emit(graph: fx.Graph, ins):
            it = iter(ins)
            x_n = next(it)
            w_n = next(it) if has_w else None
            scale, shift, out_dtype = emit_modulate(graph, chain, it)
            return [graph.call_function(torch.ops.diffusion_fuse.rms_norm.default,
                                        (x_n, w_n, None if eps is None else float(eps), scale, shift, out_dtype))]

        return Site(
            pattern=self.name,
            anchor=node,
            nodes=[node, y] + (chain.nodes if chain else []),
            inputs=[x] + ([weight] if has_w else []) + modulate_inputs(chain),
            outputs=[chain.last if chain else y],
            emit=emit,
            op="diffusion_fuse::rms_norm",
        )
