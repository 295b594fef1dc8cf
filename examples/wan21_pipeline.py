"""A tiny WanPipeline (Wan 2.1 text-to-video) whose transformer is compiled with backend="diffusion_fuse".

Random weights, nothing downloaded: prompt and negative-prompt embeddings are passed directly, so the UMT5
text encoder and tokenizer are None. Runs the full denoising loop (classifier-free guidance: a cond and an
uncond transformer call per step, UniPC flow-matching scheduler as Wan 2.1 ships it) and the VAE decode,
eagerly and compiled, and checks that the videos are bit-identical.

    python examples/wan21_pipeline.py [--steps 3] [--device cuda|cpu] [--dtype bf16|fp32] [--repeated-blocks]

Shapes: 3 frames of 16x16; AutoencoderKLWan (causal 3D VAE, 2x spatial and 2x temporal compression) -> latent
[1, 4, 2, 8, 8] -> 32 tokens after the (1, 2, 2) patch embedding; 12 text tokens. WanTransformer3DModel from
diffusion_fuse.testing.tiny_models ("wan21": 1 block, one timestep per sample).
"""

from __future__ import annotations

import torch
from _common import main, parse_args

from diffusion_fuse.testing.tiny_models import build


def tiny_wan_vae(dtype: torch.dtype, device: str, **overrides):
    from diffusers import AutoencoderKLWan

    cfg = dict(base_dim=4, z_dim=4, dim_mult=[1, 1], num_res_blocks=1, temperal_downsample=[True],
               scale_factor_spatial=2, scale_factor_temporal=2, latents_mean=[0.1, -0.2, 0.3, 0.0],
               latents_std=[1.5, 0.8, 1.2, 1.0])
    cfg.update(overrides)
    torch.manual_seed(0)
    return AutoencoderKLWan(**cfg).eval().to(device, dtype)


def wan_scheduler():
    from diffusers import UniPCMultistepScheduler

    # Wan2.1-T2V-*-Diffusers/scheduler/scheduler_config.json
    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000,
                                   flow_shift=3.0)


def tiny_wan21_pipeline(dtype: torch.dtype, device: str):
    from diffusers import WanPipeline

    transformer, _ = build("wan21", dtype, device)
    return WanPipeline(tokenizer=None, text_encoder=None, vae=tiny_wan_vae(dtype, device), scheduler=wan_scheduler(),
                       transformer=transformer)


def text_embeddings(args):
    g = torch.Generator().manual_seed(0)
    prompt_embeds = torch.randn(1, 12, 16, generator=g).to(args.device, args.torch_dtype)
    negative_embeds = torch.randn(1, 12, 16, generator=g).to(args.device, args.torch_dtype)
    return prompt_embeds, negative_embeds


def generate(pipe, args) -> torch.Tensor:
    prompt_embeds, negative_embeds = text_embeddings(args)
    with torch.no_grad():
        return pipe(prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_embeds, height=16, width=16,
                    num_frames=3, num_inference_steps=args.steps, guidance_scale=5.0, output_type="pt",
                    generator=torch.Generator().manual_seed(1)).frames


if __name__ == "__main__":
    from diffusers import WanTransformer3DModel

    main(parse_args(__doc__, WanTransformer3DModel), name="Wan 2.1 T2V (WanPipeline)",
         build_pipeline=tiny_wan21_pipeline, generate=generate)
