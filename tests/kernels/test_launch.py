"""kernels/launch.py: when the direct launch may replace Triton's runner."""

import types

from diffusion_fuse.kernels.launch import _hooks_set


def test_empty_hook_chains_do_not_block_the_direct_launch():
    from triton import knobs

    # Triton 3.6 keeps a HookChain here even when no hook is set (it is never None)
    assert not _hooks_set(knobs.runtime.launch_enter_hook)
    assert not _hooks_set(knobs.runtime.launch_exit_hook)
    assert not _hooks_set(None)
    assert _hooks_set(types.SimpleNamespace(calls=[print]))
    assert _hooks_set(print)  # an older Triton's plain callable hook


def test_every_launch_is_built_with_eager_numerics():
    import pytest
    import triton
    import triton.language as tl

    from diffusion_fuse.kernels.launch import EAGER_NUMERICS, CachedLaunch
    from diffusion_fuse.kernels.pointwise_ops import DEFAULT_VARIANTS

    @triton.jit
    def k(X, N: tl.constexpr):
        pass

    assert CachedLaunch(k, (1,), {"N": 1}, num_warps=4).options == {**EAGER_NUMERICS, "num_warps": 4}
    assert CachedLaunch(k, (1,), {"N": 1}, enable_reflect_ftz=False).options == EAGER_NUMERICS
    # Triton's defaults (FMA contraction, libdevice's FTZ reflect) are refused, by name
    for key in EAGER_NUMERICS:
        with pytest.raises(ValueError, match=key):
            CachedLaunch(k, (1,), {"N": 1}, **{key: True})
    # the pointwise codegen's default variant is what its launches are built with
    assert (DEFAULT_VARIANTS.fp_fusion, DEFAULT_VARIANTS.reflect_ftz) == (
        EAGER_NUMERICS["enable_fp_fusion"], EAGER_NUMERICS["enable_reflect_ftz"])
