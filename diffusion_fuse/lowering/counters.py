"""Runtime counters: how often each op ran its kernel and how often it fell back, and why.

Thread-safe. A fallback reason is logged once per (op, reason) at WARNING when it is a
surprise on CUDA (guard rejection, kernel error) and at DEBUG when it is expected
(a CPU tensor has no Triton kernel).
"""

from __future__ import annotations

import collections
import threading

from ..log import get_logger

_log = get_logger("lowering")
_lock = threading.Lock()
_kernel_hits: collections.Counter[str] = collections.Counter()
_fallbacks: collections.Counter[tuple[str, str]] = collections.Counter()
_logged: set[tuple[str, str]] = set()

EXPECTED_FALLBACKS = ("device is cpu", "device is not cuda")


def kernel_hit(op: str) -> None:
    with _lock:
        _kernel_hits[op] += 1


def fallback(op: str, reason: str) -> None:
    with _lock:
        _fallbacks[(op, reason)] += 1
        first = (op, reason) not in _logged
        _logged.add((op, reason))
    if first:
        level = 10 if reason.startswith(EXPECTED_FALLBACKS) else 30
        _log.log(level, "%s: reference path (%s)", op, reason)


def snapshot() -> dict:
    """{'kernel': {op: n}, 'fallback': {op: {reason: n}}}."""
    with _lock:
        fb: dict[str, dict[str, int]] = {}
        for (op, reason), n in _fallbacks.items():
            fb.setdefault(op, {})[reason] = n
        return {"kernel": dict(_kernel_hits), "fallback": fb}


def diff(after: dict, before: dict) -> dict:
    """Counts in ``after`` minus ``before`` (both from ``snapshot``)."""
    kernel = {op: n - before["kernel"].get(op, 0) for op, n in after["kernel"].items()}
    fb: dict[str, dict[str, int]] = {}
    for op, reasons in after["fallback"].items():
        for reason, n in reasons.items():
            d = n - before["fallback"].get(op, {}).get(reason, 0)
            if d:
                fb.setdefault(op, {})[reason] = d
    return {"kernel": {k: v for k, v in kernel.items() if v}, "fallback": fb}


def reset() -> None:
    with _lock:
        _kernel_hits.clear()
        _fallbacks.clear()
        _logged.clear()
