"""Family ``linear_cat``: a ``cat`` of linear layers' outputs along the token dim (joint attention's value tensor).

Dual-stream DiT blocks (FLUX / FLUX.2 double blocks, SD3.5, Qwen-Image) project the text and the image tokens
with their own linears and join them for joint attention: ``value = torch.cat([txt_v, img_v], dim=1)``.
(The query and key are normed and rotated first; families ``rms_norm_cat_rope`` and ``pointwise`` take those
cats.) Eager writes both projections and copies them into the ``cat``. With batch 1, each piece is a
contiguous block of rows of the ``cat``, so the GEMMs can write there directly:
``diffusion_fuse::linear_cat`` (lowering/linear_cat.py) runs the same ``addmm`` calls with ``out=`` their
rows, the same cuBLAS kernel writing the same bits, and the copy is gone.

Covered ATen form (nn.Linear as AOTAutograd traces it, default ``beta``/``alpha``)::

    cat([view(addmm(b_i, x2d_i, t(W_i)), shape_i) | view(mm(x2d_i, t(W_i)), shape_i) | addmm(...), ...], d)

where every dim of the ``cat`` before ``d`` has size 1 (batch 1: a larger batch interleaves the pieces'
rows, left to ATen with a near-miss note), each linear and its view are read only by the ``cat``, and all
pieces share the ``cat``'s dtype.

Both tiers: Inductor (tier high) does not do this itself (its ``cat`` copies GEMM outputs, whose layouts are
fixed, into the buffer); it runs the op as an external kernel. With ``options={"side_stream": True}`` the op runs
on the main stream, the text projection with it (the side-stream pass sees one GEMM op of all the rows).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .match_utils import aten, is_op, linear_of, single_user, val
from .registry import Example, NearMiss, PatternFamily, Site, example_tensor, register_family

VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _views_above_linear(piece: fx.Node) -> list[fx.Node] | None:
    """``[piece, ..., mm]``: the views from ``piece`` down to a linear's ``addmm`` / ``mm`` (nn.Linear's ``view``
    back to [B, S, N], then e.g. ``unflatten`` to heads); None if ``piece`` is not one. Views of the GEMM's fresh
    contiguous output keep its elements' order."""
    chain = [piece]
    while is_op(chain[-1], *VIEWS) and len(chain) <= 8:
        chain.append(chain[-1].args[0])
    return chain if not is_op(chain[-1], *VIEWS) and linear_of(chain[-1]) is not None else None


@register_family
class LinearCat(PatternFamily):
    name = "linear_cat"
    tier = "lossless"
    kernel = None  # cuBLAS writes each GEMM into its rows of the cat buffer
    anchors = (aten.cat.default,)
    description = "cat of linears along the token dim (joint attention's value): each GEMM writes its rows"
    variants = (
        "cat([view(addmm(b, x2d, t(W)), [1, S_i, ...]), ...], 1)",
        "cat([view(mm(x2d, t(W)), [1, S_i, ...]), ...], 1)",
        "cat([addmm(b, x, t(W)), ...], 0)  (2-D)",
    )


    def example(self) -> Example:
        class JointValue(torch.nn.Module):  # text and image value projections joined along the tokens (batch 1)
            def __init__(self) -> None:
                super().__init__()
                self.txt, self.img = torch.nn.Linear(32, 64), torch.nn.Linear(32, 64)

            def forward(self, txt, img):
                return torch.cat([self.txt(txt), self.img(img)], dim=1)

        torch.manual_seed(0)
        return JointValue().to(torch.bfloat16), (example_tensor(1, 4, 32), example_tensor(1, 8, 32, seed=1))

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        pieces = node.args[0]
        out = val(node)
        if not isinstance(out, torch.Tensor) or len(pieces) < 2 or len(set(pieces)) != len(pieces):
            return None
        chains = [_views_above_linear(p) for p in pieces]
        if any(c is None for c in chains):
            return None
        linears = [linear_of(c[-1]) for c in chains]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        dim %= out.dim()
        if any(not isinstance(s, int) or s != 1 for s in out.shape[:dim]):
            return NearMiss(self.name, node, f"the cat's dims before dim {dim} are {list(out.shape[:dim])}, "
                                             "not all 1: its pieces are not contiguous blocks of rows")
        for p, chain in zip(pieces, chains):
            for n in chain:
                if n is not p and single_user(n) is None:
                    return NearMiss(self.name, node, f"{n.name} has {len(n.users)} users (needs 1: the cat)")
            if single_user(p) is not node:
                return NearMiss(self.name, node, f"{p.name} has {len(p.users)} users (needs 1: the cat)")
            if val(p) is None or val(p).dtype != out.dtype:
                return NearMiss(self.name, node, f"{p.name} is not of the cat's dtype {out.dtype}")
        nodes, inputs = [], []
        has_bias = [lin[4] is not None for lin in linears]
        for chain, (_mm, _view, x2d, weight, bias) in zip(chains, linears):
            nodes += chain
            inputs += [x2d, weight] + ([bias] if bias is not None else [])
        inner = list(out.shape[dim + 1:])
        if not all(isinstance(s, int) for s in inner):
            return NearMiss(self.name, node, f"the cat's dims after dim {dim} are symbolic ({inner})")

        def emit(graph: fx.Graph, ins):
            xs, ws, bs, i = [], [], [], 0
            for with_bias in has_bias:
                xs.append(ins[i])
                ws.append(ins[i + 1])
                bs.append(ins[i + 2] if with_bias else None)
                i += 3 if with_bias else 2
            return [graph.call_function(torch.ops.diffusion_fuse.linear_cat.default, (xs, ws, bs, dim, inner))]

        return Site(pattern=self.name, anchor=node, nodes=[*nodes, node], inputs=inputs, outputs=[node], emit=emit,
                    op="diffusion_fuse::linear_cat")
