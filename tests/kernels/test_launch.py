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
