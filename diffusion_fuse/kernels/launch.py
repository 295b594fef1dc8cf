"""Launching a Triton kernel for one input layout with little host overhead.

Triton's JIT launcher binds and specializes every argument on every call, host time that grows
with the kernel's arguments. A layout's kernel is fixed once its guard passed, so the first
call goes through the JIT (compiling if needed) and later calls launch the compiled kernel
directly with all arguments, constexprs included, in declaration order.

The direct launch also skips ``CompiledKernel.__getitem__``'s runner (a closure per call, the
current device and stream looked up through Triton's driver, launch hooks read twice): it calls
the compiled kernel's C launcher with its function handle and metadata, on the current stream
of the kernel's device. Where Triton's launch hooks are set (its profiler), or the kernel needs a
scratch buffer, it keeps Triton's runner.
"""

from __future__ import annotations

from typing import Any

import torch

# The numerics every kernel is built with: nvcc's defaults, which eager's CUDA kernels are built with.
# No FMA contraction (a kernel's only FMAs are the explicit ones that reproduce eager's contracted
# expressions), and libdevice without its flush-to-zero reflect. Triton turns the reflect on by default:
# then ``__nv_rsqrtf`` is ``rsqrt.approx.ftz.f32`` and ``__nv_tanhf``/``__nv_sinf`` flush a subnormal input
# to zero, where eager's keep it (tests/gpu/test_pointwise_gpu.py: every fp32 subnormal input).
EAGER_NUMERICS: dict[str, Any] = {"enable_fp_fusion": False, "enable_reflect_ftz": False}


class CachedLaunch:
    """One kernel with its grid and constexprs fixed: the first call compiles through the JIT, later calls launch
    the compiled kernel directly (the module docstring)."""

    def __init__(self, kernel, grid: tuple[int, ...], constexprs: dict[str, Any], **options: Any) -> None:
        names = kernel.arg_names
        n_runtime = len(names) - len(constexprs)
        if set(names[n_runtime:]) != set(constexprs):
            raise ValueError(f"{kernel.__name__}: constexpr parameters must come last ({names[n_runtime:]})")
        overridden = {k: v for k, v in options.items() if k in EAGER_NUMERICS and v != EAGER_NUMERICS[k]}
        if overridden:  # a shipped kernel is built as eager's are: no silent way back to Triton's defaults
            raise ValueError(f"{kernel.__name__}: {overridden} contradicts launch.EAGER_NUMERICS {EAGER_NUMERICS}")
        self.kernel, self.grid, self.constexprs = kernel, grid, constexprs
        self.options = {**EAGER_NUMERICS, **options}
        self.const_args = [constexprs[n] for n in names[n_runtime:]]
        self.grid3 = tuple(grid) + (1,) * (3 - len(grid))
        self.compiled = None
        self._direct: tuple | None = None  # (C launcher, function handle, packed metadata, device index)

    def __call__(self, *args: Any) -> None:
        if self._direct is not None:
            run, function, packed, device = self._direct
            gx, gy, gz = self.grid3
            run(gx, gy, gz, torch._C._cuda_getCurrentRawStream(device), function, packed, None, None, None,
                *args, *self.const_args)
            return
        if self.compiled is not None:
            self.compiled[self.grid3](*args, *self.const_args)
            return
        compiled = self.kernel[self.grid](*args, **self.constexprs, **self.options)
        # Triton's interpreter returns no compiled kernel: keep going through the JIT there.
        self.compiled = compiled if hasattr(compiled, "packed_metadata") else None
        if self.compiled is not None:
            self._direct = _direct_launch(self.compiled, args)


def _direct_launch(compiled, args: tuple) -> tuple | None:
    """What the direct launch needs, or None where Triton's runner must stay (hooks, scratch)."""
    try:
        from triton import knobs

        # Triton 3.6's hooks are HookChain objects, empty unless a profiler added a hook
        if _hooks_set(knobs.runtime.launch_enter_hook) or _hooks_set(knobs.runtime.launch_exit_hook):
            return None
        md = compiled.metadata
        if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
            return None
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        if device.type != "cuda":
            return None
        compiled._init_handles()
        return compiled.run, compiled.function, compiled.packed_metadata, device.index
    except Exception:  # noqa: BLE001 - a Triton version without these attributes keeps the runner
        return None


def _hooks_set(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))
