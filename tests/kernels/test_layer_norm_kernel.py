"""CPU checks of ``diffusion_fuse::layer_norm`` (kernels/norm_modulate.py with HAS_SCALE=False) and its guard, in
Triton's interpreter (a child process, as in test_norm_modulate_kernel.py).

The interpreter's fp32 -> bf16 cast truncates, so 16-bit outputs are compared within tolerance; an fp32 LayerNorm
is compared bitwise against the same kernel's modulated launch with scale 0 (``y * (0 + 1)`` is ``y``) on the
same rows made contiguous, which checks that the unmodulated launch, at any row layout, computes the LayerNorm the
modulated one does (rows of at most 128: that the multi-row kernel computes what a program a row does).
Bit-exactness against eager is tests/gpu/test_layer_norm_gpu.py's job.
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
    # name: (x shape, x dtype, ln_dtype, out_dtype, affine, layout)
    "plain_bf16": ((2, 9, 64), torch.bfloat16, None, None, False, "contiguous"),
    "affine_bf16": ((2, 9, 64), torch.bfloat16, None, None, True, "contiguous"),
    "affine_fp16_rows_2d": ((7, 1000), torch.float16, None, None, True, "contiguous"),
    "fp32_layer_norm": ((1, 12, 96), torch.bfloat16, torch.float32, torch.bfloat16, True, "contiguous"),
    "uniform_bf16": ((2, 3, 512), torch.bfloat16, None, None, True, "contiguous"),  # a row held in registers
    "uniform_fp32": ((2, 3, 1024), torch.float32, None, None, False, "contiguous"),
    "rank4": ((2, 3, 5, 64), torch.bfloat16, None, None, True, "contiguous"),
    "rank4_heads_transposed_b1": ((1, 5, 3, 64), torch.bfloat16, None, None, False, "transpose12"),
    "rank4_heads_transposed": ((2, 5, 3, 64), torch.bfloat16, None, None, True, "transpose12"),
    "rank4_heads_transposed_fp32": ((2, 7, 3, 1024), torch.float32, None, None, False, "transpose12"),
    "rank4_strided_rows": ((2, 3, 10, 64), torch.bfloat16, None, None, True, "every_other_token"),
    "strided_rows_3d": ((2, 10, 96), torch.float32, None, None, True, "every_other_token"),
    # rows of at most 128 (QK norms over a head): 16 rows a program (_short_rows_kernel), a partial last program
    "short_heads_fp32": ((2, 37, 3, 128), torch.float32, None, None, True, "transpose12"),
    "short_72_fp32": ((3, 11, 72), torch.float32, None, None, False, "contiguous"),  # 18 lanes with data
    "short_16_fp32_2d": ((5, 16), torch.float32, None, None, True, "contiguous"),
}


def inputs(shape, dtype, ln_dtype, affine, layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    D = shape[-1]
    x = (torch.randn(shape, generator=g) * 3 + 1).to(dtype)
    if layout == "transpose12":
        x = x.transpose(1, 2)
    elif layout == "every_other_token":
        x = x[..., ::2, :]
    w = b = None
    if affine:
        w, b = ((1 + 0.3 * torch.randn(D, generator=g)).to(ln_dtype or dtype),
                (0.1 * torch.randn(D, generator=g)).to(ln_dtype or dtype))
    return x, w, b


def worker() -> dict:
    import diffusion_fuse  # noqa: F401  (registers the ops)
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.lowering import layer_norm as ln
    from diffusion_fuse.lowering import norm_modulate as nm

    res: dict = {"kernel": {}, "dispatch": {}}
    for name, (shape, dtype, ln_dtype, out_dtype, affine, layout) in CASES.items():
        x, w, b = inputs(shape, dtype, ln_dtype, affine, layout)
        args = (x, w, b, 1e-6, ln_dtype, out_dtype)
        ref, got = ln.layer_norm(*args), ln.SPEC.run_kernel(*args)
        counters.reset()
        op_out = torch.ops.diffusion_fuse.layer_norm(*args)
        zero = torch.zeros(x.shape[-1], dtype=torch.float32)
        r = {"dtype": str(got.dtype), "ref_dtype": str(ref.dtype), "shape": list(got.shape),
             "ref_shape": list(ref.shape), "contiguous": got.is_contiguous(),
             "rel_err": float((ref.double() - got.double()).norm() / ref.double().norm()),
             "op_equals_kernel": bool(torch.equal(op_out, got)), "counters": counters.snapshot(),
             "non_contiguous_x": not x.is_contiguous()}
        if got.dtype == torch.float32 and out_dtype is None:  # fp32 y * (0 + 1) is y: the modulated launch's LN
            rows = x.contiguous().view(-1, x.shape[-1])  # the same rows, read contiguously
            mod = nm.SPEC.run_kernel(rows, w, b, 1e-6, zero, None, ln_dtype, None).view(x.shape)
            r["equals_modulated_with_zero_scale"] = bool(torch.equal(mod.view(torch.int32), got.view(torch.int32)))
        res["kernel"][name] = r

    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 8, 64, generator=g).bfloat16()
    w = torch.randn(64, generator=g).bfloat16()
    calls = {
        "bias_only": (x, None, w, 1e-6, None, None),
        "odd_D": (x[..., :30].contiguous(), None, None, 1e-6, None, None),
        "float64": (x.double(), None, None, 1e-6, None, None),
        "four_row_dims": (torch.randn(2, 3, 4, 5, 64, generator=g).bfloat16().permute(3, 2, 1, 0, 4), None, None,
                          1e-6, None, None),
        "weight_dtype": (x, w.float(), None, 1e-6, None, None),
    }
    for key, args in calls.items():
        counters.reset()
        out = torch.ops.diffusion_fuse.layer_norm(*args)
        res["dispatch"][key] = {"counters": counters.snapshot(),
                                "equal_to_reference": bool(torch.equal(out, ln.layer_norm(*args)))}
    from diffusion_fuse.lowering.spec import static_check

    res["static"] = {key: static_check(torch.ops.diffusion_fuse.layer_norm.default, args)
                     for key, args in calls.items()}
    return res


@pytest.fixture(scope="module")
def results():
    return run_worker(__file__)


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_the_reference_to_tolerance(results, case):
    r = results["kernel"][case]
    assert r["dtype"] == r["ref_dtype"] and r["shape"] == r["ref_shape"] and r["contiguous"], r
    assert r["rel_err"] < 1e-2, r


@pytest.mark.parametrize("case", list(CASES))
def test_the_op_runs_the_kernel_for_every_row_layout(results, case):
    r = results["kernel"][case]
    assert r["op_equals_kernel"] and r["counters"]["kernel"] == {"layer_norm": 1} and not r["counters"]["fallback"]


def test_the_cases_cover_non_contiguous_rows(results):
    assert {k for k, r in results["kernel"].items() if r["non_contiguous_x"]} == {
        "rank4_heads_transposed_b1", "rank4_heads_transposed", "rank4_heads_transposed_fp32", "rank4_strided_rows",
        "strided_rows_3d", "short_heads_fp32"}


@pytest.mark.parametrize("case", [k for k, c in CASES.items() if c[1] == torch.float32 and c[3] is None])
def test_without_scale_the_kernel_normalizes_as_its_modulated_launch(results, case):
    assert results["kernel"][case]["equals_modulated_with_zero_scale"]


@pytest.mark.parametrize("key, reason", [
    ("bias_only", "LayerNorm with bias but no weight"),
    ("odd_D", "D=30 (kernel takes multiples of 4"),
    ("float64", "unsupported dtype (x torch.float64"),
    ("four_row_dims", "x (5, 4, 3, 2, 64) with strides (64, 320, 1280, 3840, 1): its rows span more than three"),
    ("weight_dtype", "weight is not a contiguous [64] torch.bfloat16 tensor"),
])
def test_guard_rejections_take_the_reference_path_and_are_counted(results, key, reason):
    r = results["dispatch"][key]
    assert r["equal_to_reference"] and r["counters"]["kernel"] == {}
    ((got_reason, n),) = r["counters"]["fallback"]["layer_norm"].items()
    assert got_reason.startswith(reason) and n == 1, got_reason


@pytest.mark.parametrize("key, static", [("odd_D", True), ("four_row_dims", True), ("bias_only", False),
                                         ("float64", False), ("weight_dtype", False)])
def test_the_static_guard_names_what_shapes_alone_refuse(results, key, static):
    assert bool(results["static"][key]) == static, results["static"][key]


if __name__ == "__main__":
    worker_main(worker)
