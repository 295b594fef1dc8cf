"""diffusion_fuse::linear_gelu on an H100/H200: bitwise equal to eager's ``gelu(F.linear(x, w, b))``.

The Gluon kernel (kernels/linear_gelu.py) at FLUX.1-dev's up-projection shapes and around them (rows not a
multiple of the tile, no bias, erf's gelu), through the op (the kernel must run, not the reference); the ``cat``
form (linear_gelu_cat: the GEMM's columns of a wider buffer, the other pieces copied); and models compiled with
the family on (the verifier keeps the sites).
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
    (640, 1024, 1000, True, "tanh"),  # N not a multiple of the tile: the last tile's columns masked
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
    for _ in range(2):  # the second call runs the planned launch, directly (kernels/launch.CachedLaunch)
        got = torch.ops.diffusion_fuse.linear_gelu(x, w, b, approximate)
    assert counters.snapshot()["kernel"] == {"linear_gelu": 2}, counters.snapshot()
    ref = F.gelu(F.linear(x, w, b), approximate=approximate)
    assert got.shape == ref.shape and torch.equal(_bits(got), _bits(ref))


CAT_CASES = [  # (M, K, N, widths before, widths after)
    (4608, 3072, 12288, [3072], []),  # FLUX single block: cat([attn, gelu(proj_mlp(x))], -1)
    (1000, 1024, 4096, [], [72]),  # rows not a multiple of 128, a piece after, a column offset of 0
    (384, 1024, 2048, [8, 3072], [16]),  # column offsets 8 and 3080 (16-byte aligned stores)
    (384, 1024, 2048, [12], []),  # offset 12 (a row's start 8-byte aligned only)
    (384, 1024, 1000, [12], [72]),  # N not a multiple of the tile: the last tile's masked columns, pieces on both sides
]


@pytest.mark.parametrize("M, K, N, before, after", CAT_CASES)
def test_cat_op_writes_its_columns_and_equals_eager(M, K, N, before, after):
    g = torch.Generator(device="cuda").manual_seed(M + N + len(before))
    x = torch.randn(1, M, K, device="cuda", generator=g).bfloat16()
    w = (torch.randn(N, K, device="cuda", generator=g) * K ** -0.5).bfloat16()
    b = (torch.randn(N, device="cuda", generator=g) * 0.1).bfloat16()
    pieces = [torch.randn(1, M, c, device="cuda", generator=g).bfloat16() for c in before + after]
    if pieces:  # one piece strided (a transposed copy's view), as an attention output can be
        pieces[0] = pieces[0].transpose(1, 2).contiguous().transpose(1, 2)
    bef, aft = pieces[:len(before)], pieces[len(before):]
    counters.reset()
    for i in range(3):  # the later calls take the direct launch; the last with a new x (descriptors rebuilt)
        if i == 2:
            x = torch.randn(1, M, K, device="cuda", generator=g).bfloat16()
        got = torch.ops.diffusion_fuse.linear_gelu_cat(x, w, b, bef, aft, "tanh")
    assert counters.snapshot()["kernel"] == {"linear_gelu_cat": 3}, counters.snapshot()
    ref = torch.cat([*bef, F.gelu(F.linear(x, w, b), approximate="tanh"), *aft], dim=-1)
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


def test_a_compiled_single_block_mlp_keeps_its_cat_site():
    class MlpCat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj_mlp = torch.nn.Linear(1024, 4096, dtype=torch.bfloat16, device="cuda")
            self.proj_out = torch.nn.Linear(1024 + 4096, 1024, dtype=torch.bfloat16, device="cuda")

        def forward(self, x, attn):
            return self.proj_out(torch.cat([attn, F.gelu(self.proj_mlp(x), approximate="tanh")], dim=2))

    model = MlpCat().eval()
    x, attn = (torch.randn(1, 640, 1024, device="cuda").bfloat16() for _ in range(2))
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(
        {"patterns": {"linear_gelu": True}}, report), fullgraph=True)
    with torch.no_grad():
        ref, out = model(x, attn), compiled(x, attn)
        assert torch.equal(_bits(ref), _bits(out))
    (graph,) = report.graphs
    assert [(r.after, r.status) for k, r in graph.sites.items() if k.startswith("linear_gelu")] == [
        ("diffusion_fuse::linear_gelu_cat", "kept")]
