"""Triton kernels and their launchers; each module states its numerics contract."""

import os


def triton_interpret() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``).

    Then the guards accept CPU tensors, so kernel logic and dispatch can be exercised
    without a GPU (numerics differ: the interpreter's fp32 -> bf16 cast truncates).
    """
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
