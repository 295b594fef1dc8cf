"""Family ``mean_square``: the variance of diffusers' ``RMSNorm``, ``x.float().pow(2).mean(-1, keepdim=True)``.

Becomes ``diffusion_fuse::mean_square`` (lowering/mean_square.py): one pass over x, no fp32 squares written
and read back. Exact: the kernel sums in the order of ATen's reduce kernel (kernels/mean_square.py), and the
verifier checks every site. The rest of the norm (``x * rsqrt(var + eps)``, the cast, the weight) stays for
the pointwise pass.

Covered ATen forms (diffusers ``RMSNorm.forward``: norms over the hidden size, as LTX's and Lumina's, and QK norms
over heads whose tail does not take the variance itself, below)::

    mean.dim(pow.Tensor_Scalar(_to_copy(x, dtype=float32), 2), [-1], True)   # x bf16/fp16 (the cast may have
                                                                               # other users: the op reads x)
    mean.dim(pow.Tensor_Scalar(x, 2), [-1], True)                              # x fp32

The op's static guard (lowering/mean_square.py) keeps the rows its kernel can take. Searched in tier lossless only:
tier high's ``rms_norm_chain`` takes the whole norm, this part included.

Where the norm's tail reads the mean on every element of its rows and the rows fit one program of a generated
kernel (``tail_reads_rows``: rows of 32 to 1024 elements, a power of two; SD3.5's and Qwen-Image's QK norms), the
family leaves the variance to the pointwise pass instead, which computes it in eager's order inside the tail's
kernel (kernels/pointwise.py, ``_row_mean``): x is read once for the whole norm, not once here and again there.
With ``options={"patterns": {"pointwise": False}}`` this family takes it (``yields_to``).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .match_utils import aten, cast_dtype, dtype_of, is_op, single_user, val
from .registry import Example, PatternFamily, Site, example_tensor, register_family

_SOURCE_DTYPES = (torch.bfloat16, torch.float16)


def _last_dim_only(mean: fx.Node) -> bool:
    v = val(mean.args[0])
    dims = mean.args[1] if len(mean.args) > 1 else mean.kwargs.get("dim")
    keepdim = mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)
    if not isinstance(v, torch.Tensor) or not isinstance(dims, (list, tuple)) or len(dims) != 1:
        return False
    return keepdim is True and dims[0] in (-1, v.dim() - 1) and "dtype" not in mean.kwargs


# rows a generated pointwise kernel sums in eager's order (kernels/mean_square.py, ``row_sums``): its programs hold
# whole rows, so a power of two up to the kernel's block
ROW_SIZES_IN_TAIL = (32, 64, 128, 256, 512, 1024)
MIN_ROWS = 16  # fewer rows change eager's reduce order (kernels/mean_square.py)


def _dense(v: torch.Tensor) -> bool:
    """Whether ``v``'s elements fill its storage span without gaps or overlaps (any order of dims)."""
    step = 1
    for n, st in sorted(((n, st) for n, st in zip(v.shape, v.stride()) if n != 1), key=lambda p: p[1]):
        if st != step:
            return False
        step *= n
    return True


def _full_users(n: fx.Node, targets: tuple, numel: int | None = None) -> bool:
    """Every user of ``n`` is one of ``targets`` (with ``numel`` elements, if given)."""
    return bool(n.users) and all(
        is_op(u, *targets) and (numel is None or (val(u) is not None and val(u).numel() == numel)) for u in n.users)


def tail_reads_rows(mean: fx.Node) -> bool:
    """Whether the pointwise pass takes this variance into the norm's tail: ``mean.dim(pow(v, 2), [-1], True)`` in
    fp32 over static rows of ``ROW_SIZES_IN_TAIL``, the squares laid out densely with unit stride along the row,
    read by ``+ eps → rsqrt → * x`` only, whose products have the squares' element count (every element of a
    row reads its mean: a generated kernel's program then holds whole rows)."""
    sq = mean.args[0] if is_op(mean, aten.mean.dim) else None
    if sq is None or not _last_dim_only(mean) or dtype_of(mean) != torch.float32:
        return False
    if not is_op(sq, aten.pow.Tensor_Scalar) or sq.args[1] != 2 or single_user(sq) is not mean:
        return False
    v = val(sq)
    if v is None or v.dtype != torch.float32 or not all(isinstance(k, int) for k in (*v.shape, *v.stride())):
        return False
    if (v.shape[-1] not in ROW_SIZES_IN_TAIL or v.stride(-1) != 1 or v.numel() // v.shape[-1] < MIN_ROWS
            or v.numel() >= 2**31 or not _dense(v)):
        return False
    adds = list(mean.users)
    if not _full_users(mean, (aten.add.Tensor, aten.add.Scalar)) or any(
            len(a.args) != 2 or a.args[0] is not mean or not isinstance(a.args[1], (int, float)) for a in adds):
        return False
    return all(_full_users(a, (aten.rsqrt.default,)) and all(_full_users(r, (aten.mul.Tensor,), v.numel())
                                                             for r in a.users) for a in adds)


@register_family
class MeanSquare(PatternFamily):
    name = "mean_square"
    tier = "lossless"
    lossless_only = True
    yields_to = "pointwise"
    anchors = (aten.mean.dim,)
    description = "x.float().pow(2).mean(-1, keepdim=True) in one pass (diffusers RMSNorm's variance)"
    variants = (
        "mean(pow(_to_copy(x, float32), 2), [-1], keepdim)  (x bf16/fp16)",
        "mean(pow(x, 2), [-1], keepdim)  (x fp32)",
    )


    def example(self) -> Example:
        def variance(x):  # diffusers RMSNorm's variance over a head dim of 64
            return x.to(torch.float32).pow(2).mean(-1, keepdim=True)

        return variance, (example_tensor(2, 8, 4, 64),)

    def near_miss_example(self) -> Example:
        def variance(x):  # a row of 16, shorter than a warp: the kernel leaves it to eager
            return x.to(torch.float32).pow(2).mean(-1, keepdim=True)

        return variance, (example_tensor(2, 8, 4, 16),)

    def yields(self, node: fx.Node) -> bool:
        return tail_reads_rows(node)  # the pointwise pass sums it inside the tail's kernel

    def match(self, node: fx.Node) -> Site | None:
        sq = node.args[0]
        if not (_last_dim_only(node) and is_op(sq, aten.pow.Tensor_Scalar) and sq.args[1] == 2
                and single_user(sq) is node and dtype_of(node) == torch.float32):
            return None
        x, nodes = sq.args[0], [sq, node]
        if cast_dtype(x) == torch.float32 and dtype_of(x.args[0]) in _SOURCE_DTYPES:
            # the kernel converts x on load, as the cast does; a cast the norm's tail also reads
            # (``xf = x.float(); xf * rsqrt(xf.pow(2).mean(...))``) stays for it, and the pointwise pass folds it
            # into that tail: the fp32 copy of x is neither written nor read
            x, nodes = x.args[0], ([x, sq, node] if single_user(x) is sq else nodes)
        elif dtype_of(x) != torch.float32:
            return None

        def emit(graph: fx.Graph, ins):
            return [graph.call_function(torch.ops.diffusion_fuse.mean_square.default, (ins[0],))]

        return Site(pattern=self.name, anchor=node, nodes=nodes, inputs=[x], outputs=[node], emit=emit,
                    op="diffusion_fuse::mean_square")
