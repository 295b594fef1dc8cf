"""Runtime rewrite: call ATen ops through torch's generated Python bindings, as eager does.

A traced graph calls ``torch.ops.aten.<op>.<overload>(...)``: ``OpOverload.__call__`` and then the
dispatcher's boxed path, which parses the arguments against the schema at run time. Eager code calls
``torch.add``, ``Tensor.view``, ``F.linear``: generated, unboxed bindings that reach the same ATen
overload and kernel for the same arguments, in about half the host time (CPU: ``aten.view.default``
3.7 µs, ``Tensor.view`` 1.5 µs). Host-bound models (small batches, few tokens: SANA-1.6B at 1024²)
run hundreds of such calls per block.

The table below maps an overload to the binding that dispatches to it, only where the binding takes
the overload's arguments with the same meaning (positionally, and the keywords it lists); other calls
keep the op. ``_to_copy`` to another dtype becomes ``Tensor.to(dtype)``, which makes the same copy.
The verifier checks the rewritten graph end to end and puts the traced calls back if the output
differs (verify/verifier.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

from .base import retarget_calls

aten = torch.ops.aten
_VF = torch._C._VariableFunctions

_LIKE = frozenset({"dtype", "layout", "device", "pin_memory"})

# overload -> (binding, how many positional arguments it takes at most, the keyword arguments it takes
# under the same names); a call with more positional arguments or other keywords keeps the op
BINDINGS: dict[object, tuple[Callable, int, frozenset[str]]] = {
    aten.view.default: (torch.Tensor.view, 2, frozenset()),
    aten.unsqueeze.default: (torch.unsqueeze, 2, frozenset()),
    aten.squeeze.dim: (torch.squeeze, 2, frozenset()),
    aten.permute.default: (torch.permute, 2, frozenset()),
    aten.t.default: (torch.t, 1, frozenset()),
    aten.transpose.int: (torch.transpose, 3, frozenset()),
    aten.expand.default: (torch.Tensor.expand, 2, frozenset()),
    aten.select.int: (torch.select, 3, frozenset()),
    aten.addmm.default: (torch.addmm, 3, frozenset()),
    aten.mm.default: (torch.mm, 2, frozenset()),
    aten.bmm.default: (torch.bmm, 2, frozenset()),
    aten.linear.default: (torch._C._nn.linear, 3, frozenset()),
    aten.add.Tensor: (torch.add, 2, frozenset({"alpha"})),
    aten.sub.Tensor: (torch.sub, 2, frozenset({"alpha"})),
    aten.mul.Tensor: (torch.mul, 2, frozenset()),
    aten.div.Tensor: (torch.div, 2, frozenset()),
    aten.pow.Tensor_Scalar: (torch.pow, 2, frozenset()),
    aten.neg.default: (torch.neg, 1, frozenset()),
    aten.exp.default: (torch.exp, 1, frozenset()),
    aten.sin.default: (torch.sin, 1, frozenset()),
    aten.cos.default: (torch.cos, 1, frozenset()),
    aten.rsqrt.default: (torch.rsqrt, 1, frozenset()),
    aten.tanh.default: (torch.tanh, 1, frozenset()),
    aten.sigmoid.default: (torch.sigmoid, 1, frozenset()),
    aten.cat.default: (torch.cat, 2, frozenset()),
    aten.stack.default: (torch.stack, 2, frozenset()),
    aten.clone.default: (torch.clone, 1, frozenset({"memory_format"})),
    aten.split.Tensor: (_VF.split, 3, frozenset()),
    aten.split_with_sizes.default: (_VF.split_with_sizes, 3, frozenset()),
    aten.native_layer_norm.default: (torch.native_layer_norm, 5, frozenset()),
    aten.mean.dim: (torch.mean, 3, frozenset({"dtype"})),
    aten.sum.dim_IntList: (torch.sum, 3, frozenset({"dtype"})),
    aten.silu.default: (torch._C._nn.silu, 1, frozenset()),
    aten.gelu.default: (torch._C._nn.gelu, 1, frozenset({"approximate"})),
    aten.arange.start: (torch.arange, 2, _LIKE),
    aten.arange.start_step: (torch.arange, 3, _LIKE),
}


def _as_to(n: fx.Node) -> bool:
    """``_to_copy`` with only a dtype that changes x's dtype: ``Tensor.to(dtype)`` makes the same copy."""
    x = n.args[0] if n.args else None
    v = x.meta.get("val") if isinstance(x, fx.Node) else None
    return (len(n.args) == 1 and set(n.kwargs) == {"dtype"} and isinstance(v, torch.Tensor)
            and n.kwargs["dtype"] != v.dtype)


def binding(n: fx.Node) -> tuple | None:
    """``(binding, args, kwargs)`` calling the call node ``n``'s ATen overload through its Python binding, or None."""
    entry = BINDINGS.get(n.target)
    if entry is not None and len(n.args) <= entry[1] and set(n.kwargs) <= entry[2]:
        return entry[0], n.args, n.kwargs
    if n.target is aten._to_copy.default and _as_to(n):
        return torch.Tensor.to, (n.args[0], n.kwargs["dtype"]), {}
    return None


def python_bindings(gm: fx.GraphModule) -> tuple[fx.GraphModule, int]:
    """A copy of ``gm`` whose calls of the table's overloads go through their bindings, and how many."""
    return retarget_calls(gm, binding)
