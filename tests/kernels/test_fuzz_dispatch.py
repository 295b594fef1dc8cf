"""Fuzzing the ops' guards and kernels in Triton's interpreter (seeded, fixed budget).

Random shapes (0 and 1 rows, odd D, D above the kernel limit), strides (transposed, sliced,
broadcast scale/shift, storage offsets), dtypes (bf16, fp16, fp32, mixed, fp64). Every call
must return: the kernel's result (same dtype/shape, within bf16 tolerance of the reference in
the interpreter) when the guard accepts, and the reference result bit for bit when it does
not. Nothing may raise, except where eager itself rejects the inputs (e.g. a LayerNorm weight
of another dtype than its input): then the op raises eager's error, from the reference path.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

import random

import pytest
import torch
from _interp import run_worker, worker_main

N_CASES = 120
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def random_case(rng: random.Random):
    B, S = rng.choice([1, 2]), rng.choice([0, 1, 3, 9])
    D = rng.choice([4, 30, 64, 96, 520, 16388])
    if D == 16388:
        B, S = 1, 1
    dt = rng.choice(DTYPES + [torch.float64] * (rng.random() < 0.1))
    mod_dt = rng.choice([dt, torch.float32])
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))

    def rn(*shape, dtype=dt):
        return torch.randn(*shape, generator=g).to(dtype)

    layout = rng.choice(["contiguous", "transposed", "sliced", "offset"])
    if layout == "transposed":
        x = rn(B, D, S).transpose(1, 2)
    elif layout == "sliced":
        x = rn(B, S, D + 2)[..., 2:]
    elif layout == "offset":
        x = rn(B * S * D + 1)[1:].view(B, S, D)  # contiguous but not 16-byte aligned
    else:
        x = rn(B, S, D)
    sform = rng.choice(["b1d", "per_token", "expanded", "row"])
    if sform == "b1d":
        sc, sh = rn(B, 1, D, dtype=mod_dt), rn(B, 1, D, dtype=mod_dt)
    elif sform == "per_token":
        t = rn(B, S, 6, D, dtype=mod_dt)
        sc, sh = t[:, :, 1], t[:, :, 0]
    elif sform == "expanded":
        sc, sh = rn(1, 1, D, dtype=mod_dt).expand(B, S, D), rn(D, dtype=mod_dt)
    else:
        sc, sh = rn(D, dtype=mod_dt), rn(D, dtype=mod_dt)
    shift = sh if rng.random() < 0.8 else None
    affine = rng.random() < 0.3
    ln_dtype = torch.float32 if (mod_dt == torch.float32 and rng.random() < 0.5) else None
    w = rn(D, dtype=ln_dtype or dt) if affine else None
    b = rn(D, dtype=ln_dtype or dt) if affine and rng.random() < 0.8 else None
    out_dtype = rng.choice([None, dt])
    eps = rng.choice([1e-6, 1e-5])
    if rng.random() < 0.5:
        return "norm_modulate", (x, w, b, eps, sc, shift, ln_dtype, out_dtype)
    residual = rn(B, S, D)
    gate = rn(B, 1, D, dtype=mod_dt)
    return "gated_residual_norm_modulate", (residual, x, gate, w, b, eps, sc, shift, out_dtype)


def worker() -> dict:
    import diffusion_fuse  # noqa: F401  (registers the ops)
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.lowering.gated_residual_norm_modulate import gated_residual_norm_modulate
    from diffusion_fuse.lowering.norm_modulate import norm_modulate

    refs = {"norm_modulate": norm_modulate, "gated_residual_norm_modulate": gated_residual_norm_modulate}
    rng = random.Random(1234)
    rows = []
    for i in range(N_CASES):
        op, args = random_case(rng)
        counters.reset()
        try:
            ref = refs[op](*args)
        except Exception as e:  # noqa: BLE001 - eager rejects these inputs: the op must say the same
            try:
                getattr(torch.ops.diffusion_fuse, op)(*args)
                rows.append({"case": i, "op": op, "error": f"eager raised {e!r}, the op did not"})
            except Exception as e2:  # noqa: BLE001
                same = type(e2) is type(e) and str(e2) == str(e)
                rows.append({"case": i, "op": op, "path": "eager raises", "same_error": same})
                if not same:
                    rows[-1]["error"] = f"{e2!r} instead of eager's {e!r}"
            continue
        try:
            got = getattr(torch.ops.diffusion_fuse, op)(*args)
        except Exception as e:  # noqa: BLE001 - recorded: the test asserts there is none
            rows.append({"case": i, "op": op, "error": f"{type(e).__name__}: {e}"})
            continue
        snap = counters.snapshot()
        path = "kernel" if snap["kernel"] else "fallback: " + next(iter(snap["fallback"][op]))
        got_t = got if isinstance(got, tuple) else (got,)
        ref_t = ref if isinstance(ref, tuple) else (ref,)
        same_meta = all(a.dtype == b.dtype and a.shape == b.shape for a, b in zip(ref_t, got_t))
        bitwise = same_meta and all(torch.equal(a, b) or (a.isnan() == b.isnan()).all() and
                                    torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in zip(ref_t, got_t))
        err = max((float((a.double() - b.double()).norm() / (a.double().norm() + 1e-30))
                   for a, b in zip(ref_t, got_t) if a.numel()), default=0.0) if same_meta else None
        rows.append({"case": i, "op": op, "path": path, "same_meta": same_meta, "bitwise": bool(bitwise),
                     "rel_err": err})
    return {"rows": rows}


@pytest.fixture(scope="module")
def results():
    return run_worker(__file__)


def test_no_call_raises(results):
    errors = [r for r in results["rows"] if "error" in r]
    assert not errors, errors[:3]


def test_fallbacks_are_the_reference_bit_for_bit(results):
    bad = [r for r in results["rows"] if r.get("path", "").startswith("fallback") and not r["bitwise"]]
    assert not bad, bad[:3]


def test_kernel_results_have_eager_dtype_shape_and_values(results):
    kernel = [r for r in results["rows"] if r.get("path") == "kernel"]
    bad = [r for r in kernel if not r["same_meta"] or r["rel_err"] > 2e-2]
    assert not bad, bad[:3]


def test_both_paths_and_many_guard_reasons_were_exercised(results):
    paths = [r.get("path", "") for r in results["rows"]]
    reasons = {p.split(" (")[0].split("=")[0] for p in paths if p.startswith("fallback")}
    assert sum(p == "kernel" for p in paths) >= 20
    assert len(reasons) >= 4, reasons


if __name__ == "__main__":
    worker_main(worker)
