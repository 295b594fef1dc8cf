"""CPU logic checks for diffusion_fuse/kernels/layer_norm_stats.py.

The Triton kernels run under the interpreter (TRITON_INTERPRET=1), which uses numpy float32
arithmetic: tl.fma is a rounded mul then a rounded add, rsqrt is fp32 1/sqrt. So the
all-unfused variant must equal the CPU emulation bit for bit (emulation rsqrt="f32"), which
checks lane layout, push order and the combine tree; fused variants are compared with a
tolerance. The emulation itself is checked against a literal thread-by-thread simulation
of compute_stats and against torch's CPU LayerNorm. Bit-exactness against eager CUDA is
tests/gpu/test_layer_norm_stats_gpu.py's job.

The interpreter's fp32 -> bf16 cast truncates (hardware rounds to nearest even), so bf16
outputs are compared with the emulated fp32 value truncated the same way.

TRITON_INTERPRET must be set before triton is first imported (triton.language's own jit
helpers are decorated at import), so the interpreter runs in a child process: this file run
as ``python test_layer_norm_stats.py --interp-worker IN OUT``, which sets the variable before
importing triton. GPU tests in the same pytest session keep compiled kernels.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton

import importlib.util
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton")


_ROOT = Path(__file__).resolve().parents[2]
DIMS = (32, 64, 520, 1000, 1536, 3072)  # 32/64: fewer vectors than lanes; 520/1000: not multiples of 512
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
UNFUSED = (False, False, 2, False)  # WelfordVariant fields; 2 = COMB_MEAN_NO_FMA
DEFAULT = (True, True, 0, True)


def _load():
    """The kernel module through the package: the interpreter worker imports it with TRITON_INTERPRET=1 set, so
    its kernels are Triton's interpreted functions there."""
    if str(_ROOT) not in sys.path:  # a checkout without an install
        sys.path.insert(0, str(_ROOT))
    return importlib.import_module("diffusion_fuse.kernels.layer_norm_stats")


lns = _load()
tl, triton = lns.tl, lns.triton
load_row_tile, welford_tile_stats = lns.load_row_tile, lns.welford_tile_stats


@triton.jit
def _tile_stats_kernel(X, MEAN, RSTD, N, eps, N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
                       PUSH_MEAN_FMA: tl.constexpr, PUSH_M2_FMA: tl.constexpr, COMB_MEAN: tl.constexpr,
                       COMB_M2_FMA: tl.constexpr, UNIFORM: tl.constexpr):
    # the statistics of a row held in registers (the norm kernels' path), next to layer_norm_exact's loop
    row = tl.program_id(0)
    tile = load_row_tile(X + row * N, 1, N_ITERS, LANES, VEC, N=N, UNIFORM=UNIFORM)
    mean, rstd = welford_tile_stats(tile, N, eps, N_ITERS, LANES, VEC, PUSH_MEAN_FMA=PUSH_MEAN_FMA,
                                    PUSH_M2_FMA=PUSH_M2_FMA, COMB_MEAN=COMB_MEAN, COMB_M2_FMA=COMB_M2_FMA,
                                    UNIFORM=UNIFORM)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


def _tile_stats(x: torch.Tensor, eps: float, variant) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = x.shape
    mean, rstd = (torch.empty(m, dtype=torch.float32) for _ in range(2))
    n_iters = lns.n_iters_for(n)
    _tile_stats_kernel[(m,)](x, mean, rstd, n, eps, N_ITERS=n_iters, LANES=lns.LANES, VEC=lns.VEC,
                             **variant.constexprs(), UNIFORM=lns.is_uniform(n, n_iters))
    return mean, rstd


def _input(rows: int, d: int, dtype: torch.dtype, seed: int, amp: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d, generator=g) * torch.exp(torch.randn(rows, 1, generator=g))
    x = x + 3.0 * torch.randn(rows, 1, generator=g)  # non-zero row means exercise the mean combine
    return (amp * x).to(dtype)


