"""Shared dispatch: run a Triton kernel when its guard accepts the inputs, else the reference.

``GuardedKernel`` keeps, per input layout (shapes, strides, dtypes, alignment), the guard's
verdict and a prepared launch, so the per-call cost is one dict lookup plus the launch: the
guard and the launch constants are computed once per layout, not per call.

Every path is counted (lowering/counters.py). A kernel that raises (Triton compile error,
launch failure), or whose planning raises (a probe launch, a device table), is disabled for that
layout, counted and logged, and the reference result is returned: the user's forward never sees
the exception. Without Triton (kernels/optional_triton.py) a layout the guard accepts takes the
reference path (counted, and logged once per op) unless the op's kernel is not Triton's (``linear_cat``).

Triton compiles and launches on the current CUDA device, whatever device the tensors are on. On a
host with several GPUs the current device is part of the layout, and a layout whose tensors are on
another device takes the reference path (logged): ``pipe.to("cuda:1")`` without
``torch.cuda.set_device(1)`` stays correct, only slower.

Faults can be injected into an op's output or its kernel (lowering/faults.py,
``DIFFUSION_FUSE_FAULT``) to check that the verifier and this fallback catch them.

A layout first seen inside a CUDA graph capture is not planned there (diffusion_fuse/cudagraphs.py).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import torch

from ..kernels.optional_triton import HAVE_TRITON, MISSING_REASON
from ..log import error_message, get_logger
from . import counters, faults, precompile, profiling

_log = get_logger("lowering")

# Forces the reference path for every op (debugging, A/B checks).
DISABLE_KERNELS_ENV = "DIFFUSION_FUSE_DISABLE_KERNELS"
_MAX_PLANS = 4096


CAPTURE_FALLBACK = "layout first seen during a CUDA graph capture"
DISABLED = "kernel disabled after error"  # a layout's reason once its kernel (or its planning) has raised


def capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_kernels_disabled = False


def refresh_kernels_disabled() -> bool:
    """Re-read ``DIFFUSION_FUSE_DISABLE_KERNELS`` (read once at import, like ``DIFFUSION_FUSE_FAULT``:
    an op call pays no environment lookup)."""
    global _kernels_disabled
    _kernels_disabled = os.environ.get(DISABLE_KERNELS_ENV, "") not in ("", "0")
    return _kernels_disabled


def kernels_disabled() -> bool:
    return _kernels_disabled


refresh_kernels_disabled()

_multi_gpu: bool | None = None


def multi_gpu() -> bool:
    """Whether this process sees more than one CUDA device (asked once: a single-GPU host pays nothing)."""
    global _multi_gpu
    if _multi_gpu is None:
        _multi_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 1
    return _multi_gpu


def off_device_reason(args: tuple, current: int) -> str:
    """Why a kernel must not launch for ``args`` with CUDA device ``current`` current, or "" (tensors in
    lists count too)."""
    for a in args:
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor) and t.device.type == "cuda" and t.device.index != current:
                return (f"tensor on {t.device} while the current device is cuda:{current} (Triton launches on the "
                        f"current device: torch.cuda.set_device({t.device.index}) lets the kernel run)")
    return ""


# op overload -> its one implementation: what the lossless tier's runtime graph calls directly
# (fxpasses/direct_calls.py)
DIRECT: dict[Any, Callable[..., Any]] = {}


class GuardedKernel:
    """``op(*args)``: the kernel for layouts ``guard`` accepts, the reference for the rest (lowering/spec.py).

    layout_key(args) -> hashable   everything the guard and the launch plan depend on
    guard(a) -> (ok, reason)       ``a``: the arguments bound by name (``bind(args)``)
    plan(a) -> launch              launch(a) -> output, with per-layout constants baked in
    reference(*args) -> output     the ATen composition the op replaced
    """

    def __init__(self, op: str, layout_key: Callable[[tuple], Any], guard: Callable[[Any], tuple[bool, str]],
                 plan: Callable[[Any], Callable[[Any], Any]], reference: Callable[..., Any],
                 bind: Callable[[tuple], Any], needs_triton: bool = True) -> None:
        self.op, self.layout_key, self.guard, self.plan, self.reference = op, layout_key, guard, plan, reference
        self.bind, self.needs_triton = bind, needs_triton
        faults.add_target(op)
        # FX emits a call_function target under these names (fxpasses/direct_calls.py puts this object in graphs)
        self.__name__, self.__module__ = f"{op}_guarded", "diffusion_fuse.lowering"
        self._plans: dict[tuple, tuple[str, Callable[..., Any] | None]] = {}
        self._lock = threading.Lock()

    def _key(self, args: tuple) -> tuple:
        key = self.layout_key(args)
        return (key, torch.cuda.current_device()) if multi_gpu() else key

    def _entry(self, args: tuple) -> tuple[str, Callable[..., Any] | None]:
        key = self._key(args)
        entry = self._plans.get(key)
        if entry is None:
            if capturing():
                # Planning may compile the kernel or ask the device something (host sync): never
                # inside a CUDA graph capture. The warm-up run plans every layout first; one seen
                # only now takes the reference path in this capture, and is planned outside it.
                return CAPTURE_FALLBACK, None
            entry = self._new_entry(args)
            with self._lock:
                if len(self._plans) >= _MAX_PLANS:
                    self._plans.clear()
                self._plans[key] = entry
        return entry

    def _new_entry(self, args: tuple) -> tuple[str, Callable[..., Any] | None]:
        """(reason, None) for the reference path, or ("", launch)."""
        reason = off_device_reason(args, torch.cuda.current_device()) if multi_gpu() else ""
        if reason:
            _log.warning("%s: %s; using the reference path", self.op, reason)
            return reason, None
        a = self.bind(args)
        ok, reason = self.guard(a)
        if not ok:
            return reason, None
        if self.needs_triton and not HAVE_TRITON:  # a layout the kernel takes, on a machine without Triton
            return MISSING_REASON, None
        try:
            return "", self.plan(a)
        except Exception as e:  # noqa: BLE001 - planning may compile and launch (a probe): never the forward's error
            msg = error_message(e)
            _log.warning("%s: planning the kernel failed, using the reference path: %s", self.op, msg)
            return f"{DISABLED}: {msg}", None

    def __call__(self, *args: Any) -> Any:
        if profiling.autograd_profiler._is_profiler_enabled and profiling.unnamed():  # name the call in the trace
            return profiling.named_call(self, args)
        if precompile.collecting():  # the verifier's dry run: launches that would compile record it; nothing counted
            reason, launch = self._entry(args)
            if launch is None:
                return self.reference(*args)
            with precompile.launching():
                return launch(self.bind(args))
        fault = faults.active(self.op)  # None unless a fault is injected (lowering/faults.py)
        if fault is not None:
            return self._call_with_fault(fault, args)
        if kernels_disabled():
            counters.fallback(self.op, f"kernels disabled by {DISABLE_KERNELS_ENV}")
            return self.reference(*args)
        reason, launch = self._entry(args)
        if launch is None:
            counters.fallback(self.op, reason)
            return self.reference(*args)
        try:
            out = launch(self.bind(args))
        except Exception as e:  # noqa: BLE001 - any kernel failure must fall back, not break the forward
            return self._kernel_failed(e, args)
        counters.kernel_hit(self.op)
        return out

    def _kernel_failed(self, e: Exception, args: tuple, disable: bool = True) -> Any:
        msg = error_message(e)
        if disable:
            with self._lock:
                self._plans[self._key(args)] = (f"{DISABLED}: {msg}", None)
        _log.warning("%s: kernel failed, using the reference path: %s", self.op, msg)
        counters.fallback(self.op, f"kernel error: {msg}")
        return self.reference(*args)

    def _call_with_fault(self, fault: faults.Fault, args: tuple) -> Any:
        """``__call__`` with an injected fault (lowering/faults.py).

        perturb: the output of whichever path runs is altered. raise: the kernel fails and is
        handled as a real kernel error (reference result, counted, logged, the layout's kernel
        disabled). Where no kernel would run (CPU, guard rejection) the reference path stands
        in for it: it fails once per layout, then counts as disabled while the fault lasts.
        """
        if kernels_disabled():
            reason, launch = f"kernels disabled by {DISABLE_KERNELS_ENV}", None
        else:
            reason, launch = self._entry(args)
        if fault.kind == "raise" and not reason.startswith(DISABLED):
            if launch is not None:
                return self._kernel_failed(fault.error(), args)
            key = self._key(args)
            if key not in fault.failed:
                fault.failed.add(key)
                return self._kernel_failed(fault.error(), args, disable=False)
            reason = f"{DISABLED}: {error_message(fault.error())}"
        if launch is None:
            counters.fallback(self.op, reason)
            return fault.apply(self.reference(*args))
        try:
            out = launch(self.bind(args))
        except Exception as e:  # noqa: BLE001 - as in __call__
            return fault.apply(self._kernel_failed(e, args))
        counters.kernel_hit(self.op)
        return fault.apply(out)


def impl(lib: torch.library.Library, name: str, kernel: Callable[..., Any]) -> None:
    """Register ``kernel`` as op ``diffusion_fuse::<name>``'s implementation (every device, inference),
    and let graphs call it directly (fxpasses/direct_calls.py): the dispatcher would call this same object."""
    lib.impl(name, kernel, "CompositeExplicitAutograd")
    DIRECT[getattr(torch.ops.diffusion_fuse, name).default] = kernel
