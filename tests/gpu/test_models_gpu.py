"""Tiny diffusers models on CUDA: lossless equals eager with the Triton kernels live."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import diffusion_fuse  # noqa: E402
from diffusion_fuse.testing.tiny_models import MODEL_NAMES, build  # noqa: E402

SUMMARY = []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_tiny_model_on_cuda(name, dtype):
    torch._dynamo.reset()
    model, kwargs = build(name, dtype, "cuda")
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)
    with torch.no_grad():
        ref = model(**kwargs)[0]
        out = compiled(**kwargs)[0]
        out2 = compiled(**kwargs)[0]
    ctr = report.counters()
    hits = ctr["kernel"].get("norm_modulate", 0)
    kept = report.count(status="kept")
    SUMMARY.append((name, str(dtype).split(".")[-1], len(report.sites()), kept, hits,
                    sum(ctr["fallback"].get("norm_modulate", {}).values()), torch.equal(ref, out)))
    assert torch.equal(ref.view(torch.int16) if ref.dtype == torch.bfloat16 else ref,
                       out.view(torch.int16) if out.dtype == torch.bfloat16 else out)
    assert torch.equal(out, out2)
    assert hits > 0, report.table()
    assert kept == len(report.sites()), report.table()
    # the runtime rewrites (linear recomposed, Python bindings) kept: none was put back for a difference
    for g in report.graphs:
        assert not any("runtime rewrites" in n for n in g.notes), g.notes
        assert all(v["python_bindings"] > 0 for v in g.verifications), g.verifications


def teardown_module(module):
    print("\ntiny models on CUDA (model, dtype, sites, kept, kernel hits, fallbacks, equal):")
    for row in SUMMARY:
        print("  " + " ".join(str(c) for c in row))
