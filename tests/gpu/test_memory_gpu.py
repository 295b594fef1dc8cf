"""Resource hygiene on CUDA: the verifier's first call stays within 2x of eager's peak memory,
and repeated calls neither grow memory nor verify again."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import diffusion_fuse  # noqa: E402
from diffusion_fuse.testing.tiny_models import build  # noqa: E402


def peak(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base, out


@pytest.mark.parametrize("shape", ["tiny", "real"])
def test_first_call_peak_within_twice_eager_and_no_growth(shape):
    torch._dynamo.reset()
    if shape == "tiny":
        model, kw = build("flux", torch.bfloat16, "cuda")
    else:  # one FLUX.1-dev-sized double + single block at 1024²
        from diffusers import FluxTransformer2DModel

        with torch.device("cuda"):
            model = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                                           attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                                           pooled_projection_dim=768, guidance_embeds=True,
                                           axes_dims_rope=(16, 56, 56)).eval().to(torch.bfloat16)
        g = torch.Generator(device="cuda").manual_seed(0)
        kw = dict(hidden_states=torch.randn(1, 4096, 64, device="cuda", generator=g).bfloat16(),
                  encoder_hidden_states=torch.randn(1, 512, 4096, device="cuda", generator=g).bfloat16(),
                  pooled_projections=torch.randn(1, 768, device="cuda", generator=g).bfloat16(),
                  timestep=torch.tensor([0.5], device="cuda").bfloat16(), img_ids=torch.zeros(4096, 3, device="cuda"),
                  txt_ids=torch.zeros(512, 3, device="cuda"), guidance=torch.tensor([3.5], device="cuda").bfloat16(),
                  return_dict=False)
    report = diffusion_fuse.Report()
    c = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
    with torch.no_grad():
        eager_peak, ref = peak(lambda: model(**kw)[0])
        first_peak, out = peak(lambda: c(**kw)[0])
        assert torch.equal(ref, out)
        after_first = torch.cuda.memory_allocated()
        for _ in range(100):
            c(**kw)
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() <= after_first
    assert first_peak <= 2 * eager_peak, (first_peak, eager_peak)
    assert len(report.graphs[0].verifications) == 1
