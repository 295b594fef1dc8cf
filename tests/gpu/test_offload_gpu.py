"""Offloading on CUDA with a transformer compiled by ``backend="diffusion_fuse"``: the weights move between the CPU
and the GPU, the Triton kernels run on the onloaded weights, and the output is eager's with the same offload, bit
for bit (tests/test_offload.py runs the same hooks on the CPU, where nothing moves).

- model CPU offload (``pipe.enable_model_cpu_offload()``, accelerate's hooks): the transformer is on the GPU for
  the denoising loop and back on the CPU when the pipeline returns;
- group offloading (``enable_group_offload``) per block, with and without a copy stream, and per leaf module with
  a copy stream: the weights are on the CPU between calls.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import diffusion_fuse  # noqa: E402
from diffusion_fuse.testing.tiny_models import build  # noqa: E402

DTYPE = torch.bfloat16
CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def flux_pipeline():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    transformer, _ = build("flux", DTYPE)
    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=None, text_encoder=None, tokenizer=None,
                        text_encoder_2=None, tokenizer_2=None, transformer=transformer)


def generate(pipe) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    prompt_embeds = torch.randn(1, 8, 32, generator=g).to(CUDA, DTYPE)
    pooled = torch.randn(1, 32, generator=g).to(CUDA, DTYPE)
    with torch.no_grad():
        return pipe(prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled, height=32, width=32,
                    num_inference_steps=2, guidance_scale=3.5, output_type="latent",
                    generator=torch.Generator().manual_seed(1)).images


def test_model_cpu_offload_on_cuda():
    torch._dynamo.reset()
    eager = flux_pipeline()
    eager.enable_model_cpu_offload()
    ref = generate(eager)

    pipe = flux_pipeline()
    pipe.enable_model_cpu_offload()
    report = diffusion_fuse.Report()
    pipe.transformer = torch.compile(pipe.transformer, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
    out = generate(pipe)
    assert out.device.type == "cuda"
    assert torch.equal(bits(ref), bits(out))
    assert report.counters()["kernel"], report.table()  # the Triton kernels ran on the onloaded weights
    assert all(s.status == "kept" for s in report.sites()), report.table()
    assert next(pipe.transformer.parameters()).device == CPU  # offloaded again when the pipeline returned


@pytest.mark.parametrize("offload_type,use_stream", [("block_level", False), ("block_level", True),
                                                     ("leaf_level", True)])
def test_group_offload_on_cuda(offload_type, use_stream):
    torch._dynamo.reset()

    def offloaded():
        model, kwargs = build("flux", DTYPE, "cuda")
        model.to(CPU)
        per_group = {"num_blocks_per_group": 1} if offload_type == "block_level" else {}
        model.enable_group_offload(onload_device=CUDA, offload_device=CPU, offload_type=offload_type,
                                   use_stream=use_stream, **per_group)
        return model, kwargs

    model, kwargs = offloaded()
    with torch.no_grad():
        ref = model(**kwargs)[0]
    model, kwargs = offloaded()
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
    with torch.no_grad():
        out = compiled(**kwargs)[0]
        again = compiled(**kwargs)[0]
    torch.cuda.synchronize()
    assert torch.equal(bits(ref), bits(out)) and torch.equal(bits(ref), bits(again))
    assert report.counters()["kernel"], report.table()
    assert all(s.status == "kept" for s in report.sites()), report.table()
    assert next(model.transformer_blocks[0].parameters()).device == CPU  # offloaded between calls
