"""Our ops' calls named in a profiler trace: one ``diffusion_fuse::<op>`` scope per call.

The runtime graph calls each op's ``GuardedKernel`` directly (fxpasses/direct_calls.py), so the dispatcher, which
is what records an op for ``torch.profiler``, never sees our ops: their kernels would show up under whatever ATen op
or scope encloses them. While a profiler records, ``GuardedKernel.__call__`` hands the call to ``named_call``,
which runs it inside a ``diffusion_fuse::<op>`` profiler range (``_RecordFunctionFast``, as Inductor marks its
kernels). When no profiler runs the check is one module attribute read
(``torch.autograd.profiler._is_profiler_enabled``, which the profiler sets on start and clears on stop).
The scope is a host-side record only, so it is safe inside a CUDA graph capture; a replay runs no Python and
records no scope.

``diffusion_fuse.profile`` also sets ``records`` while it profiles: each named call then appends its op's name and
the bytes it reads and writes (its tensor arguments' and outputs' storage spans), which become the op's HBM floor.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.autograd import profiler as autograd_profiler  # noqa: F401  (read by lowering/dispatch.py)

# (op, bytes read, bytes written) per named call while diffusion_fuse.profile collects them, else None
records: list[tuple[str, int, int]] | None = None

_state = threading.local()


def unnamed() -> bool:
    """Whether the current call is not already inside one of our named calls (an op calling another op)."""
    return not getattr(_state, "inside", False)


def tensor_bytes(value: Any) -> int:
    """Bytes of the storage each tensor in ``value`` spans (broadcast and strided views count what they touch)."""
    if isinstance(value, torch.Tensor):
        if value.numel() == 0:
            return 0
        span = 1 + sum((n - 1) * abs(s) for n, s in zip(value.shape, value.stride()))
        return min(span, value.numel()) * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def named_call(kernel: Any, args: tuple) -> Any:
    """``kernel(*args)`` inside a ``diffusion_fuse::<op>`` profiler scope (only called while a profiler records)."""
    outer = getattr(_state, "inside", False)
    _state.inside = True
    try:
        # _RecordFunctionFast, as Inductor's kernel markers: a kernel launched inside it is linked to it by
        # correlation id; a user scope (torch.profiler.record_function) is not, and a Triton launch's driver
        # call may have no runtime event to place it by time
        with torch._C._profiler._RecordFunctionFast("diffusion_fuse::" + kernel.op):
            out = kernel(*args)
    finally:
        _state.inside = outer
    rec = records
    if rec is not None:
        rec.append((kernel.op, tensor_bytes(args), tensor_bytes(out)))
    return out
