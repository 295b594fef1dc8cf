"""CPU checks of kernels/gated_residual_norm_modulate.py and its dispatch, in Triton's interpreter.

Tolerance only here (the interpreter's fp32 -> bf16 cast truncates); bit-exactness is
tests/gpu/test_gated_residual_norm_modulate_gpu.py's job.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

import pytest
import torch
from _interp import run_worker, worker_main

CASES = {
    # name: (shape, dtype, gate layout, affine, shift)
    "flux_bf16": ((1, 24, 64), torch.bfloat16, "b1d", False, True),
    "fp32_affine": ((2, 7, 1000), torch.float32, "b1d", True, True),
    "fp16_no_shift": ((1, 9, 3072), torch.float16, "b1d", False, False),
    "per_token_gate_2d": ((33, 512), torch.bfloat16, "full", False, True),
    # an ungated residual (patterns/gated_residual.py, UnitGate): a [1, 1, D] gate of ones in x's dtype
    "unit_gate": ((1, 40, 384), torch.bfloat16, "ones", True, True),
}


def make(shape, dtype, gate_layout, affine, shift, seed=0):
    g = torch.Generator().manual_seed(seed)
    D = shape[-1]
    rn = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    res, x = rn(*shape) * 4, rn(*shape)
    mod_shape = (shape[0], 1, D) if len(shape) == 3 else (1, D)
    gate = rn(*shape) if gate_layout == "full" else rn(*mod_shape)
    if gate_layout == "ones":
        gate = torch.ones((1,) * (len(shape) - 1) + (D,), dtype=dtype)
    sc, sh = rn(*mod_shape), rn(*mod_shape) if shift else None
    w, b = (rn(D), rn(D)) if affine else (None, None)
    return res, x, gate, w, b, 1e-6, sc, sh, None


def worker() -> dict:
    import diffusion_fuse
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.lowering.gated_residual import gated_residual
    from diffusion_fuse.lowering.gated_residual_norm_modulate import SPEC, gated_residual_norm_modulate

    res: dict = {"kernel": {}, "dispatch": {}, "gated_residual": {}}
    for name, spec in CASES.items():
        args = make(*spec)
        ref_r, ref_out = gated_residual_norm_modulate(*args)
        got_r, got_out = SPEC.run_kernel(*args)

        def rel(a, b):
            return float((a.double() - b.double()).norm() / a.double().norm())

        res["kernel"][name] = {"dtypes": [str(t.dtype) for t in (ref_r, got_r, ref_out, got_out)],
                               "r_err": rel(ref_r, got_r), "out_err": rel(ref_out, got_out)}
    op = torch.ops.diffusion_fuse.gated_residual_norm_modulate
    base = make(*CASES["flux_bf16"])
    res_t, x, gate, *rest = base
    calls = {
        "ok": base,
        "x_strided_d": (res_t, torch.cat([x, x], -1)[..., ::2], gate, *rest),
        "shape_mismatch": (res_t[:, :1], x, gate, *rest),
        "float64": tuple(t.double() if isinstance(t, torch.Tensor) else t for t in base),
        # D-major tokens (a patch embedding's flatten(2).transpose(1, 2)): the tile kernel, then the row kernel
        "residual_d_major": (res_t.transpose(1, 2).contiguous().transpose(1, 2), x, gate, *rest),
        # the same with a row-major gate * x first: eager's r is row-major, the tile kernel writes no copy
        "residual_d_major_mul_first": (res_t.transpose(1, 2).contiguous().transpose(1, 2), x, gate, *rest[:-1],
                                       None, None, None, None, None, None, True),
    }
    for key, args in calls.items():
        counters.reset()
        r, out = op(*args)
        ref_r, ref_out = gated_residual_norm_modulate(*args)
        res["dispatch"][key] = {"counters": counters.snapshot(),
                                "equal": bool(torch.equal(r, ref_r) and torch.equal(out, ref_out)),
                                "strides": [r.stride(), ref_r.stride(), out.stride(), ref_out.stride()],
                                "close": bool(torch.allclose(r.float(), ref_r.float(), atol=0.1, rtol=0.02)
                                              and torch.allclose(out.float(), ref_out.float(), atol=0.1, rtol=0.02))}
    # the standalone op (no LayerNorm reads r): the tile kernel alone, r in eager's layout
    residual_d_major = calls["residual_d_major"][0]
    for key, args in {"rows": (res_t, x, gate), "d_major": (residual_d_major, x, gate),
                      "d_major_fp32_r": (residual_d_major, x, gate.float(), None, torch.bfloat16)}.items():
        counters.reset()
        r = torch.ops.diffusion_fuse.gated_residual(*args)
        ref = gated_residual(*args)
        res["gated_residual"][key] = {"counters": counters.snapshot(), "strides": [r.stride(), ref.stride()],
                                      "dtypes": [str(r.dtype), str(ref.dtype)],
                                      "close": bool(torch.allclose(r.float(), ref.float(), atol=0.1, rtol=0.02))}
    del diffusion_fuse
    return res


@pytest.fixture(scope="module")
def results():
    return run_worker(__file__)


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_reference_to_tolerance(results, case):
    r = results["kernel"][case]
    assert r["dtypes"][0] == r["dtypes"][1] and r["dtypes"][2] == r["dtypes"][3]
    assert r["r_err"] < 1e-2 and r["out_err"] < 2e-2, r


def test_guard_accepts_matching_rows(results):
    assert results["dispatch"]["ok"]["counters"]["kernel"] == {"gated_residual_norm_modulate": 1}


@pytest.mark.parametrize("key, strides", [("residual_d_major", [1536, 1, 24]),
                                          ("residual_d_major_mul_first", [1536, 64, 1])])
def test_a_d_major_residual_runs_the_tile_kernel_and_keeps_eagers_layout(results, key, strides):
    r = results["dispatch"][key]
    assert r["counters"]["kernel"] == {"gated_residual_norm_modulate": 1}, r["counters"]
    got_r, ref_r, got_out, ref_out = r["strides"]
    assert got_r == ref_r == strides and got_out == ref_out  # eager's add follows its first operand's layout
    assert r["close"]


@pytest.mark.parametrize("key", ["rows", "d_major", "d_major_fp32_r"])
def test_the_standalone_gated_residual_takes_any_residual_layout(results, key):
    r = results["gated_residual"][key]
    assert r["counters"]["kernel"] == {"gated_residual": 1}, r["counters"]
    assert r["strides"][0] == r["strides"][1] and r["dtypes"][0] == r["dtypes"][1] and r["close"], r
    assert r["strides"][0] == ([64 * 24, 1, 24] if key.startswith("d_major") else [64 * 24, 64, 1])


@pytest.mark.parametrize("key, reason", [
    ("x_strided_d", "x is not contiguous along D"),
    ("shape_mismatch", "residual (1, 1, 64) and x (1, 24, 64) differ in shape"),
    ("float64", "unsupported dtype (x torch.float64"),
])
def test_guard_rejections_take_the_reference_path_and_are_counted(results, key, reason):
    r = results["dispatch"][key]
    assert r["equal"] and r["counters"]["kernel"] == {}
    ((got, n),) = r["counters"]["fallback"]["gated_residual_norm_modulate"].items()
    assert got.startswith(reason) and n == 1, got


if __name__ == "__main__":
    worker_main(worker)
