"""Launching a Triton kernel for one input layout with little host overhead.

Triton's JIT launcher binds and specializes every argument on every call (~30 us here for
kernels with many arguments). A layout's kernel is fixed once its guard passed, so the first
call goes through the JIT (compiling if needed) and later calls launch the compiled kernel
directly with all arguments, constexprs included, in declaration order.
"""

from __future__ import annotations

from typing import Any


class CachedLaunch:
    def __init__(self, kernel, grid: tuple[int, ...], constexprs: dict[str, Any], **options: Any) -> None:
        names = kernel.arg_names
        n_runtime = len(names) - len(constexprs)
        if set(names[n_runtime:]) != set(constexprs):
            raise ValueError(f"{kernel.__name__}: constexpr parameters must come last ({names[n_runtime:]})")
        self.kernel, self.grid, self.constexprs, self.options = kernel, grid, constexprs, options
        self.const_args = [constexprs[n] for n in names[n_runtime:]]
        self.grid3 = tuple(grid) + (1,) * (3 - len(grid))
        self.compiled = None

    def __call__(self, *args: Any) -> None:
        if self.compiled is not None:
            self.compiled[self.grid3](*args, *self.const_args)
            return
        compiled = self.kernel[self.grid](*args, **self.constexprs, **self.options)
        # Triton's interpreter returns no compiled kernel: keep going through the JIT there.
        self.compiled = compiled if hasattr(compiled, "packed_metadata") else None
