"""Family ``merged_linear``: linears that read the same input, run as one GEMM over their stacked weights.

FLUX's double blocks project the 512 text tokens with three linears (``add_q_proj``, ``add_k_proj``,
``add_v_proj``), SD3.5's joint blocks and Qwen-Image's do the same for their text stream. At so few rows
each GEMM fills a fraction of the GPU: cuBLAS tiles a [512, 3072] output into 48 tiles of 128x256 on 132
SMs, so three launches run three partly idle waves where one GEMM over ``cat([w_q, w_k, w_v])`` runs two
full ones. Measured on the H200 (``benchmarks/probe_merged_linear.py``, torch 2.11): FLUX text q/k/v
0.149 ms separately, 0.081 ms merged, and every element bitwise equal; for the image tokens (4096+ rows)
merging gains nothing or loses.

ATen form (AOTAutograd's spelling of ``F.linear`` on a [B, S, K] input)::

    view_i = view(x, [M, K]); t_i = t(w_i); addmm_i = addmm(b_i, view_i, t_i)      for i = 1..n

becomes::

    mm = addmm(cat([b_1..b_n]), view_1, t(cat([w_1..w_n]))); addmm_i = mm[:, off_i : off_i + N_i]

The weights are concatenated in the graph on every call (a cached copy would go stale when a user edits
weights in place through ``.data``, as PEFT's merge does, which bumps no version counter), so the site is
taken only where the wave model below says the GEMM time saved exceeds that copy. Each output is a strided
slice of ``mm``; the ops that read it see the same values. Exactness is the verifier's to judge: a GEMM of
another width may use another cuBLAS kernel, and the site is put back wherever a bit differs.

Wave model (cuBLAS's large-GEMM tiles, 128x256 outputs per SM per wave; ``GEMM_TILE``): a GEMM of n_t
tiles takes ceil(n_t / SMs) waves of about ``2*128*256*K / (SM TFLOP/s)``; merging saves the waves the
separate GEMMs leave partly empty and costs reading and writing the weights once (``COPY_GBPS``). Taken
when saved time > copy time, M <= ``MAX_ROWS`` (where the probe saw gains), for bf16/fp16 (``DTYPES``).
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from .match_utils import aten, is_op, val
from .registry import PatternFamily, Site, register_family

GEMM_TILE = (128, 256)  # output rows x columns one SM computes per wave (cuBLAS's nvjet 128x256 / 256x128)
MAX_ROWS = 2048
SM_TFLOPS = 5.3  # bf16 dense per SM (H200: ~700 TFLOP/s sustained over 132 SMs)
COPY_GBPS = 4000.0  # HBM copy bandwidth (H200, BENCHMARKS.md)
DEFAULT_SMS = 132  # H100/H200, where no CUDA device is visible (the rewrite is judged on fake tensors)
# What the probe measured equal and faster (tensor-core GEMMs); an fp32 or fp64 GEMM of another width
# may sum in another order (fp64 on the CPU does: the verifier put such sites back).
DTYPES = (torch.bfloat16, torch.float16)


def _sms(device: torch.device) -> int:
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_SMS


def merge_saves_time(m: int, k: int, ns: list[int], itemsize: int, sms: int) -> bool:
    """Whether one GEMM of [m, k] x [k, sum(ns)] beats len(ns) GEMMs of [m, k] x [k, n] after the weight copy."""
    if m > MAX_ROWS or len(ns) < 2:
        return False
    tm, tn = GEMM_TILE

    def waves(n: int) -> int:
        return math.ceil(math.ceil(m / tm) * math.ceil(n / tn) / sms)

    wave_s = 2 * tm * tn * k / (SM_TFLOPS * 1e12)
    saved_s = (sum(waves(n) for n in ns) - waves(sum(ns))) * wave_s
    copy_s = 2 * k * sum(ns) * itemsize / (COPY_GBPS * 1e9)  # read the weights, write the stack
    return saved_s > copy_s


def _linear_parts(addmm: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node, fx.Node] | None:
    """(x, view or x, t, weight) of ``addmm(bias, view(x, [M, K]) | x, t(weight))``, or None."""
    if len(addmm.args) != 3 or addmm.kwargs:  # beta/alpha: not a linear
        return None
    bias, a, wt = addmm.args
    if not (is_op(wt, aten.t.default) and len(wt.users) == 1 and isinstance(bias, fx.Node)):
        return None
    x = a.args[0] if is_op(a, aten.view.default) else a
    return (x, a, wt, wt.args[0]) if isinstance(x, fx.Node) and isinstance(wt.args[0], fx.Node) else None


def _static_2d(v) -> bool:
    return isinstance(v, torch.Tensor) and v.dim() == 2 and all(isinstance(s, int) for s in (*v.shape, *v.stride()))


def sibling_linears(anchor: fx.Node) -> list[fx.Node]:
    """The addmms that compute a linear of the same rows as ``anchor`` (same x, same [M, K] view, same dtypes,
    1-D biases, contiguous 2-D weights), ``anchor`` first, in graph order; [] if ``anchor`` is not the first."""
    parts = _linear_parts(anchor)
    if parts is None:
        return []
    x, a, _, w = parts
    av, wv, bv = val(a), val(w), val(anchor.args[0])
    if not (_static_2d(av) and _static_2d(wv) and isinstance(bv, torch.Tensor) and bv.dim() == 1):
        return []
    if av.dtype not in DTYPES:
        return []
    key = (tuple(av.shape), av.dtype, wv.dtype, bv.dtype, wv.shape[1])

    def same(n: fx.Node) -> bool:
        p = _linear_parts(n) if is_op(n, aten.addmm.default) else None
        if p is None or p[0] is not x or (p[1] is not a and p[1].args[1:] != a.args[1:]):
            return False
        v, w_, b_ = val(p[1]), val(p[3]), val(n.args[0])
        return (_static_2d(v) and _static_2d(w_) and w_.is_contiguous() and isinstance(b_, torch.Tensor)
                and b_.dim() == 1 and b_.shape[0] == w_.shape[0]
                and (tuple(v.shape), v.dtype, w_.dtype, b_.dtype, w_.shape[1]) == key)

    if not same(anchor):
        return []
    order = {n: i for i, n in enumerate(anchor.graph.nodes)}
    users = [u for u in x.users if u is not a and is_op(u, aten.view.default)] + [x]
    found = {n for v in users + [a] for n in v.users if same(n)}
    found.add(anchor)
    sibs = sorted(found, key=order.__getitem__)
    return sibs if sibs[0] is anchor and len(sibs) >= 2 else []


@register_family
class MergedLinear(PatternFamily):
    name = "merged_linear"
    tier = "lossless"
    anchors = (aten.addmm.default,)
    description = "linears of the same rows (q/k/v of a short text stream) as one GEMM over stacked weights"
    variants = (
        "addmm(b_i, view(x, [M, K]), t(w_i)) for i = 1..n, one x  →  addmm(cat(b), view(x), t(cat(w))) sliced",
    )

    def match(self, node: fx.Node) -> Site | None:
        sibs = sibling_linears(node)
        if not sibs:
            return None
        av = val(node.args[1])
        ns = [val(_linear_parts(s)[3]).shape[0] for s in sibs]
        if not merge_saves_time(av.shape[0], av.shape[1], ns, av.element_size(), _sms(av.device)):
            return None
        a = node.args[1]
        weights = [_linear_parts(s)[3] for s in sibs]
        biases = [s.args[0] for s in sibs]
        ts = [s.args[2] for s in sibs]
        # the other siblings' own views of x die with them (when nothing else reads them)
        views = [s.args[1] for s in sibs[1:] if s.args[1] is not a and len(s.args[1].users) == 1]
        n = len(sibs)

        def emit(graph: fx.Graph, ins):
            a_n, ws, bs = ins[0], ins[1:1 + n], ins[1 + n:]
            w_cat = graph.call_function(aten.cat.default, (list(ws),))
            b_cat = graph.call_function(aten.cat.default, (list(bs),))
            mm = graph.call_function(aten.addmm.default, (b_cat, a_n, graph.call_function(aten.t.default, (w_cat,))))
            outs, off = [], 0
            for width in ns:
                outs.append(graph.call_function(aten.slice.Tensor, (mm, 1, off, off + width)))
                off += width
            return outs

        return Site(
            pattern=self.name,
            anchor=node,
            nodes=[*views, *ts, *sibs],  # erased in reverse: each after its users
            inputs=[a, *weights, *biases],
            outputs=sibs,
            emit=emit,
            op="aten.addmm (stacked weights)",
            n_ops=1,
            where=node,
        )
