"""The user DiTs of diffusion_fuse/testing/user_dits.py on CUDA: lossless equals eager bitwise with the kernels live
and every site kept (bf16 and fp32)."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import diffusion_fuse  # noqa: E402
from diffusion_fuse.testing.user_dits import USER_DITS, build_user_dit  # noqa: E402

SUMMARY = []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("name", list(USER_DITS))
def test_user_dit_on_cuda(name, dtype):
    torch._dynamo.reset()
    model, args = build_user_dit(name, dtype, "cuda")
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)
    with torch.no_grad():
        ref, out = model(*args)[0], compiled(*args)[0]
    hits = sum(report.counters()["kernel"].values())
    SUMMARY.append((name, str(dtype).split(".")[-1], len(report.sites()), report.count(status="kept"), hits))
    bits = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[dtype]
    assert torch.equal(ref.view(bits), out.view(bits))
    assert report.count(status="kept") == len(report.sites()), report.table()
    assert hits > 0, report.table()


def teardown_module(module):
    print("\nuser DiTs on CUDA (model, dtype, sites, kept, kernel calls):")
    for row in SUMMARY:
        print("  " + " ".join(str(c) for c in row))
