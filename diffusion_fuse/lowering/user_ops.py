"""User patterns' replacements at run time: what ``GuardedKernel`` (lowering/dispatch.py) is for built-in ops.

A site of a pattern added with ``diffusion_fuse.register_pattern`` becomes one call of a ``GuardedReplacement``
(fxpasses/fuse_patterns.py): the user's replacement graph, and the site's reference (the search function, traced)
for when it raises. An error there is logged, counted as ``kernel error: ...`` under the pattern's name (the
report's "kernel errors" column) and answered with the reference result: a user's op never fails the forward.
Inside Inductor's graph (tier high) the replacement is inlined instead, for Inductor to compile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch._subclasses.fake_tensor import FakeTensor

from ..log import error_message, get_logger
from . import counters

_log = get_logger("lowering")


class GuardedReplacement:
    """``op(*args)``: ``replacement(*args)``, or ``reference(*args)`` when that raises."""

    def __init__(self, pattern: str, replacement: Callable[..., Any], reference: Callable[..., Any]) -> None:
        self.pattern, self.replacement, self.reference = pattern, replacement, reference
        # FX emits a call_function target under these names
        self.__name__, self.__module__ = f"user_{pattern}", "diffusion_fuse.lowering"

    def __call__(self, *args: Any) -> Any:
        if any(isinstance(a, FakeTensor) for a in args):
            return self.replacement(*args)  # compile time (the outputs' metadata): the user op's fake impl
        try:
            out = self.replacement(*args)
        except Exception as e:  # noqa: BLE001 - a user's op must not break the forward, as a kernel must not
            msg = error_message(e)
            _log.warning("user pattern %s: kernel failed, using the reference path: %s", self.pattern, msg)
            counters.fallback(self.pattern, f"kernel error: {msg}")
            return self.reference(*args)
        counters.kernel_hit(self.pattern)
        return out
