"""diffusion_fuse::grouped_gemv on a GPU: each member of one launch gives ``torch.addmm``'s bits at the
modulation shapes of FLUX.1-dev (every block's, and norm_out's) and Qwen-Image, batch 1 and 2, and under CUDA
graph capture. Writes $OUT/grouped_gemv_gpu.json: each shape's form (1: one chain over K, 2: two halves;
None: no form matched, addmm into its slot) and whether the launch ran the kernel.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

import diffusion_fuse  # noqa: E402,F401
from diffusion_fuse.kernels import grouped_gemv as gg  # noqa: E402
from diffusion_fuse.lowering import counters  # noqa: E402

# (name, K, member row counts): FLUX.1-dev's members are 2 per double block ([18432]), 1 per single block
# ([9216]) and norm_out ([6144]); a few blocks' worth stands for the 76 (the kernel sees a table either way)
GROUPS = [
    ("FLUX.1-dev", 3072, (18432, 18432, 9216, 9216, 9216, 6144)),
    ("Qwen-Image", 3072, (18432, 18432, 18432, 18432, 6144)),
    ("SD3.5-large", 2432, (14592, 14592, 4864)),
]
RESULTS: dict = {}


def _operands(k, sizes, rows, seed=0, bias=True):
    g = torch.Generator(device="cuda").manual_seed(seed + k + rows)
    x = torch.nn.functional.silu(torch.randn(rows, k, device="cuda", generator=g) * 2).bfloat16()
    ws = [(torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16() for n in sizes]
    bs = [(torch.randn(n, device="cuda", generator=g) * 0.02).bfloat16() if bias else None for n in sizes]
    return x, ws, bs


def _eager(x, ws, bs):
    return [torch.addmm(b, x, w.t()) if b is not None else torch.mm(x, w.t()) for w, b in zip(ws, bs)]


def _split(flat, x, ws):
    m, off, outs = x.shape[0], 0, []
    for w in ws:
        outs.append(flat[m * off:m * (off + w.shape[0])].view(m, w.shape[0]))
        off += w.shape[0]
    return outs


@pytest.fixture(scope="module", autouse=True)
def _write_results():
    yield
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "grouped_gemv_gpu.json"), "w") as f:
            json.dump(RESULTS, f, indent=1)


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name, k, sizes", GROUPS)
def test_every_member_has_addmms_bits(name, k, sizes, rows, bias):
    x, ws, bs = _operands(k, sizes, rows, bias=bias)
    gg.CUBLAS_MEMBERS.clear()
    counters.reset()
    flat = torch.ops.diffusion_fuse.grouped_gemv(x, ws, bs)
    forms = {n: gg.member_form(x.device, rows, n, k, x.dtype, bias) for n in sorted(set(sizes))}
    RESULTS[f"{name} rows={rows} bias={bias}"] = {"forms": {str(n): f for n, f in forms.items()},
                                                    "kernel_hits": counters.snapshot()["kernel"].get("grouped_gemv")}
    assert counters.snapshot()["kernel"].get("grouped_gemv") == 1, counters.snapshot()
    for got, want in zip(_split(flat, x, ws), _eager(x, ws, bs)):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    if name != "SD3.5-large":  # FLUX's and Qwen-Image's shapes have a form the kernel knows
        assert not gg.CUBLAS_MEMBERS, gg.CUBLAS_MEMBERS


def test_under_cuda_graph_capture():
    x, ws, bs = _operands(3072, (18432, 9216, 6144), 1)
    static = x.clone()
    torch.ops.diffusion_fuse.grouped_gemv(static, ws, bs)  # plan outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flat = torch.ops.diffusion_fuse.grouped_gemv(static, ws, bs)
    for seed in (1, 2):
        new, _, _ = _operands(3072, (18432, 9216, 6144), 1, seed=seed)
        static.copy_(new)
        graph.replay()
        for got, want in zip(_split(flat, new, ws), _eager(new, ws, bs)):
            assert torch.equal(got.view(torch.int16), want.view(torch.int16))
