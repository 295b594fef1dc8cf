"""patterns/merged_linear.py on CUDA: FLUX.1-dev's text q/k/v (512 tokens, 3072 wide) and SANA's q/k/v run as one
cuBLAS GEMM over the stacked weights, kept by the verifier (bit for bit), in the default mode and under CUDA
graphs with the weights edited in place between calls (the stack is built in the graph on every call); shapes the
wave model rejects stay three GEMMs. Writes ``$OUT/merged_linear_gpu.json`` when ``OUT`` is set."""

import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import diffusion_fuse  # noqa: E402

SUMMARY = []


class QKV(torch.nn.Module):
    def __init__(self, dim: int, n: int = 3) -> None:
        super().__init__()
        self.proj = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(n))

    def forward(self, x):
        return tuple(p(x) for p in self.proj)


def _bits(ts):
    return [t.contiguous().view(torch.int16) for t in ts]


@pytest.mark.parametrize("name, batch, tokens, dim, n, merged", [
    ("flux_text_qkv", 1, 512, 3072, 3, True),
    ("sana_qkv", 2, 1024, 2240, 3, True),
    ("wan21_cross_kv", 1, 512, 5120, 2, False),
    ("flux_image_qkv", 1, 4096, 3072, 3, False),
])
@pytest.mark.parametrize("cudagraphs", [False, True])
def test_stacked_gemm_is_bitwise_eager(name, batch, tokens, dim, n, merged, cudagraphs):
    torch.manual_seed(0)
    model = QKV(dim, n).to("cuda", torch.bfloat16).eval()
    report = diffusion_fuse.Report()
    opts = {"cudagraphs": True} if cudagraphs else None
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(opts, report), dynamic=False)
    ok = True
    with torch.no_grad():
        for step in range(3):
            x = torch.randn(batch, tokens, dim, device="cuda", dtype=torch.bfloat16)
            if step == 2:  # PEFT-style in-place edit through .data: the stacked copy must follow
                model.proj[1].weight.data.mul_(0.5)
            ref = model(x)
            got = compiled(x)
            ok &= all(torch.equal(a, b) for a, b in zip(_bits(ref), _bits(got)))
    sites = [s for s in report.sites() if s.pattern == "merged_linear"]
    SUMMARY.append(dict(name=name, cudagraphs=cudagraphs, equal=ok, sites=[(s.id, s.status, s.verdict) for s in sites]))
    assert ok
    assert bool(sites) is merged
    assert all(s.status == "kept" for s in sites), [(s.id, s.reason) for s in sites]


def teardown_module(module):
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "merged_linear_gpu.json"), "w") as f:
            json.dump(SUMMARY, f, indent=2)
    for r in SUMMARY:
        print(r)