def _affine(d: int, dtype: torch.dtype, which: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = (1 + 0.5 * torch.randn(d, generator=g)).to(dtype) if "w" in which else None
    b = (0.5 * torch.randn(d, generator=g)).to(dtype) if "b" in which else None
    if w is not None:
        w[:4] = torch.tensor([-1.0, 0.0, 1.0, -0.0], dtype=dtype)
    if b is not None:
        b[4:6] = torch.tensor([0.0, -0.0], dtype=dtype)
    return w, b


def _cases() -> dict[str, dict]:
    cases = {}
    for d in DIMS:
        for dt in DTYPES:
            cases[f"unfused-{d}-{dt}"] = dict(d=d, dtype=dt, rows=3, seed=d, eps=1e-6, variant=UNFUSED)
    for d in (64, 1000, 3072):
        for dt in DTYPES:
            cases[f"default-{d}-{dt}"] = dict(d=d, dtype=dt, rows=3, seed=10 + d, eps=1e-5, variant=DEFAULT)
    for dt in DTYPES:
        for which in ("wb", "w", "b"):
            cases[f"affine-{which}-{dt}"] = dict(
                d=1000, dtype=dt, rows=2, seed=7, eps=1e-5, variant=UNFUSED, affine=which, affine_fma=False
            )
        cases[f"affine-fused-{dt}"] = dict(d=1000, dtype=dt, rows=2, seed=7, eps=1e-5, variant=DEFAULT, affine="wb")
    cases["iters-tight"] = dict(d=1000, dtype="bf16", rows=2, seed=3, eps=1e-6, variant=DEFAULT)
    cases["iters-extra"] = dict(d=1000, dtype="bf16", rows=2, seed=3, eps=1e-6, variant=DEFAULT, n_iters=4)
    return cases


CASES = _cases()


def _case_tensors(c: dict):
    dtype = DTYPES[c["dtype"]]
    x = _input(c["rows"], c["d"], dtype, c["seed"])
    w, b = _affine(c["d"], dtype, c.get("affine", ""), seed=c["seed"] + 1)
    return x, w, b


def _run_worker(path_in: str, path_out: str) -> None:
    mod = _load()
    assert type(mod._layer_norm_exact_kernel).__name__ == "InterpretedFunction"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _interp import patch_language_once_per_launch

    patch_language_once_per_launch()
    np.seterr(divide="ignore", invalid="ignore")  # empty lanes: 1/0 and 0*inf, discarded by where()
    payload = torch.load(path_in)
    out = {}
    for name, c in payload["cases"].items():
        x, w, b = payload["inputs"][name]
        out[name] = mod.layer_norm_exact(
            x,
            w,
            b,
            c["eps"],
            variant=mod.WelfordVariant(*c["variant"]),
            affine_fma=c.get("affine_fma", True),
            n_iters=c.get("n_iters"),
        )
        out[f"tile:{name}"] = _tile_stats(x, c["eps"], mod.WelfordVariant(*c["variant"]))
    torch.save(out, path_out)


@pytest.fixture(scope="module")
def interp(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ln_interp")
    path_in, path_out = tmp / "in.pt", tmp / "out.pt"
    torch.save({"cases": CASES, "inputs": {n: _case_tensors(c) for n, c in CASES.items()}}, path_in)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, __file__, "--interp-worker", str(path_in), str(path_out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail(f"interpreter worker failed:\n{proc.stderr[-4000:]}")
    return torch.load(path_out)


def _emulate(name: str, rsqrt: str = "f32"):
    """Emulated (y, mean, rstd); y rounded as the *interpreter* rounds fp32 -> bf16 (truncation)."""
    c = CASES[name]
    x, w, b = _case_tensors(c)
    f32 = [None if t is None else t.float() for t in (x, w, b)]
    y, mean, rstd = lns.emulate_layer_norm(
        *f32, c["eps"], lns.WelfordVariant(*c["variant"]), c.get("affine_fma", True), rsqrt=rsqrt
    )
    if x.dtype == torch.bfloat16:
        y = (y.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)  # exact: low bits zero
    return y, mean, rstd


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = torch.int32 if a.dtype == torch.float32 else torch.int16
    return a.dtype == b.dtype and torch.equal(a.view(view), b.view(view))


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith(("unfused-", "affine-w", "affine-b"))])
def test_interpreter_equals_emulation_unfused(interp, name):
    for got, want in zip(interp[name], _emulate(name)):
        assert _bits_equal(got, want), name


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith("unfused-")])
def test_row_held_in_registers_equals_emulation_unfused(interp, name):
    # load_row_tile + welford_tile_stats, the norm kernels' path: a masked tile where D % 512 != 0 (520, 1000,
    # 1536), fewer vectors than lanes (32, 64), a whole one (3072)
    _, mean, rstd = _emulate(name)
    got_mean, got_rstd = interp[f"tile:{name}"]
    assert _bits_equal(got_mean, mean) and _bits_equal(got_rstd, rstd), name


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith("default-")])
def test_interpreter_close_to_emulation_default(interp, name):
    # interpreter fma = mul+add, emulation fma = fused: a few ulps apart
    _, mean, rstd = interp[name]
    _, me, re = _emulate(name, rsqrt="f64")
    x = _case_tensors(CASES[name])[0]
    scale = x.float().abs().amax(dim=1)
    assert ((mean - me).abs() <= 1e-6 * scale).all()
    torch.testing.assert_close(rstd, re, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dt", DTYPES)
def test_interpreter_affine_close_to_torch(interp, dt):
    name = f"affine-fused-{dt}"
    c = CASES[name]
    x, w, b = _case_tensors(c)
    y_ref = torch.native_layer_norm(x.float(), [c["d"]], w.float(), b.float(), c["eps"])[0]
    tol = 1e-5 if dt == "fp32" else 1e-2
    torch.testing.assert_close(interp[name][0].float(), y_ref, rtol=tol, atol=tol)


def test_extra_iterations_change_nothing(interp):
    for a, b in zip(interp["iters-tight"], interp["iters-extra"]):
        assert _bits_equal(a, b)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("amp", (1e-4, 1.0, 100.0))
def test_emulation_close_to_torch_cpu(d, dt, amp):
    x = _input(4, d, DTYPES[dt], seed=20 + d, amp=amp)
    _, m_ref, r_ref = torch.native_layer_norm(x.float(), [d], None, None, 1e-6)
    scale = x.float().abs().amax(dim=1)
    for v in (DEFAULT, UNFUSED):
        me, re = lns.emulate_layer_norm_stats(x, 1e-6, lns.WelfordVariant(*v))
        assert ((me - m_ref.flatten()).abs() <= 2e-6 * scale).all()
        torch.testing.assert_close(re, r_ref.flatten(), rtol=2e-5, atol=0)


def _literal_cuda_block(row: np.ndarray) -> tuple[np.float32, np.float32]:
    """Thread-by-thread simulation of compute_stats for blockDim (32, 4), unfused arithmetic."""
    f = np.float32
    nvec = row.size // 4

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
        s2 = f(f(a[1] + b[1]) + f(f(f(delta * delta) * a[2]) * nb))
        return mean, s2, cnt

    state = []
    for t in range(128):
        st = (f(0), f(0), f(0))
        for i in range(t, nvec, 128):
            for ii in range(4):
                st = push(st, f(row[4 * i + ii]))
        state.append(st)
    lead = []
    for w in range(4):
        wd = state[32 * w : 32 * w + 32]
        for off in (16, 8, 4, 2, 1):  # shfl_down: lanes past the end read their own value
            wd = [combine(wd[l], wd[l + off] if l + off < 32 else wd[l]) for l in range(32)]
        lead.append(wd[0])
    for off in (2, 1):  # through shared memory: warp y < off merges warp y + off
        lead = [combine(lead[y], lead[y + off]) if y < off else lead[y] for y in range(4)]
    return lead[0][0], lead[0][1]


@pytest.mark.parametrize("d", (64, 1000, 1536))
def test_emulation_equals_literal_thread_simulation(d):
    x = _input(1, d, torch.float32, seed=30 + d)
    mean, m2 = lns.emulate_layer_norm_moments(x, lns.WelfordVariant(*UNFUSED))
    sim_mean, sim_m2 = _literal_cuda_block(x[0].numpy())
    assert mean.item() == float(sim_mean) and m2.item() == float(sim_m2)


def test_eager_uses_vectorized_kernel():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert lns.eager_uses_vectorized_kernel(x, 64)
    assert not lns.eager_uses_vectorized_kernel(x[:, :62].contiguous(), 62)  # N % 4
    flat = torch.randn(4 * 64 + 1, dtype=torch.bfloat16)
    assert not lns.eager_uses_vectorized_kernel(flat[1:].view(4, 64), 64)  # 2-byte offset
    assert not lns.eager_uses_vectorized_kernel(x.double(), 64)
    w = torch.ones(65, dtype=torch.bfloat16)[1:]
    assert not lns.eager_uses_vectorized_kernel(x, 64, w)


def test_variants_are_distinct():
    names = {v.name for v in lns.ALL_VARIANTS}
    assert len(names) == len(lns.ALL_VARIANTS) == 24
    assert lns.DEFAULT_VARIANT in lns.ALL_VARIANTS
    assert lns.WelfordVariant(*DEFAULT) == lns.DEFAULT_VARIANT


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--interp-worker":
        _run_worker(sys.argv[2], sys.argv[3])
    else:
        sys.exit(pytest.main([__file__, "-q"]))
