"""CPU logic checks for diffusion_fuse/kernels/layer_norm_stats.py (Triton interpreter).

The interpreter uses numpy float32 arithmetic: tl.fma is a rounded mul then a rounded add,
and rsqrt is fp32 1/sqrt. So the all-unfused variant must match the CPU emulation bit for
bit (with the emulation's rsqrt="f32"), which checks lane layout, push order and combine
tree; the fused variants are only compared with a tolerance. Bit-exactness against eager
CUDA is tests/gpu/test_layer_norm_stats_gpu.py's job.

TRITON_INTERPRET=1 is set for this module only (a module fixture that restores it) and the
kernel module is loaded as a private interpreted copy, so GPU tests in the same session keep
compiled kernels.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

_MOD_PATH = Path(__file__).resolve().parents[2] / "diffusion_fuse" / "kernels" / "layer_norm_stats.py"
_MOD_NAME = "_layer_norm_stats_interpreted"

DIMS = (32, 64, 520, 1000, 1536, 3072)  # 32/64: fewer vectors than lanes; 520/1000: not multiples of 512
DTYPES = (torch.bfloat16, torch.float32)


@pytest.fixture(scope="module")
def lns():
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")  # before the kernels are defined and while they run
    spec = importlib.util.spec_from_file_location(_MOD_NAME, _MOD_PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[_MOD_NAME] = mod
    spec.loader.exec_module(mod)
    with warnings.catch_warnings():
        # empty lanes compute 1/0 and 0*inf before tl.where discards them, as CUDA does
        warnings.simplefilter("ignore", RuntimeWarning)
        np_err = np.seterr(divide="ignore", invalid="ignore")
        try:
            yield mod
        finally:
            np.seterr(**np_err)
            sys.modules.pop(_MOD_NAME, None)
            mp.undo()


def _input(rows: int, d: int, dtype: torch.dtype, seed: int, amp: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d, generator=g) * torch.exp(torch.randn(rows, 1, generator=g))
    x = x + 3.0 * torch.randn(rows, 1, generator=g)  # non-zero row means exercise the mean combine
    return (amp * x).to(dtype)


def _unfused(lns):
    return lns.WelfordVariant(False, False, lns.COMB_MEAN_NO_FMA, False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", DIMS)
def test_interpreter_equals_emulation_unfused(lns, d, dtype):
    x = _input(3, d, dtype, seed=d)
    v = _unfused(lns)
    y, mean, rstd = lns.layer_norm_exact(x, None, None, 1e-6, variant=v)
    ye, me, re = lns.emulate_layer_norm(x, None, None, 1e-6, variant=v, rsqrt="f32")
    assert torch.equal(mean.view(torch.int32), me.view(torch.int32))
    assert torch.equal(rstd.view(torch.int32), re.view(torch.int32))
    assert torch.equal(y, ye)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", (64, 1000, 3072))
def test_interpreter_close_to_emulation_default(lns, d, dtype):
    # interpreter fma = mul+add, emulation fma = fused: a few ulps apart
    x = _input(3, d, dtype, seed=10 + d)
    _, mean, rstd = lns.layer_norm_exact(x, None, None, 1e-5)
    me, re = lns.emulate_layer_norm_stats(x, 1e-5)
    scale = x.float().abs().amax(dim=1)
    assert ((mean - me).abs() <= 1e-6 * scale).all()
    torch.testing.assert_close(rstd, re, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("amp", (1e-4, 1.0, 100.0))
def test_emulation_close_to_torch_cpu(lns, d, dtype, amp):
    x = _input(4, d, dtype, seed=20 + d, amp=amp)
    for v in (lns.DEFAULT_VARIANT, _unfused(lns)):
        me, re = lns.emulate_layer_norm_stats(x, 1e-6, v)
        _, m_ref, r_ref = torch.native_layer_norm(x.float(), [d], None, None, 1e-6)
        scale = x.float().abs().amax(dim=1)
        assert ((me - m_ref.flatten()).abs() <= 2e-6 * scale).all()
        torch.testing.assert_close(re, r_ref.flatten(), rtol=2e-5, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("affine", ("wb", "w", "b"))
def test_affine_interpreter_equals_emulation(lns, dtype, affine):
    d = 1000
    x = _input(2, d, dtype, seed=7)
    g = torch.Generator().manual_seed(8)
    w = (1 + 0.5 * torch.randn(d, generator=g)).to(dtype) if "w" in affine else None
    b = (0.5 * torch.randn(d, generator=g)).to(dtype) if "b" in affine else None
    if w is not None:
        w[:4] = torch.tensor([-1.0, 0.0, 1.0, -0.0], dtype=dtype)
    v = _unfused(lns)
    y, _, _ = lns.layer_norm_exact(x, w, b, 1e-5, variant=v, affine_fma=False)
    ye, _, _ = lns.emulate_layer_norm(x, w, b, 1e-5, variant=v, affine_fma=False, rsqrt="f32")
    assert torch.equal(y, ye)
    y_ref = torch.native_layer_norm(x.float(), [d], None if w is None else w.float(), None if b is None else b.float(), 1e-5)[0]
    torch.testing.assert_close(y.float(), y_ref, rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=1e-2 if dtype != torch.float32 else 1e-5)


def test_extra_iterations_change_nothing(lns):
    x = _input(2, 1000, torch.bfloat16, seed=3)
    a = lns.layer_norm_exact(x, None, None, 1e-6)
    b = lns.layer_norm_exact(x, None, None, 1e-6, n_iters=lns.n_iters_for(1000) + 2)
    for u, w in zip(a, b):
        assert torch.equal(u, w)


def _literal_cuda_block(row: np.ndarray) -> tuple[np.float32, np.float32]:
    """Thread-by-thread simulation of compute_stats for blockDim (32, 4), unfused arithmetic."""
    f = np.float32
    n = row.size
    nvec = n // 4

    def push(st, v):
        mean, s2, cnt = st
        delta = f(v - mean)
        new_cnt = f(cnt + f(1))
        new_mean = f(mean + f(delta * f(f(1) / new_cnt)))
        return new_mean, f(s2 + f(delta * f(v - new_mean))), new_cnt

    def combine(b, a):  # cuWelfordCombine(dataB, dataA)
        delta = f(b[0] - a[0])
        cnt = f(a[2] + b[2])
        if not cnt > 0:
            return f(0), f(0), cnt
        coef = f(f(1) / cnt)
        na, nb = f(a[2] * coef), f(b[2] * coef)
        mean = f(f(na * a[0]) + f(nb * b[0]))
        s2 = f(f(a[1] + b[1]) + f(f(f(f(delta * delta) * a[2])) * nb))
        return mean, s2, cnt

    state = []
    for t in range(128):
        st = (f(0), f(0), f(0))
        for i in range(t, nvec, 128):
            for ii in range(4):
                st = push(st, f(row[4 * i + ii]))
        state.append(st)
    warps = [state[32 * w : 32 * w + 32] for w in range(4)]
    for w in range(4):
        wd = warps[w]
        for off in (16, 8, 4, 2, 1):  # shfl_down: lanes past the end read their own value
            wd = [combine(wd[l], wd[l + off] if l + off < 32 else wd[l]) for l in range(32)]
        warps[w] = wd
    lead = [warps[w][0] for w in range(4)]
    for off in (2, 1):
        lead = [combine(lead[y], lead[y + off]) if y < off else lead[y] for y in range(4)]
    return lead[0][0], lead[0][1]


@pytest.mark.parametrize("d", (64, 1000, 1536))
def test_emulation_equals_literal_thread_simulation(lns, d):
    x = _input(1, d, torch.float32, seed=30 + d)
    mean, m2 = lns.emulate_layer_norm_moments(x, _unfused(lns))
    sim_mean, sim_m2 = _literal_cuda_block(x[0].numpy())
    assert mean.item() == float(sim_mean) and m2.item() == float(sim_m2)


def test_eager_uses_vectorized_kernel(lns):
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert lns.eager_uses_vectorized_kernel(x, 64)
    assert not lns.eager_uses_vectorized_kernel(x[:, :62].contiguous(), 62)  # N % 4
    flat = torch.randn(4 * 64 + 1, dtype=torch.bfloat16)
    assert not lns.eager_uses_vectorized_kernel(flat[1:].view(4, 64), 64)  # 2-byte offset
    assert not lns.eager_uses_vectorized_kernel(x.double(), 64)
    w = torch.ones(65, dtype=torch.bfloat16)[1:]
    assert not lns.eager_uses_vectorized_kernel(x, 64, w)


def test_variants_are_distinct(lns):
    names = {v.name for v in lns.ALL_VARIANTS}
    assert len(names) == len(lns.ALL_VARIANTS) == 24
    assert lns.DEFAULT_VARIANT in lns.ALL_VARIANTS
