"""Demo: a tiny FluxPipeline whose transformer is compiled with backend="diffusion_fuse".

Random weights (nothing is downloaded): the prompt embeddings are passed directly, so no
tokenizer or text encoder is needed. Runs the full denoising loop eagerly and compiled,
asserts the images are bit-identical, and prints what the backend did.

    python examples/flux_pipeline.py [--steps 3] [--device cuda|cpu] [--dtype bf16|fp32] [--repeated-blocks]

Shapes: 16x16 image, 4x4 latent grid (16 image tokens of 16 channels after 2x2 packing), 8 text tokens,
FluxTransformer2DModel from diffusion_fuse.testing.tiny_models (1 double + 1 single block, guidance-distilled).
"""

from __future__ import annotations

import torch
from _common import main, parse_args

from diffusion_fuse.testing.tiny_models import build


def tiny_flux_pipeline(dtype: torch.dtype, device: str):
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline

    transformer, _ = build("flux", dtype, device)
    torch.manual_seed(0)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), layers_per_block=1,
        latent_channels=4, norm_num_groups=4, sample_size=16, scaling_factor=1.0, shift_factor=0.0,
        use_quant_conv=False, use_post_quant_conv=False,
    ).eval().to(device, dtype)
    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None, tokenizer=None,
                        text_encoder_2=None, tokenizer_2=None, transformer=transformer)


def generate(pipe, args) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    prompt_embeds = torch.randn(1, 8, 32, generator=g).to(args.device, args.torch_dtype)
    pooled = torch.randn(1, 32, generator=g).to(args.device, args.torch_dtype)
    with torch.no_grad():
        return pipe(prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled, height=16, width=16,
                    num_inference_steps=args.steps, guidance_scale=3.5, output_type="pt",
                    generator=torch.Generator().manual_seed(1)).images


if __name__ == "__main__":
    from diffusers import FluxTransformer2DModel

    main(parse_args(__doc__, FluxTransformer2DModel), name="FLUX.1 (FluxPipeline)",
         build_pipeline=tiny_flux_pipeline, generate=generate)
