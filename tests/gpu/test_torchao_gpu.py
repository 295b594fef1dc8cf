"""torchao's own FP8 static-activation linear on CUDA: quantizers fused, output bitwise equal to eager.

torchao is not on the GPU image: carry its wheel in ``.whl/`` (``pip download --no-deps torchao``; 0.18 was
used). ``testing/fp8.quantize_linears_torchao`` (torchao's ``Float8StaticActivationFloat8WeightConfig``,
prepare / calibrate / convert) on the tiny FLUX and FLUX.2 in bf16; the compiled lossless model must equal
eager bitwise over two calls, with quantizers fused (the ATen form torchao traces to on CUDA is what
``patterns/static_quant.py`` must match). Prints the report. The CPU twin is tests/test_torchao.py.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("needs CUDA with FP8 (sm_89+)", allow_module_level=True)
torchao = pytest.importorskip("torchao")

from diffusion_fuse.testing.fp8 import run_torchao_model, subclass_params_flattened  # noqa: E402


@pytest.mark.parametrize("name", ["flux", "flux2"])
def test_torchao_static_fp8_model_equals_eager_with_quantizers_fused(name):
    n, ref, outs, report = run_torchao_model(name, "cuda", calls=2)
    assert n > 0
    fused = sum(s.before.count("clamp") for s in report.sites() if s.status == "kept")
    print(f"\n{name}: torchao {torchao.__version__}, {n} linears quantized, {fused} quantizers fused\n{report.table()}")
    assert all(torch.equal(ref.view(torch.int16), o.view(torch.int16)) for o in outs)
    assert fused > 0, "torchao's quantizer form was not matched"
    assert subclass_params_flattened(report) == n, report.table()  # diffusion_fuse/subclass_params.py
    assert sum(report.counters()["kernel"].values()) > 0
