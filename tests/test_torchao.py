"""torchao's own FP8 static recipe (issue #5) on the CPU: its quantizer, as torchao traces it, is fused.

Skips without torchao (a test extra). ``torch._scaled_mm`` runs on the CPU in torch >= 2.13. The GPU twin
is tests/gpu/test_torchao_gpu.py.
"""

import pytest
import torch

import diffusion_fuse
from diffusion_fuse.testing.fp8 import quantize_linears_torchao
from diffusion_fuse.testing.tiny_models import build
from helpers import bitwise_equal

pytest.importorskip("torchao")


@pytest.mark.parametrize("name", ["flux", "flux2"])
def test_torchao_static_fp8_model_equals_eager_with_quantizers_fused(name):
    model, kwargs = build(name, torch.bfloat16)
    n = quantize_linears_torchao(model, kwargs)
    assert n > 0
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
    with torch.no_grad():
        ref = model(**kwargs)[0]
        out = compiled(**kwargs)[0]
    assert bitwise_equal(ref, out)
    kept = [s for s in report.sites() if s.status == "kept"]
    assert len(kept) == len(report.sites())
    # every quantizer torchao put in front of a linear: one clamp each, all taken by a family
    assert sum(s.before.count("clamp") for s in kept) == n
