"""Family ``grouped_gemv``: the linears of one short input (a row or two) as one launch.

Every DiT block computes its AdaLN modulation as ``linear(silu(temb))``: FLUX.1-dev 76 times a forward (each
double block's ``norm1`` and ``norm1_context`` [18432, 3072], each single block's ``norm`` [9216, 3072], plus
``norm_out``), Qwen-Image 120, SD3.5 two a block. Each reads a whole weight to make one row, and cuBLAS runs
each as its own launch. ``fxpasses/grouped_gemv.py`` finds them: the ``addmm`` / ``mm`` nodes whose input is
one node of at most 16 rows and whose weights (and biases) are graph inputs (parameters: their addresses do
not change between calls), grouped by that input. A block's ``silu(temb)`` is traced once per block; the pass
first computes identical pure ops on the same input once (the same values: exact by construction, noted in
the report), so that all of them read one node. A group of two or more becomes ``diffusion_fuse::grouped_gemv``
(lowering/grouped_gemv.py) followed by one slice and view per member, placed where the first member was.

Covered ATen form (nn.Linear on a 2-D input, as AOTAutograd traces it)::

    addmm(b_i, x, t(W_i)) | mm(x, t(W_i))      for every i, x one node [M <= 16, K], W_i / b_i graph inputs

Lossless tier only: in tier high the graph is Inductor's, and this family has not been measured there.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .match_utils import aten, is_op, linear_of, val
from .registry import Example, NearMiss, PatternFamily, Site, example_tensor, register_family


def _static_input(n: object) -> bool:
    """A graph input or constant: a parameter whose address stays the same between calls."""
    return isinstance(n, fx.Node) and n.op in ("placeholder", "get_attr")


def member_of(n: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node | None, fx.Node] | None:
    """``(x, weight, bias, t)`` if ``n`` is a linear of the docstring's form, else None. Which of them the kernel
    takes (rows, dtypes, K tiling, alignment) is the op's to say: ``lowering.grouped_gemv.member_problem``."""
    if not is_op(n, aten.addmm.default, aten.mm.default):
        return None
    lin = linear_of(n)
    if lin is None:
        return None
    _mm, _view, x, weight, bias = lin
    xv, wv, yv = val(x), val(weight), val(n)
    if not all(isinstance(v, torch.Tensor) for v in (xv, wv, yv)):
        return None
    if xv.dim() != 2 or wv.dim() != 2 or wv.dtype != xv.dtype or yv.dtype != xv.dtype:
        return None
    if not all(isinstance(s, int) for s in (*xv.shape, *wv.shape)):
        return None
    if not _static_input(weight) or (bias is not None and not _static_input(bias)):
        return None
    return x, weight, bias, n.args[2] if n.target is aten.addmm.default else n.args[1]


@register_family
class GroupedGemv(PatternFamily):
    name = "grouped_gemv"
    tier = "lossless"
    found_by_pass = True
    lossless_only = True
    description = "linears of one short input (AdaLN modulation: linear(silu(temb)) in every block) → one launch"
    variants = (
        "addmm(b, x, t(W)) for every block's modulation, x = silu(temb) [1 or 2 rows]",
        "mm(x, t(W)) (no bias)",
    )


    def example(self) -> Example:
        class Modulations(torch.nn.Module):  # two blocks' AdaLN linears on one silu(temb)
            def __init__(self) -> None:
                super().__init__()
                self.a, self.b = torch.nn.Linear(64, 128), torch.nn.Linear(64, 192)

            def forward(self, temb):
                return self.a(torch.nn.functional.silu(temb)), self.b(torch.nn.functional.silu(temb))

        torch.manual_seed(0)
        return Modulations().to(torch.bfloat16), (example_tensor(1, 64),)

    def match(self, node: fx.Node) -> Site | NearMiss | None:  # pragma: no cover - found by the pass
        return None


def group_site(members: list[fx.Node]) -> Site:
    """The site of a group of linears of one input (graph order): ``grouped_gemv`` where the first was, then
    each member's [M, N_i] slice of the flat output in place of the member."""
    parts = [member_of(n) for n in members]
    x = parts[0][0]
    m = val(x).shape[0]
    sizes = [val(w).shape[0] for _x, w, _b, _t in parts]
    has_bias = [b is not None for _x, _w, b, _t in parts]
    nodes, inputs = [], [x]
    for n, (_x, w, b, t) in zip(members, parts):
        nodes += [t, n] if len(t.users) == 1 else [n]
        inputs += [w] + ([b] if b is not None else [])

    def emit(graph: fx.Graph, ins):
        ws, bs, i = [], [], 1
        for with_bias in has_bias:
            ws.append(ins[i])
            bs.append(ins[i + 1] if with_bias else None)
            i += 2 if with_bias else 1
        flat = graph.call_function(torch.ops.diffusion_fuse.grouped_gemv.default, (ins[0], ws, bs))
        outs, off = [], 0
        for n in sizes:
            piece = graph.call_function(aten.slice.Tensor, (flat, 0, m * off, m * (off + n)))
            outs.append(graph.call_function(aten.view.default, (piece, [m, n])))
            off += n
        return outs

    return Site(pattern=GroupedGemv.name, anchor=members[0], nodes=nodes, inputs=inputs, outputs=list(members),
                emit=emit, op="diffusion_fuse::grouped_gemv", n_ops=1, where=members[0],
                insert_before=members[0])
