"""``triton`` and ``triton.language``, or, where Triton is not installed, a stand-in the kernel modules import.

Triton ships wheels for Linux on x86-64 and aarch64 only (pyproject.toml requires it there). Elsewhere
``import diffusion_fuse`` still works and every op runs its reference (lowering/dispatch.py checks ``HAVE_TRITON``
once per layout, after the guard): the kernel modules define their kernels as ``MissingKernel`` objects, so their
constants, guards and planning helpers stay importable; launching a kernel raises ``ModuleNotFoundError`` and
any other use of the stand-in ``AttributeError``, both with ``MISSING_REASON``.

Kernel modules import ``from .optional_triton import tl, triton``. At import time they use only ``triton.jit``
(with or without arguments) and annotations (strings: every kernel module has ``from __future__ import
annotations``); anything else of the stand-in raises.
"""

from __future__ import annotations

from typing import Any

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
    MISSING_REASON = ""
except ImportError as e:
    HAVE_TRITON = False
    MISSING_REASON = (f"Triton is not installed ({e}); `pip install triton` on Linux x86-64 or aarch64 runs the "
                      "kernels")

    class MissingKernel:
        """What ``@triton.jit`` makes of a kernel without Triton: its function, and an error if launched."""

        def __init__(self, fn: Any) -> None:
            self.fn, self.__name__ = fn, getattr(fn, "__name__", "kernel")

        def __getitem__(self, grid: Any) -> Any:
            raise ModuleNotFoundError(f"{self.__name__}: {MISSING_REASON}")

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            raise ModuleNotFoundError(f"{self.__name__}: {MISSING_REASON}")

        def __getattr__(self, name: str) -> Any:
            raise AttributeError(f"{self.__name__}.{name}: {MISSING_REASON}")

    class MissingModule:
        """``triton`` / ``triton.language`` without Triton: ``jit`` makes ``MissingKernel``s, the rest raises."""

        def __init__(self, name: str) -> None:
            self.__name__ = name

        def jit(self, fn: Any = None, **options: Any) -> Any:
            return MissingKernel(fn) if fn is not None else MissingKernel

        def __getattr__(self, name: str) -> Any:
            raise AttributeError(f"{self.__name__}.{name}: {MISSING_REASON}")

    triton = MissingModule("triton")  # type: ignore[assignment]
    tl = MissingModule("triton.language")  # type: ignore[assignment]

__all__ = ["HAVE_TRITON", "MISSING_REASON", "tl", "triton"]
