"""A tiny StableDiffusion3Pipeline (SD 3.5 transformer) whose transformer is compiled with backend="diffusion_fuse".

Random weights, nothing downloaded: prompt, negative-prompt and pooled embeddings are passed directly, so the
two CLIP and the T5 text encoders and their tokenizers are None. Runs the full denoising loop (batched
classifier-free guidance: batch 2) and the VAE decode, eagerly and compiled, and checks that the images are
bit-identical.

    python examples/sd35_pipeline.py [--steps 3] [--device cuda|cpu] [--dtype bf16|fp32]

Shapes: 16x16 image; AutoencoderKL (2x compression, 4 latent channels, SD3 scaling/shift factors) -> latent
[2, 4, 8, 8] with CFG -> 64 tokens (patch 1); 8 text tokens of 32 channels, pooled 64. SD3Transformer2DModel from
diffusion_fuse.testing.tiny_models ("sd35": 2 blocks, the first with SD3.5's dual attention (AdaLayerNormZeroX),
RMS qk-norm). --repeated-blocks is not supported: SD3Transformer2DModel has no _repeated_blocks in diffusers 0.42.1.
"""

from __future__ import annotations

import torch
from _common import main, parse_args

from diffusion_fuse.testing.tiny_models import build


def tiny_sd35_pipeline(dtype: torch.dtype, device: str):
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    transformer, _ = build("sd35", dtype, device)
    torch.manual_seed(0)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), layers_per_block=1,
        latent_channels=4, norm_num_groups=4, sample_size=16, scaling_factor=1.5305, shift_factor=0.0609,
        use_quant_conv=False, use_post_quant_conv=False,
    ).eval().to(device, dtype)
    # stable-diffusion-3.5-*/scheduler/scheduler_config.json
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    return StableDiffusion3Pipeline(transformer=transformer, scheduler=scheduler, vae=vae,
                                    text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
                                    text_encoder_3=None, tokenizer_3=None)


def generate(pipe, args) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    emb = lambda *shape: torch.randn(*shape, generator=g).to(args.device, args.torch_dtype)  # noqa: E731
    prompt_embeds, negative_embeds, pooled, negative_pooled = emb(1, 8, 32), emb(1, 8, 32), emb(1, 64), emb(1, 64)
    with torch.no_grad():
        return pipe(prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_embeds,
                    pooled_prompt_embeds=pooled, negative_pooled_prompt_embeds=negative_pooled,
                    height=16, width=16, num_inference_steps=args.steps, guidance_scale=4.5, output_type="pt",
                    generator=torch.Generator().manual_seed(1)).images


if __name__ == "__main__":
    from diffusers import SD3Transformer2DModel

    main(parse_args(__doc__, SD3Transformer2DModel), name="SD 3.5 (StableDiffusion3Pipeline)",
         build_pipeline=tiny_sd35_pipeline, generate=generate)
