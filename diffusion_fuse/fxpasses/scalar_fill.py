"""The traced graph's fills from a 0-dim CPU tensor constant, made fills with the constant's value.

Assigning a Python number to part of a tensor (Lumina-Image-2.0's ``position_ids[i, a:b, 0] = cap_seq_len``) traces
as ``aten.fill.Tensor(view, lift_fresh_copy(_tensor_constant))``: the number becomes a 0-dim CPU tensor constant of
the graph. On a CUDA graph that constant is the one node off the device, and CUDA graphs refuse the whole graph for
it ("skipping cudagraphs due to cpu device"), so every op of that graph is launched one by one.

``fill_scalars`` rewrites ``aten.fill.Tensor(x, c)``, ``c`` a 0-dim CPU constant of the graph (a ``get_attr``, or
a ``lift_fresh_copy`` of one), to ``aten.fill.Scalar(x, c.item())`` and drops the constant where nothing else
reads it. The backend applies it to the traced graph itself, before the reference is taken (the CUDA-graph check
and the verifier's reference are that graph). Exact by ATen's own definition: ``fill_`` with a CPU 0-dim value
fills with ``value.item()`` (aten/src/ATen/native/Fill.cpp), the scalar ``fill.Scalar`` takes.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

aten = torch.ops.aten


def cpu_scalar_constant(gm: fx.GraphModule, n: object) -> torch.Tensor | None:
    """The 0-dim CPU tensor ``n`` reads when it is a constant of ``gm`` (a ``get_attr``, or a ``lift_fresh_copy``
    of one), else None."""
    if isinstance(n, fx.Node) and n.op == "call_function" and n.target is aten.lift_fresh_copy.default:
        n = n.args[0]
    if not isinstance(n, fx.Node) or n.op != "get_attr":
        return None
    value = getattr(gm, str(n.target), None)
    if not isinstance(value, torch.Tensor) or isinstance(value, FakeTensor) or value.dim() != 0 \
            or value.device.type != "cpu" or value.is_complex():
        return None
    return value


def fill_scalars(gm: fx.GraphModule) -> list[str]:
    """Rewrite ``gm``'s fills from 0-dim CPU constants in place (recompiled); the new fills' names."""
    graph, done = gm.graph, []
    for n in list(graph.nodes):
        if n.op != "call_function" or n.target is not aten.fill.Tensor or len(n.args) != 2 or n.kwargs:
            continue
        value = cpu_scalar_constant(gm, n.args[1])
        if value is None:
            continue
        with unset_fake_temporarily():  # the compile runs under a fake mode; the constant is a real tensor
            number = value.item()
        with graph.inserting_before(n):
            fill = graph.call_function(aten.fill.Scalar, (n.args[0], number))
        fill.meta = dict(n.meta)
        n.replace_all_uses_with(fill)
        source = n.args[1]
        graph.erase_node(n)
        while isinstance(source, fx.Node) and not source.users:  # the lift_fresh_copy, then the constant
            parent = source.args[0] if source.op == "call_function" else None
            graph.erase_node(source)
            source = parent
        done.append(fill.name)
    if done:
        gm.recompile()
    return done
