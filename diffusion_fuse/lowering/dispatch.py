"""Shared dispatch: run a Triton kernel when its guard accepts the inputs, else the reference.

Every path is counted (lowering/counters.py). A kernel that raises (Triton compile error,
launch failure) is disabled for that input key, counted and logged, and the reference
result is returned: the user's forward never sees the exception.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from ..log import get_logger
from . import counters

_log = get_logger("lowering")
_broken: dict[tuple, str] = {}
_broken_lock = threading.Lock()

# Forces the reference path for every op (debugging, A/B checks).
DISABLE_KERNELS_ENV = "DIFFUSION_FUSE_DISABLE_KERNELS"


def kernels_disabled() -> bool:
    return os.environ.get(DISABLE_KERNELS_ENV, "") not in ("", "0")


def dispatch(
    op: str,
    guard: Callable[[], tuple[bool, str]],
    key: tuple,
    kernel: Callable[[], Any],
    reference: Callable[[], Any],
) -> Any:
    if kernels_disabled():
        counters.fallback(op, f"kernels disabled by {DISABLE_KERNELS_ENV}")
        return reference()
    ok, reason = guard()
    if not ok:
        counters.fallback(op, reason)
        return reference()
    broken = _broken.get((op, key))
    if broken is not None:
        counters.fallback(op, f"kernel disabled after error: {broken}")
        return reference()
    try:
        out = kernel()
    except Exception as e:  # noqa: BLE001 - any kernel failure must fall back, not break the forward
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
        with _broken_lock:
            _broken[(op, key)] = msg
        _log.warning("%s: kernel failed for %s, using the reference path: %s", op, key, msg)
        counters.fallback(op, f"kernel error: {msg}")
        return reference()
    counters.kernel_hit(op)
    return out


def clear_broken() -> None:
    with _broken_lock:
        _broken.clear()
