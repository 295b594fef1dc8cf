"""torchao's own FP8 static recipe (issue #5) on the CPU: its quantizer, as torchao traces it, is fused.

Skips without torchao (a test extra). ``torch._scaled_mm`` runs on the CPU in torch >= 2.13. The GPU twin
is tests/gpu/test_torchao_gpu.py.
"""

import pytest

from diffusion_fuse.testing.fp8 import run_torchao_model
from helpers import bitwise_equal

pytest.importorskip("torchao")


@pytest.mark.parametrize("name", ["flux", "flux2"])
def test_torchao_static_fp8_model_equals_eager_with_quantizers_fused(name):
    n, ref, (out,), report = run_torchao_model(name)
    assert n > 0
    assert bitwise_equal(ref, out)
    kept = [s for s in report.sites() if s.status == "kept"]
    assert len(kept) == len(report.sites())
    # every quantizer torchao put in front of a linear: one clamp each, all taken by a family
    assert sum(s.before.count("clamp") for s in kept) == n
