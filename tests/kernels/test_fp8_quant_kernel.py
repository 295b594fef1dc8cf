"""CPU checks of the FP8 quant kernels (kernels/static_quant.py, kernels/cat_quant.py, the norm kernels' quant
epilogue in kernels/fp8_quant.py) and their dispatch, in Triton's interpreter (a child process, see _interp.py).

The interpreter's fp32 → e4m3 cast rounds ties away from zero where the GPU rounds to even, drops
the carry when rounding up crosses a power of two (125.6 → 64 instead of 128), and its bf16 cast
truncates (which moves the norm kernels' quantizer inputs): e4m3 outputs are compared by relative L2
error (< 20%; the scales used differ by 5x or more, so a wrong scale or output plane is far off), NaN
and Inf in the same places;
NaN bits (written explicitly by the kernels) are compared exactly.
Bit-exactness is tests/gpu/test_fp8_quant_gpu.py's job.
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


def _close(ref: torch.Tensor, got: torch.Tensor, rtol: float) -> bool:
    """Same NaN/Inf places and relative L2 error under ``rtol`` (e4m3: 20%; the scales used differ by
    5x or more, so a wrong scale or output plane gives 80% or more)."""
    r, g = ref.float(), got.float()
    finite = torch.isfinite(r)
    if not torch.equal(finite, torch.isfinite(g)):
        return False
    return float((r[finite] - g[finite]).norm() / r[finite].norm().clamp(min=1e-9)) < rtol


def worker() -> dict:
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.lowering.cat_quant import cat_quant
    from diffusion_fuse.lowering.fp8 import FP8
    from diffusion_fuse.lowering.gated_residual_norm_modulate import QUANT_SPEC as GATED_QUANT
    from diffusion_fuse.lowering.norm_modulate import QUANT_SPEC as NORM_QUANT
    from diffusion_fuse.lowering.static_quant import static_quant

    g = torch.Generator().manual_seed(0)
    rn = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    ops = torch.ops.diffusion_fuse
    res: dict = {}

    def record(name, ref, got, counts):
        ref, got = (ref if isinstance(ref, list) else [ref]), (got if isinstance(got, list) else [got])
        res[name] = {
            "dtypes": [str(t.dtype) for t in got] == [str(t.dtype) for t in ref],
            "shapes": [list(t.shape) for t in got] == [list(t.shape) for t in ref],
            "close": all(_close(r, t, 0.2 if r.dtype == FP8 else 2e-2) for r, t in zip(ref, got)),
            "counters": counts,
        }

    def run(name, op, ref_fn, *args):
        counters.reset()
        got = op(*args)
        record(name, ref_fn(*args), got, counters.snapshot())

    s = torch.tensor(0.11)
    x = (rn(2, 9, 200) * 20).to(torch.bfloat16)
    x[0, 0, :3] = torch.tensor([float("nan"), -float("nan"), -0.0])
    run("static_div", ops.static_quant, static_quant, x, s, "div", -448.0, 448.0)
    run("static_mul", ops.static_quant, static_quant, x, 1 / s, "mul", -448.0, 448.0)
    run("static_fp32_strided", ops.static_quant, static_quant, (rn(7, 2, 300) * 40)[:, 1], s, "div", -448.0, 448.0)
    run("static_narrow_clamp", ops.static_quant, static_quant, x, s, "div", -100.0, 50.0)
    run("static_per_row_scale", ops.static_quant, static_quant, x, torch.full((2, 1, 1), 0.1), "div", -448.0, 448.0)
    counters.reset()
    q = ops.static_quant(x, s, "div", -448.0, 448.0).view(torch.uint8)[0, 0, :3].tolist()
    res["nan_bits"] = {"kernel": q, "eager": static_quant(x, s, "div", -448.0, 448.0).view(torch.uint8)[0, 0, :3]
                       .tolist()}

    attn = rn(1, 2, 24, 32).to(torch.bfloat16).permute(0, 2, 1, 3).reshape(1, 24, 64)
    mlp = (rn(1, 24, 96) * 3).to(torch.bfloat16)
    for keep in (False, True):
        run(f"cat_keep{keep}", ops.cat_quant, cat_quant, attn, mlp, s, "div", -448.0, 448.0, keep)

    # the _quant twins take every argument of their base op (the second addends None here), then the quantizers'
    D = 96
    xin = (rn(1, 12, D) * 3 + 1).to(torch.bfloat16)
    sc, sh = (rn(1, 1, D).to(torch.bfloat16) for _ in range(2))
    scales = [torch.tensor(v) for v in (0.01, 0.05, 0.3, 1.7)]
    for n, keep in ((1, False), (3, True), (4, False)):
        run(f"ln_n{n}_keep{keep}", ops.norm_modulate_quant, NORM_QUANT.reference,
            xin, None, None, 1e-6, sc, sh, None, None, None, None, scales[:n], "div", -448.0, 448.0, keep)
    # Wan: fp32 LayerNorm and modulate, cast to bf16, then quantized
    scf, shf = (rn(1, 1, D) for _ in range(2))
    run("ln_wan_fp32", ops.norm_modulate_quant, NORM_QUANT.reference,
        xin, None, None, 1e-6, scf, shf, torch.float32, torch.bfloat16, None, None, scales[:3], "mul", -448.0, 448.0,
        False)
    res_in, gate = (rn(1, 12, D) * 4).to(torch.bfloat16), rn(1, 1, D).to(torch.bfloat16)
    no_temb = (None, None, None, None, None, None)  # gate_temb, scale_temb, shift_temb, r_dtype, ln_dtype, mul_first
    for keep in (False, True):
        run(f"gated_keep{keep}", ops.gated_residual_norm_modulate_quant, GATED_QUANT.reference,
            res_in, xin, gate, None, None, 1e-6, sc, sh, None, *no_temb, scales[:2], "div", -448.0, 448.0, keep)
    # D % 512 == 0: rows held in registers (the register tile, for ln and gated)
    D = 512
    xin, res_in = ((rn(1, 10, D) * 3 + 1).to(torch.bfloat16) for _ in range(2))
    sc, sh, gate = (rn(1, 1, D).to(torch.bfloat16) for _ in range(3))
    run("ln_uniform", ops.norm_modulate_quant, NORM_QUANT.reference,
        xin, None, None, 1e-6, sc, sh, None, None, None, None, scales[:2], "div", -448.0, 448.0, False)
    run("gated_uniform", ops.gated_residual_norm_modulate_quant, GATED_QUANT.reference,
        res_in, xin, gate, None, None, 1e-6, sc, sh, None, *no_temb, scales[1:4], "div", -448.0, 448.0, True)
    return res


@pytest.fixture(scope="module")
def results():
    return run_worker(__file__)


KERNEL_CASES = ["static_div", "static_mul", "static_fp32_strided", "static_narrow_clamp", "cat_keepFalse",
                "cat_keepTrue", "ln_n1_keepFalse", "ln_n3_keepTrue", "ln_n4_keepFalse", "ln_wan_fp32",
                "gated_keepFalse", "gated_keepTrue", "ln_uniform", "gated_uniform"]


@pytest.mark.parametrize("case", KERNEL_CASES)
def test_kernel_runs_and_matches_the_reference_to_tolerance(results, case):
    r = results[case]
    assert r["dtypes"] and r["shapes"] and r["close"], r
    assert sum(r["counters"]["kernel"].values()) == 1 and r["counters"]["fallback"] == {}, r["counters"]


def test_nan_bits_are_eagers(results):
    r = results["nan_bits"]
    assert r["kernel"] == r["eager"] and r["eager"][1:] == [0xFF, 0x80], r  # -NaN keeps its sign (c10), -0.0 too


def test_per_row_scale_takes_the_reference_path(results):
    r = results["static_per_row_scale"]
    assert r["close"] and r["counters"]["kernel"] == {}
    assert list(r["counters"]["fallback"]["static_quant"]) == ["scale has 2 elements (per-tensor scales only)"]


if __name__ == "__main__":
    worker_main(worker)
