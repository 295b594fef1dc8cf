"""Tiny diffusers models, and the user DiTs of diffusion_fuse/testing/user_dits.py, on CUDA: lossless equals eager
with the Triton kernels live."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import diffusion_fuse  # noqa: E402
from diffusion_fuse.testing.tiny_models import MODEL_NAMES, build  # noqa: E402
from diffusion_fuse.testing.user_dits import USER_DITS, build_user_dit  # noqa: E402

SUMMARY = []
DTYPES = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])


def _compiled_twice(model, *args, **kwargs):
    """(eager's output, the compiled model's first and second outputs, the report)."""
    torch._dynamo.reset()
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)
    with torch.no_grad():
        return model(*args, **kwargs)[0], compiled(*args, **kwargs)[0], compiled(*args, **kwargs)[0], report


@DTYPES
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_tiny_model_on_cuda(name, dtype):
    model, kwargs = build(name, dtype, "cuda")
    ref, out, out2, report = _compiled_twice(model, **kwargs)
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


@DTYPES
@pytest.mark.parametrize("name", list(USER_DITS))
def test_user_dit_on_cuda(name, dtype):
    model, args = build_user_dit(name, dtype, "cuda")
    ref, out, out2, report = _compiled_twice(model, *args)
    ctr = report.counters()
    hits = sum(ctr["kernel"].values())  # every family's (a user DiT need not have a norm_modulate site)
    SUMMARY.append((name, str(dtype).split(".")[-1], len(report.sites()), report.count(status="kept"), hits,
                    sum(n for reasons in ctr["fallback"].values() for n in reasons.values()), torch.equal(ref, out)))
    bits = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[dtype]
    assert torch.equal(ref.view(bits), out.view(bits)) and torch.equal(out, out2)
    assert report.count(status="kept") == len(report.sites()), report.table()
    assert hits > 0, report.table()


def teardown_module(module):
    print("\ntiny models and user DiTs on CUDA (model, dtype, sites, kept, kernel hits: norm_modulate's for the tiny "
          "models, every family's for the user DiTs, fallbacks, equal):")
    for row in SUMMARY:
        print("  " + " ".join(str(c) for c in row))
