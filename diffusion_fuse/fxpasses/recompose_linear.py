"""Runtime rewrite: put ``aten.linear`` back where AOTAutograd spelled it as view → t → addmm → view.

Tracing to ATen decomposes every ``F.linear`` into the ops ``at::linear`` itself runs: for an input of
two dims, ``addmm(bias, x, w.t())``; for a contiguous input of more dims with a 1-D bias,
``_flatten_nd_linear``: ``addmm(bias, x.view(-1, K), w.t()).view(*lead, N)`` (aten/src/ATen/native/
Linear.cpp). Run from Python, that is four op calls (each through ``OpOverload.__call__`` and the
dispatcher) where eager makes one; host-bound models (small batches, few tokens) pay for the
difference. This pass, run on the lossless tier's runtime graph only, replaces each such group by
one ``aten.linear`` call: the same kernels, in the same order, on the same views — only the Python
calls are fewer.

Only the shapes for which ``at::linear`` takes exactly that path are rewritten: a 1-D bias, a 2-D
weight read through ``t``, and an input of two dims, or a contiguous input of three or more dims
(by its traced strides) viewed as ``[prod(lead), K]``, with the addmm's result viewed back to
``[*lead, N]``; the intermediate views and ``t`` have no other reader. The verifier checks the
rewritten graph end to end (verify/verifier.py), and puts the unrewritten one back if it differs.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.fx as fx

aten = torch.ops.aten


def _val(n) -> torch.Tensor | None:
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _only_user(n: fx.Node, user: fx.Node) -> bool:
    return list(n.users) == [user]


def _static(*vals: torch.Tensor) -> bool:
    return all(isinstance(s, int) for v in vals for s in (*v.shape, *v.stride()))


def _match(addmm: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node, fx.Node] | None:
    """(x, weight, bias, node whose value the linear replaces) for an addmm at::linear would emit."""
    if len(addmm.args) != 3 or addmm.kwargs:  # beta/alpha other than 1: not linear's
        return None
    if not all(_val(a) is not None and _static(_val(a)) for a in addmm.args):
        return None  # dynamic shapes: left as traced
    bias, a, wt = addmm.args
    if not (isinstance(wt, fx.Node) and wt.target is aten.t.default and _only_user(wt, addmm)):
        return None
    w, b, av = wt.args[0], _val(bias), _val(a)
    wv = _val(w)
    if b is None or wv is None or av is None or b.dim() != 1 or wv.dim() != 2:
        return None
    if not isinstance(a, fx.Node):
        return None
    if a.target is aten.view.default and _only_user(a, addmm):
        x = a.args[0]
        xv = _val(x)
        users = list(addmm.users)
        if xv is None or not _static(xv) or xv.dim() < 3 or not xv.is_contiguous() or len(users) != 1:
            return None
        out = users[0]
        lead = list(xv.shape[:-1])
        if (out.target is not aten.view.default or list(a.args[1]) != [math.prod(lead), xv.shape[-1]]
                or list(out.args[1]) != lead + [wv.shape[0]]):
            return None
        return x, w, bias, out
    if av.dim() == 2:  # a 2-D input: addmm(bias, x, w.t()) is linear itself
        return a, w, bias, addmm
    return None


def recompose_linear(gm: fx.GraphModule) -> tuple[fx.GraphModule, int]:
    """A copy of ``gm`` with ``aten.linear`` calls in place of the groups above, and how many."""
    matches = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is aten.addmm.default:
            m = _match(n)
            if m is not None:
                matches[m[3]] = m
    if not matches:
        return gm, 0
    graph = fx.Graph()
    graph._codegen = copy.deepcopy(gm.graph._codegen)  # the calling convention stays the traced one
    env: dict[fx.Node, fx.Node] = {}
    for n in gm.graph.nodes:
        if n in matches:
            x, w, b, _ = matches[n]
            env[n] = graph.call_function(aten.linear.default, (env[x], env[w], env[b]))
            env[n].meta.update(n.meta)
        else:
            env[n] = graph.node_copy(n, env.__getitem__)
    graph.eliminate_dead_code()  # the views, t and addmm nothing reads any more
    out = fx.GraphModule(gm, graph)
    out.meta.update(gm.meta)
    return out, len(matches)
