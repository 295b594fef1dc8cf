"""diffusion_fuse::linear_cat on a GPU: each cuBLAS GEMM written into its rows of the ``cat`` buffer gives the bits
eager's ``cat`` of the separate GEMMs gives, at the joint-attention value shapes of FLUX.1-dev, FLUX.2 and
Qwen-Image and around them, and under CUDA graph capture.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

import diffusion_fuse  # noqa: E402,F401
from diffusion_fuse.lowering import counters  # noqa: E402

CASES = [  # (rows of each piece, K, N, bias)
    ((512, 4096), 3072, 3072, True),  # FLUX.1-dev double block and Qwen-Image at 1024²: cat([txt_v, img_v], 1)
    ((512, 4096), 6144, 6144, False),  # FLUX.2-dev (no biases)
    ((256, 1024), 3072, 3072, True),  # FLUX at 512²
    ((77, 333), 1024, 1536, True),  # odd row counts (chunks stay 16-byte aligned: N * 2 bytes)
    ((8, 4096, 512), 2048, 2048, True),  # three pieces, one tiny (cuBLAS may pick another kernel: same call)
]


def _operands(rows, K, N, bias, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed + K + N)
    xs = [torch.randn(m, K, device="cuda", generator=g).bfloat16() for m in rows]
    ws = [(torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).bfloat16() for _ in rows]
    bs = [torch.randn(N, device="cuda", generator=g).bfloat16() if bias else None for _ in rows]
    return xs, ws, bs


def _eager(xs, ws, bs, heads):
    return torch.cat([torch.nn.functional.linear(x, w, b).view(1, x.shape[0], heads, -1)
                      for x, w, b in zip(xs, ws, bs)], dim=1)


@pytest.mark.parametrize("rows, K, N, bias", CASES)
def test_op_writes_the_bits_eager_writes(rows, K, N, bias):
    xs, ws, bs = _operands(rows, K, N, bias)
    heads = N // 128 if N % 128 == 0 else 1
    counters.reset()
    out = torch.ops.diffusion_fuse.linear_cat(xs, ws, bs, 1, [heads, N // heads])
    assert counters.snapshot()["kernel"].get("linear_cat") == 1, counters.snapshot()
    ref = _eager(xs, ws, bs, heads)
    assert out.shape == ref.shape and torch.equal(out.view(torch.int16), ref.view(torch.int16))


def test_under_cuda_graph_capture():
    xs, ws, bs = _operands((512, 4096), 3072, 3072, True)
    static = [x.clone() for x in xs]
    torch.ops.diffusion_fuse.linear_cat(static, ws, bs, 1, [24, 128])  # plan outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.diffusion_fuse.linear_cat(static, ws, bs, 1, [24, 128])
    for seed in (1, 2):
        new, _, _ = _operands((512, 4096), 3072, 3072, True, seed=seed)
        for s, n in zip(static, new):
            s.copy_(n)
        graph.replay()
        ref = _eager(new, ws, bs, 24)
        assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
