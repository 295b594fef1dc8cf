"""CPU checks of kernels/norm_modulate.py and its dispatch, in Triton's interpreter.

The interpreter must be on before triton is first imported, so the checks run in a child
process (this file with ``--worker``) and report JSON. Numerics are compared within bf16
tolerance here (the interpreter's fp32 -> bf16 cast truncates); bit-exactness is the GPU
tests' job (tests/gpu/test_norm_modulate_gpu.py).
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

CASES = [
    # name, x shape, x dtype, ln_dtype, out_dtype, scale layout, shift?, affine?
    ("flux_bf16", (1, 24, 64), torch.bfloat16, None, None, "b1d", True, False),
    ("flux_no_shift", (2, 9, 64), torch.bfloat16, None, None, "b1d", False, False),
    ("affine_fp16", (1, 5, 1000), torch.float16, None, None, "b1d", True, True),
    ("wan_fp32_ln", (1, 12, 96), torch.bfloat16, torch.float32, torch.bfloat16, "b1d", True, False),
    ("wan22_per_token", (1, 12, 96), torch.bfloat16, torch.float32, torch.bfloat16, "per_token_strided", True, False),
    ("rows_2d_fp32", (7, 2048), torch.float32, None, None, "row", True, False),
    # D % 512 == 0: rows held in registers; normalized in 16 bits, they take the cache hints
    ("uniform_per_token", (2, 5, 1024), torch.bfloat16, torch.float32, torch.bfloat16, "per_token_strided", True,
     False),
    ("uniform_bf16_hints", (2, 3, 512), torch.bfloat16, None, None, "b1d", True, True),
]


def _case_inputs(shape, dtype, ln_dtype, layout, shift, affine, seed=0):
    g = torch.Generator().manual_seed(seed)
    D = shape[-1]
    x = (torch.randn(shape, generator=g) * 3 + 1).to(dtype)
    mod_dtype = torch.float32 if ln_dtype is not None else dtype
    if layout == "b1d":
        sc, sh = (torch.randn(shape[0], 1, D, generator=g).to(mod_dtype) for _ in range(2))
    elif layout == "row":
        sc, sh = (torch.randn(1, D, generator=g).to(mod_dtype) for _ in range(2))
    else:  # Wan2.2 TI2V: squeezed slices of a [B, S, 6, D] tensor
        table = torch.randn(shape[0], shape[1], 6, D, generator=g).to(mod_dtype)
        sc, sh = table[:, :, 1], table[:, :, 0]
    w = torch.randn(D, generator=g).to(ln_dtype or dtype) if affine else None
    b = torch.randn(D, generator=g).to(ln_dtype or dtype) if affine else None
    return x, w, b, sc, sh if shift else None


def worker() -> dict:
    import diffusion_fuse
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.lowering.norm_modulate import SPEC, norm_modulate

    res: dict = {"kernel": {}, "dispatch": {}}
    for name, shape, dtype, ln_dtype, out_dtype, layout, shift, affine in CASES:
        x, w, b, sc, sh = _case_inputs(shape, dtype, ln_dtype, layout, shift, affine)
        args = (x, w, b, 1e-6, sc, sh, ln_dtype, out_dtype)
        ref, got = norm_modulate(*args), SPEC.run_kernel(*args)
        err = float((ref.double() - got.double()).norm() / ref.double().norm())
        res["kernel"][name] = {"dtype": str(got.dtype), "ref_dtype": str(ref.dtype), "shape": list(got.shape),
                               "rel_err": err, "written": bool(torch.isfinite(got).all())}

    op = torch.ops.diffusion_fuse.norm_modulate
    x, _, _, sc, sh = _case_inputs((1, 8, 64), torch.bfloat16, None, "b1d", True, False)
    calls = {
        "ok": (x, sc, sh),
        "non_contiguous": (x.transpose(1, 2).contiguous().transpose(1, 2), sc, sh),
        "strided_rows": (torch.cat([x, x], 1)[:, ::2], sc, sh),
        "float64": (x.double(), sc.double(), sh.double()),
        "odd_D": (x[..., :30].contiguous(), sc[..., :30], sh[..., :30]),
        "scale_strided_D": (x, torch.randn(1, 1, 128).bfloat16()[..., ::2], sh),
    }
    for key, (xx, ss, hh) in calls.items():
        counters.reset()
        out = op(xx, None, None, 1e-6, ss, hh, None, None)
        ref = norm_modulate(xx, None, None, 1e-6, ss, hh, None, None)
        res["dispatch"][key] = {"counters": counters.snapshot(), "equal_to_reference": bool(torch.equal(out, ref))}

    # Whole model, kernels live: the interpreter does not round like eager, so the verifier
    # must reject the sites it cannot prove equal and the output must still be eager's.
    from diffusion_fuse.testing.tiny_models import build

    for dtype, tag in ((torch.bfloat16, "flux_bf16"), (torch.float64, "flux_fp64")):
        model, kwargs = build("flux", dtype)
        report = diffusion_fuse.Report()
        # fp64: only norm_modulate's guard is under test (the fp32 pieces of an fp64 model would
        # run pointwise kernels in the interpreter, whose numerics are not eager's)
        options = {"patterns": {"pointwise": False}} if dtype == torch.float64 else None
        compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(options, report), fullgraph=True)
        with torch.no_grad():
            ref, out = model(**kwargs)[0], compiled(**kwargs)[0]
        res[tag] = {
            "equal": bool(torch.equal(ref, out)),
            "statuses": sorted(s.status for s in report.sites()),
            "reasons": [s.reason for s in report.sites()],
            "counters": report.counters(),
            "table": report.table(),
        }
        torch._dynamo.reset()
    return res


@pytest.fixture(scope="module")
def results():
    return run_worker(__file__)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_kernel_matches_reference_to_tolerance(results, case):
    r = results["kernel"][case]
    assert r["dtype"] == r["ref_dtype"] and r["written"]
    assert r["rel_err"] < 1e-2, r


@pytest.mark.parametrize("key", ["ok", "strided_rows", "non_contiguous"])
def test_guard_accepts_any_row_layout(results, key):
    r = results["dispatch"][key]
    assert r["counters"]["kernel"] == {"norm_modulate": 1} and r["counters"]["fallback"] == {}


@pytest.mark.parametrize("key, reason", [
    ("float64", "unsupported dtype (x torch.float64"),
    ("odd_D", "D=30 (kernel takes multiples of 4"),
    ("scale_strided_D", "scale is not contiguous along D"),
])
def test_guard_rejections_take_the_reference_path_and_are_counted(results, key, reason):
    r = results["dispatch"][key]
    assert r["equal_to_reference"]
    assert r["counters"]["kernel"] == {}
    ((got_reason, n),) = r["counters"]["fallback"]["norm_modulate"].items()
    assert got_reason.startswith(reason) and n == 1, got_reason


def test_model_with_live_kernels_is_still_eager_exact(results):
    r = results["flux_bf16"]
    assert r["equal"]
    assert sum(r["counters"]["kernel"].values()) >= 6  # the verifier ran a kernel at every site
    # The interpreter truncates where CUDA rounds: the verifier catches it and says where.
    assert "rejected" in r["statuses"], r["table"]
    assert any("elements differ; first at [" in why for why in r["reasons"])


def test_model_with_guard_rejected_dtype_is_counted_in_the_report(results):
    r = results["flux_fp64"]
    assert r["equal"] and set(r["statuses"]) == {"kept"}
    assert r["counters"]["kernel"] == {"linear_cat": 2}  # no Triton kernel; linear_cat's op is ATen GEMMs
    reasons = r["counters"]["fallback"]["norm_modulate"]
    assert list(reasons) == ["unsupported dtype (x torch.float64; kernel takes ['torch.bfloat16', 'torch.float16', "
                             "'torch.float32'])"]
    assert "unsupported dtype" in r["table"]


if __name__ == "__main__":
    worker_main(worker)
