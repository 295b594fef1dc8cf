"""A tiny Flux2Pipeline (FLUX.2) whose transformer is compiled with backend="diffusion_fuse".

Random weights, nothing downloaded: the prompt embeddings are passed directly, so the Mistral-3 text encoder
and its processor are None. Runs the full denoising loop eagerly and compiled and checks bit-equality.

    python examples/flux2_pipeline.py [--steps 3] [--device cuda|cpu] [--dtype bf16|fp32] [--repeated-blocks]

Shapes: 16x16 image; AutoencoderKLFlux2 (FLUX.2's own VAE: batch-norm latent statistics, 2x2 patchify) with
4 latent channels -> 16 image tokens of 16 channels on a 4x4 grid, (T, H, W, L) position ids; 8 text tokens.
Flux2Transformer2DModel from diffusion_fuse.testing.tiny_models (1 double + 1 single block, guidance-distilled).
"""

from __future__ import annotations

import torch
from _common import main, parse_args

from diffusion_fuse.testing.tiny_models import build


def tiny_flux2_pipeline(dtype: torch.dtype, device: str):
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Pipeline

    transformer, _ = build("flux2", dtype, device)
    torch.manual_seed(0)
    vae = AutoencoderKLFlux2(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), layers_per_block=1,
        latent_channels=4, norm_num_groups=4, sample_size=16, use_quant_conv=False, use_post_quant_conv=False,
        mid_block_add_attention=False,
    )
    with torch.no_grad():  # non-trivial latent statistics, so the de-normalisation does something
        vae.bn.running_mean.uniform_(-0.5, 0.5)
        vae.bn.running_var.uniform_(0.5, 2.0)
    vae = vae.eval().to(device, dtype)
    return Flux2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None, tokenizer=None,
                         transformer=transformer)


def generate(pipe, args) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    prompt_embeds = torch.randn(1, 8, 32, generator=g).to(args.device, args.torch_dtype)
    with torch.no_grad():
        return pipe(prompt_embeds=prompt_embeds, height=16, width=16, num_inference_steps=args.steps,
                    guidance_scale=4.0, output_type="pt", generator=torch.Generator().manual_seed(1)).images


if __name__ == "__main__":
    from diffusers import Flux2Transformer2DModel

    main(parse_args(__doc__, Flux2Transformer2DModel), name="FLUX.2 (Flux2Pipeline)",
         build_pipeline=tiny_flux2_pipeline, generate=generate)
