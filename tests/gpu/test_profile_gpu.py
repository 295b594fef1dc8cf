"""The profile view on CUDA: tiny FLUX (bf16), all four variants.

Checks what the CPU test cannot: the CUDA graph variant runs (the scope hook leaves the capture working) and its
replayed kernels find their classes in the run without CUDA graphs; our families' kernels are placed under their
scopes from the CUDA runtime calls' host times (none left as ``other kernels``); the classes sum to each variant's
device span. Writes ``$OUT/profile_gpu.json`` and ``.html`` when ``OUT`` is set.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import diffusion_fuse  # noqa: E402
from diffusion_fuse.profile import LEFT, OTHER, V_OURS, V_OURS_CG  # noqa: E402
from diffusion_fuse.testing.tiny_models import build  # noqa: E402


@pytest.fixture(scope="module")
def flux():
    torch._dynamo.reset()
    model, kwargs = build("flux", torch.bfloat16, device="cuda", seed=0)
    report = diffusion_fuse.profile(model, forwards=2, **kwargs)
    if os.environ.get("OUT"):
        report.save(os.path.join(os.environ["OUT"], "profile_gpu.json"))
        report.save_html(os.path.join(os.environ["OUT"], "profile_gpu.html"))
    print(report)
    return report


def test_all_variants_and_sums(flux):
    assert flux.variants == ["eager", "diffusion_fuse", "diffusion_fuse+cudagraphs", "inductor"]
    assert flux.primary == V_OURS_CG and flux.time_kind == "GPU"
    for v in flux.variants:
        assert sum(r.ms.get(v, 0.0) for r in flux.classes) == pytest.approx(flux.totals_ms[v], rel=1e-3, abs=1e-3)
    assert not [n for n in flux.notes if "failed" in n or "clocks" in n or "outside its linked op" in n]


def test_families_placed_with_and_without_cuda_graphs(flux):
    fams = [r for r in flux.classes if r.kind == "ours"]
    assert {r.name for r in fams} == {f"ours: {f}" for f in flux.sites}
    for r in fams:
        assert r.ms.get(V_OURS, 0) > 0 and r.ms.get(V_OURS_CG, 0) > 0
    other = flux.row(OTHER)
    assert other is None or other.ms.get(V_OURS, 0.0) == 0.0
    assert any("kernels matched to the run without CUDA graphs" in n for n in flux.notes)
    assert 0 <= flux.eager_share() < 1
    assert flux.lines and all(ln.location for ln in flux.lines)
    assert any(r.name in LEFT for r in flux.classes)
