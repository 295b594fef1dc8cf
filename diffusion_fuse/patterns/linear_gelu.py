"""Family ``linear_gelu``: a linear layer's output read only by a gelu (the feed-forward's up-projection).

Becomes ``diffusion_fuse::linear_gelu`` (lowering/linear_gelu.py): one warp-specialized GEMM whose epilogue
looks eager's gelu up, so the [M, N] pre-activation is never written and read back (FLUX's image FF: a
[4096, 12288] bf16 tensor per double block).

Covered ATen form (nn.Linear then diffusers' ``GELU(approximate=...)``, as AOTAutograd traces them)::

    gelu(view(addmm(bias, x2d, t(weight)), [..., N]), approximate)      # or mm(x2d, t(weight)) without bias

(no view for a 2-D input) with ``addmm`` and the view each read by the next op only, default ``beta``/``alpha``.
A gelu read only by a last-dim ``cat`` (FLUX's single block: ``cat([attn, gelu(proj_mlp(x))], -1)``) takes the
``cat`` too, as ``diffusion_fuse::linear_gelu_cat``: the GEMM writes its columns of the ``cat`` buffer, so the
activation is not written once and copied again (nor, as the pointwise pass's ``gelu cat`` group, is the
pre-activation).

Off by default (``Options(patterns={"linear_gelu": True})`` turns it on). Exactness holds where cuBLAS runs a
non-split-K kernel (benchmarks/probe_gemm_exact.py: every FLUX.1-dev shape), and the verifier checks each
site. Speed against the default tier (cuBLAS, then the pointwise pass's lookup kernel), benchmarks/
bench_linear_gelu.py on an H200 (results/h200-2026-12-01a/run2): 0.973x on FLUX's image FF, 1.020x on its
512-row text FF, 1.008x on the single block's mlp + cat; no faster in the FLUX stack or FLUX.1-dev (run4).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .match_utils import aten, is_op, linear_of, single_user, val
from .registry import NearMiss, PatternFamily, Site, register_family


@register_family
class LinearGelu(PatternFamily):
    name = "linear_gelu"
    tier = "lossless"
    anchors = (aten.gelu.default,)
    default_on = False
    description = "gelu(x @ W.T + b): the FF up-projection and its activation as one GEMM with a looked-up gelu"
    variants = (
        "gelu(view(addmm(b, x2d, t(W)), [..., N]), approximate='tanh' | 'none')",
        "gelu(view(mm(x2d, t(W)), [..., N]), approximate='tanh' | 'none')",
        "gelu(addmm(b, x, t(W)), approximate=...)  (2-D input)",
        "cat([..., gelu(<any of the above>), ...], -1)  (the cat taken too: linear_gelu_cat)",
    )

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        pieces = linear_of(node.args[0])
        if pieces is None:
            return None
        mm, view, x2d, weight, bias = pieces
        approximate = node.kwargs.get("approximate", "none")
        for n in (mm, view) if view is not None else (mm,):
            if single_user(n) is None:
                return NearMiss(self.name, node, f"{n.name} has {len(n.users)} users (needs 1: the gelu)")
        xv, wv = val(x2d), val(weight)
        if not isinstance(xv, torch.Tensor) or xv.dtype != torch.bfloat16 or wv is None or wv.dtype != torch.bfloat16:
            return NearMiss(self.name, node, "not a bf16 linear (the kernel takes bf16)")
        if not all(isinstance(d, int) for d in (*xv.shape, *val(node).shape)):
            # the op's output view would carry the sizes as symbols the graph's code does not define
            return NearMiss(self.name, node, "symbolic shape (a dynamic-shape graph): left to ATen")
        inputs = [x2d, weight] + ([bias] if bias is not None else [])
        nodes = [mm, view, node] if view is not None else [mm, node]
        cat = _last_dim_cat(node, xv, wv.shape[0])
        if cat is not None:
            return self._cat_site(node, cat, nodes, inputs, bias is not None, approximate)
        out_shape = list(val(node).shape)

        def emit(graph: fx.Graph, ins):
            x_n, w_n = ins[0], ins[1]
            b_n = ins[2] if bias is not None else None
            y = graph.call_function(torch.ops.diffusion_fuse.linear_gelu.default, (x_n, w_n, b_n, approximate))
            return [graph.call_function(aten.view.default, (y, out_shape))]

        return Site(pattern=self.name, anchor=node, nodes=nodes, inputs=inputs, outputs=[node], emit=emit,
                    op="diffusion_fuse::linear_gelu")

    def _cat_site(self, gelu: fx.Node, cat: fx.Node, nodes: list[fx.Node], inputs: list[fx.Node], has_bias: bool,
                  approximate: str) -> Site:
        pieces = list(cat.args[0])
        at = pieces.index(gelu)
        lead = list(val(gelu).shape[:-1])
        n_lin = len(inputs)

        def emit(graph: fx.Graph, ins):
            x_n, w_n = ins[0], ins[1]
            b_n = ins[2] if has_bias else None
            others = list(ins[n_lin:])
            if len(lead) != 1:  # x2d is contiguous (checked): its view to the pieces' leading dims
                x_n = graph.call_function(aten.view.default, (x_n, [*lead, val(inputs[0]).shape[-1]]))
            return [graph.call_function(torch.ops.diffusion_fuse.linear_gelu_cat.default,
                                        (x_n, w_n, b_n, others[:at], others[at:], approximate))]

        return Site(pattern=self.name, anchor=gelu, nodes=[*nodes, cat], inputs=inputs + pieces[:at] + pieces[at + 1:],
                    outputs=[cat], emit=emit, op="diffusion_fuse::linear_gelu_cat")


def _last_dim_cat(gelu: fx.Node, x2d_val: torch.Tensor, n: int) -> fx.Node | None:
    """The ``cat`` along the last dim that is ``gelu``'s only user, holding it once among bf16 pieces of its
    leading dims, when the GEMM's input can be viewed to those dims (contiguous) and the gelu's last dim is the
    linear's N (a view to other rows / columns, e.g. [M, N] as [2M, N/2], leaves the cat to ATen); else None."""
    cat = single_user(gelu)
    if not is_op(cat, aten.cat.default) or not x2d_val.is_contiguous() or val(gelu).shape[-1] != n:
        return None
    pieces = cat.args[0]
    ndim = val(gelu).dim()
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    if dim % ndim != ndim - 1 or sum(p is gelu for p in pieces) != 1:
        return None
    lead = tuple(val(gelu).shape[:-1])
    for p in pieces:
        pv = val(p)
        if not isinstance(pv, torch.Tensor) or pv.dtype != torch.bfloat16 or tuple(pv.shape[:-1]) != lead:
            return None
    return cat
