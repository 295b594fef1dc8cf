"""A tiny SanaPipeline whose transformer is compiled with backend="diffusion_fuse".

Random weights, nothing downloaded: prompt and negative-prompt embeddings (with padding attention masks) are
passed directly, so the Gemma-2 text encoder and tokenizer are None. Runs the full denoising loop (batched
classifier-free guidance: batch 2; DPM-Solver++ flow scheduler as SANA ships it) and the DC-AE decode, eagerly
and compiled, and checks that the images are bit-identical.

    python examples/sana_pipeline.py [--steps 3] [--device cuda|cpu] [--dtype bf16|fp32]

Shapes: 32x32 image (SANA needs multiples of 32); AutoencoderDC (3 stages, 4x compression, 4 latent channels)
-> latent [2, 4, 8, 8] with CFG
-> 64 tokens (patch 1); 6 caption tokens of 8 channels (4 and 2 of them unmasked). SanaTransformer2DModel from
diffusion_fuse.testing.tiny_models (1 block). --repeated-blocks is not supported: SanaTransformer2DModel has no
_repeated_blocks in diffusers 0.42.1.
"""

from __future__ import annotations

import torch
from _common import main, parse_args

from diffusion_fuse.testing.tiny_models import build


def tiny_sana_pipeline(dtype: torch.dtype, device: str):
    from diffusers import AutoencoderDC, DPMSolverMultistepScheduler, SanaPipeline

    transformer, _ = build("sana", dtype, device)
    torch.manual_seed(0)
    vae = AutoencoderDC(
        in_channels=3, latent_channels=4, attention_head_dim=2,
        encoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
        encoder_block_out_channels=(8, 8, 8), decoder_block_out_channels=(8, 8, 8),
        encoder_qkv_multiscales=((), (), (5,)), decoder_qkv_multiscales=((), (), (5,)),
        encoder_layers_per_block=(1, 1, 1), decoder_layers_per_block=(1, 1, 1),
        downsample_block_type="conv", upsample_block_type="interpolate",
        decoder_norm_types="rms_norm", decoder_act_fns="silu", scaling_factor=0.41407,
    ).eval().to(device, dtype)
    # Sana_1600M_1024px_diffusers/scheduler/scheduler_config.json
    scheduler = DPMSolverMultistepScheduler(flow_shift=3.0, prediction_type="flow_prediction", use_flow_sigmas=True)
    return SanaPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=transformer, scheduler=scheduler)


def generate(pipe, args) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    prompt_embeds = torch.randn(1, 6, 8, generator=g).to(args.device, args.torch_dtype)
    negative_embeds = torch.randn(1, 6, 8, generator=g).to(args.device, args.torch_dtype)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]], device=args.device)
    negative_mask = torch.tensor([[1, 1, 0, 0, 0, 0]], device=args.device)
    with torch.no_grad():
        return pipe(negative_prompt=None, prompt_embeds=prompt_embeds, prompt_attention_mask=mask,
                    negative_prompt_embeds=negative_embeds, negative_prompt_attention_mask=negative_mask,
                    height=32, width=32, use_resolution_binning=False, num_inference_steps=args.steps,
                    guidance_scale=4.5, output_type="pt", generator=torch.Generator().manual_seed(1)).images


if __name__ == "__main__":
    from diffusers import SanaTransformer2DModel

    main(parse_args(__doc__, SanaTransformer2DModel), name="SANA (SanaPipeline)",
         build_pipeline=tiny_sana_pipeline, generate=generate)
