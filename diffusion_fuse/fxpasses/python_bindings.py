"""Runtime rewrite: call ATen ops through torch's generated Python bindings, as eager does.

A traced graph calls ``torch.ops.aten.<op>.<overload>(...)``: ``OpOverload.__call__`` and then the
dispatcher's boxed path, which parses the arguments against the schema at run time. Eager code calls
``torch.add``, ``Tensor.view``, ``F.linear``: generated, unboxed bindings that reach the same ATen
overload and kernel for the same arguments, in about half the host time (CPU: ``aten.view.default``
3.7 µs, ``Tensor.view`` 1.5 µs). Host-bound models (small batches, few tokens: SANA-1.6B at 1024²)
run hundreds of such calls per block.

The table below maps an overload to the binding that dispatches to it, only where the binding takes
the overload's arguments positionally with the same meaning; nodes with keyword arguments keep the
op. The verifier checks the rewritten graph end to end and puts the traced calls back if the output
differs (verify/verifier.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

aten = torch.ops.aten
_VF = torch._C._VariableFunctions

# overload -> (binding, how many positional arguments it takes at most: longer calls keep the op)
BINDINGS: dict[object, tuple[Callable, int]] = {
    aten.view.default: (torch.Tensor.view, 2),
    aten.unsqueeze.default: (torch.unsqueeze, 2),
    aten.squeeze.dim: (torch.squeeze, 2),
    aten.permute.default: (torch.permute, 2),
    aten.t.default: (torch.t, 1),
    aten.transpose.int: (torch.transpose, 3),
    aten.expand.default: (torch.Tensor.expand, 2),
    aten.select.int: (torch.select, 3),
    aten.addmm.default: (torch.addmm, 3),
    aten.mm.default: (torch.mm, 2),
    aten.bmm.default: (torch.bmm, 2),
    aten.linear.default: (torch._C._nn.linear, 3),
    aten.add.Tensor: (torch.add, 2),
    aten.sub.Tensor: (torch.sub, 2),
    aten.mul.Tensor: (torch.mul, 2),
    aten.div.Tensor: (torch.div, 2),
    aten.cat.default: (torch.cat, 2),
    aten.clone.default: (torch.clone, 1),
    aten.split.Tensor: (_VF.split, 3),
    aten.split_with_sizes.default: (_VF.split_with_sizes, 3),
    aten.native_layer_norm.default: (torch.native_layer_norm, 5),
    aten.mean.dim: (torch.mean, 3),
    aten.silu.default: (torch._C._nn.silu, 1),
}


def python_bindings(gm: fx.GraphModule) -> tuple[fx.GraphModule, int]:
    """A copy of ``gm`` whose calls of the table's overloads go through their bindings, and how many."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    n_changed = 0
    for n in gm.graph.nodes:
        new = graph.node_copy(n, env.__getitem__)
        entry = BINDINGS.get(n.target) if n.op == "call_function" else None
        if entry is not None and not n.kwargs and len(n.args) <= entry[1]:
            new.target = entry[0]
            n_changed += 1
        env[n] = new
    if not n_changed:
        return gm, 0
    out = fx.GraphModule(gm, graph)
    out.meta.update(gm.meta)
    return out, n_changed
