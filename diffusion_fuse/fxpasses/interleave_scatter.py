"""Pass: a tensor built by writing its even and odd elements into ``empty_like`` is the stack of the two.

Wan's RoPE (diffusers ``WanAttnProcessor.apply_rotary_emb``) writes its two halves into a fresh tensor::

    out = torch.empty_like(hidden_states)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos

AOTAutograd makes that ``empty_like``, then per half ``slice(step=2)`` → ``copy`` (the fp32 value cast to
the output dtype) → ``slice_scatter``. The pointwise pass cannot group those three, so eager's fp32 halves,
their casts and two full-size scatters stay (Wan2.1-14B: [1, 32760, 40, 128] for q and for k in each of 40
blocks). This pass rewrites the chain to ``clone(view(stack([to(v0), to(v1)], d + 1), shape))``: the same elements
(``copy`` casts as ``_to_copy`` does, round to nearest even; the two step-2 slices of an even-sized dim cover it,
so nothing of ``empty_like`` is left), and the pointwise pass then takes the whole RoPE (with the QK norm's tail
where the graph has it as pointwise ops: the CPU's composite RMSNorm) as one kernel.

Taken when: the tensor's shape is static (a dynamic-shape graph keeps the chain: the view would need the sizes
as graph values, and the pointwise pass takes no group with symbolic sizes); the dim's size is even;
``empty_like``'s result is contiguous (the stack's view is then
the same layout); each value has its slice's shape (a broadcast one arrives expanded); each intermediate has
only the next step as its user. Exact by construction; lossless tier only (Inductor fuses the chain itself). The
new nodes that hold a value of the reference graph carry its name (the verifier compares sites by it): the
casts ``copy`` and the result ``slice_scatter``.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..log import get_logger
from .base import GraphPass, PassContext, note_rewrites, register_pass
from .fuse_patterns import REF_NAME, _propagate_fake, ref_name

_log = get_logger("fxpasses")
aten = torch.ops.aten


def _only_user(n: fx.Node) -> fx.Node | None:
    users = list(n.users)
    return users[0] if len(users) == 1 else None


def _step2_slice(n: fx.Node, base: fx.Node, start: int) -> int | None:
    """The dim of ``n = aten.slice.Tensor(base, dim, start, end, 2)`` covering ``base`` from ``start``, or None."""
    if n.op != "call_function" or n.target is not aten.slice.Tensor or n.args[0] is not base or n.kwargs:
        return None
    dim, lo, hi, step = (*n.args[1:], *[None] * 4)[:4]
    size = base.meta["val"].shape
    if not isinstance(dim, int) or step != 2 or (lo or 0) != start:
        return None
    dim %= len(size)
    if not isinstance(size[dim], int) or (hi is not None and hi < size[dim]):
        return None
    return dim


def _scatter(n: fx.Node, base: fx.Node, src: fx.Node, dim: int, start: int) -> bool:
    """Whether ``n = aten.slice_scatter(base, src, dim, start, end, 2)`` writes ``src`` back where it was sliced."""
    if n.op != "call_function" or n.target is not aten.slice_scatter.default or n.kwargs:
        return False
    if n.args[0] is not base or n.args[1] is not src:
        return False
    d, lo, hi, step = (*n.args[2:], *[None] * 4)[:4]
    size = base.meta["val"].shape
    return isinstance(d, int) and d % len(size) == dim and (lo or 0) == start and step == 2 \
        and (hi is None or hi >= size[dim])


def _half(base: fx.Node, start: int) -> tuple[fx.Node, fx.Node, fx.Node, int] | None:
    """(value, copy, slice_scatter, dim) of ``base[..., start::2] = value`` among ``base``'s users, or None."""
    for s in base.users:
        dim = _step2_slice(s, base, start)
        copy = _only_user(s) if dim is not None else None
        if copy is None or copy.target is not aten.copy.default or copy.args[0] is not s or copy.kwargs:
            continue
        value = copy.args[1]
        scatter = _only_user(copy)
        if not isinstance(value, fx.Node) or scatter is None or not _scatter(scatter, base, copy, dim, start):
            continue
        sv, vv = s.meta.get("val"), value.meta.get("val")
        if not isinstance(vv, torch.Tensor) or tuple(vv.shape) != tuple(sv.shape):
            continue
        if set(base.users) != {s, scatter}:
            return None
        return value, copy, scatter, dim
    return None


