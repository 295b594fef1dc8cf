"""Triton kernels and their launchers; each module states its numerics contract.

Triton itself comes through ``optional_triton``: without it the package imports and every op runs its reference.
"""

import os

from .optional_triton import HAVE_TRITON


def triton_interpret() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``, with Triton installed).

    Then the guards accept CPU tensors, so kernel logic and dispatch can be exercised
    without a GPU (numerics differ: the interpreter's fp32 -> bf16 cast truncates).
    """
    return HAVE_TRITON and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
