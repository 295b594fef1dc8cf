"""Runtime rewrite: call our ops' implementations directly instead of through the dispatcher.

Every ``diffusion_fuse::*`` op has one implementation, registered for every device
(CompositeExplicitAutograd) through ``lowering.dispatch.impl``, which also lists it in
``lowering.dispatch.DIRECT``: the dispatcher would call that same object (a ``GuardedKernel``). Skipping
it saves its per-call cost (boxing the arguments, a Python re-entry), several microseconds an op, which
host-bound models (small batches, few tokens) pay on every call. Only for the lossless tier's inference
graphs (no autograd) whose calls give every schema argument positionally or by name; others keep the op.
"""

from __future__ import annotations

import torch.fx as fx

from ..lowering.dispatch import DIRECT
from .base import retarget_calls


def direct_call(n: fx.Node) -> tuple | None:
    """``(kernel, args, {})`` calling our op's ``GuardedKernel`` for the call node ``n``, or None."""
    kernel = DIRECT.get(n.target)
    args = _full_positional_args(n) if kernel is not None else None
    return None if args is None else (kernel, args, {})


def direct_calls(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` that calls our ops' ``GuardedKernel`` objects directly (``gm`` when none is called)."""
    return retarget_calls(gm, direct_call)[0]


def _full_positional_args(n: fx.Node) -> tuple | None:
    """The node's arguments in schema order with defaults filled, or None (keyword-only arguments)."""
    schema = n.target._schema
    if any(a.kwarg_only for a in schema.arguments) or len(n.args) > len(schema.arguments):
        return None
    args = list(n.args)
    for a in schema.arguments[len(args):]:
        if a.name in n.kwargs:
            args.append(n.kwargs[a.name])
        elif a.has_default_value():
            args.append(a.default_value)
        else:
            return None
    # what the dispatcher's boxing does to a Python int passed as a float argument (a kernel may
    # specialize on the Python type)
    return tuple(float(v) if str(a.type) in ("float", "Optional[float]") and type(v) is int else v
                 for a, v in zip(schema.arguments, args))