def match(empty: fx.Node):
    """``(v0, copy0, v1, copy1, result, dim)`` of the chain that starts at ``empty``, or None."""
    if empty.op != "call_function" or empty.target is not aten.empty_like.default:
        return None
    ev = empty.meta.get("val")
    if not isinstance(ev, torch.Tensor) or ev.dim() == 0:
        return None
    if not all(isinstance(s, int) for s in ev.shape):  # symbolic sizes: the view's shape would not be code
        return None
    try:
        if not ev.is_contiguous():
            return None
    except Exception:  # noqa: BLE001 - symbolic layout: not judged
        return None
    first = _half(empty, 0)
    if first is None:
        return None
    v0, c0, e1, dim = first
    if ev.shape[dim] % 2:
        return None
    second = _half(e1, 1)
    if second is None or second[3] != dim:
        return None
    v1, c1, e2, _ = second
    return v0, c0, v1, c1, e2, dim


@register_pass
class InterleaveScatterPass(GraphPass):
    name = "interleave_scatter"
    after = ("drop_clones",)  # its result clone carries a reference name: not dropped

    def __call__(self, graph: fx.Graph, ctx: PassContext) -> None:
        if ctx.options.quality != "lossless":
            return
        if not any(n.target is aten.empty_like.default for n in graph.nodes):
            return
        graph.eliminate_dead_code()  # views functionalization left unread would count as more readers
        done = []
        for empty in list(graph.nodes):
            m = match(empty)
            if m is None:
                continue
            v0, c0, v1, c1, e2, dim = m
            dtype, shape = e2.meta["val"].dtype, list(e2.meta["val"].shape)
            new: list[fx.Node] = []
            try:
                with graph.inserting_before(e2):
                    halves = []
                    for v, c in ((v0, c0), (v1, c1)):
                        if v.meta["val"].dtype != dtype:  # copy_ casts as _to_copy does
                            v = graph.call_function(aten._to_copy.default, (v,), {"dtype": dtype})
                            v.meta[REF_NAME] = ref_name(c)
                            new.append(v)
                        halves.append(v)
                    stack = graph.call_function(aten.stack.default, (halves, dim + 1))
                    view = graph.call_function(aten.view.default, (stack, shape))
                    # a computed node holds the result: the pointwise group writes it (a view would leave the stack
                    # as the group's output, a value the reference graph has no node for); unfused, one more copy
                    out = graph.call_function(aten.clone.default, (view,))
                    new += [stack, view, out]
                _propagate_fake(new)
                if any(not isinstance(n.meta.get("val"), torch.Tensor) for n in new):
                    raise RuntimeError("no fake value for the rewrite")
            except Exception as e:  # noqa: BLE001 - the chain stays as traced; never a failed compile
                for n in reversed(new):
                    graph.erase_node(n)
                _log.warning("interleave_scatter: %s left as traced (%s: %s)", e2.name, type(e).__name__, e)
                continue
            out.meta[REF_NAME] = ref_name(e2)
            for k in ("stack_trace", "nn_module_stack", "source_fn_stack"):
                if k in e2.meta:
                    for n in new:
                        n.meta[k] = e2.meta[k]
            e2.replace_all_uses_with(out)
            e1 = c1.args[0].args[0]
            for n in (e2, c1, c1.args[0], e1, c0, c0.args[0], empty):  # the chain, last first
                graph.erase_node(n)
            done.append(e2.name)
        note_rewrites(ctx, self.name, done, "tensor(s) written as even/odd halves into empty_like are the stack of "
                      "the halves (Wan's RoPE; same elements)")
