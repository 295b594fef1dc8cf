"""diffusion_fuse::linear_gelu on an H100/H200: bitwise equal to eager's ``gelu(F.linear(x, w, b))``.

The Gluon kernel (kernels/linear_gelu.py) at FLUX.1-dev's up-projection shapes and around them (rows not a
multiple of the tile, no bias, erf's gelu), through the op (the kernel must run, not the reference), and a
model compiled with the family on (the verifier keeps the site).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="needs an sm_90 GPU")

import torch.nn.functional as F  # noqa: E402

import diffusion_fuse  # noqa: E402,F401
from diffusion_fuse.lowering import counters  # noqa: E402

CASES = [  # (M, K, N, bias, approximate)
    (4096, 3072, 12288, True, "tanh"),  # FLUX double block, image FF
    (4608, 3072, 12288, True, "tanh"),  # FLUX single block, proj_mlp
    (512, 3072, 12288, True, "tanh"),  # FLUX double block, text FF
    (1000, 3072, 3072, True, "tanh"),  # rows not a multiple of 128
    (2048, 1536, 6144, False, "tanh"),
    (1024, 3072, 12288, True, "none"),  # erf's gelu (its table is exact too)
]


def _bits(t):
    return t.view(torch.int16)


@pytest.mark.parametrize("M, K, N, bias, approximate", CASES)
def test_op_runs_the_kernel_and_equals_eager(M, K, N, bias, approximate):
    g = torch.Generator(device="cuda").manual_seed(M + N)
    x = torch.randn(1, M, K, device="cuda", generator=g).bfloat16()
    w = (torch.randn(N, K, device="cuda", generator=g) * K ** -0.5).bfloat16()
    b = (torch.randn(N, device="cuda", generator=g) * 0.1).bfloat16() if bias else None
    counters.reset()
    for _ in range(2):  # the second call runs the planned launch
        got = torch.ops.diffusion_fuse.linear_gelu(x, w, b, approximate)
    assert counters.snapshot()["kernel"] == {"linear_gelu": 2}, counters.snapshot()
    ref = F.gelu(F.linear(x, w, b), approximate=approximate)
    assert got.shape == ref.shape and torch.equal(_bits(got), _bits(ref))


def test_a_compiled_feed_forward_keeps_its_site():
    class FF(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(3072, 12288, dtype=torch.bfloat16, device="cuda")
            self.down = torch.nn.Linear(12288, 3072, dtype=torch.bfloat16, device="cuda")

        def forward(self, x):
            return self.down(F.gelu(self.up(x), approximate="tanh"))

    model = FF().eval()
    x = torch.randn(1, 600, 3072, device="cuda").bfloat16()
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(
        {"patterns": {"linear_gelu": True}}, report), fullgraph=True)
    with torch.no_grad():
        ref, out = model(x), compiled(x)
    assert torch.equal(_bits(ref), _bits(out))
    (graph,) = report.graphs
    assert [r.status for k, r in graph.sites.items() if k.startswith("linear_gelu")] == ["kept"]
