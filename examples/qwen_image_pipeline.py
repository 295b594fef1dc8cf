"""A tiny QwenImagePipeline whose transformer is compiled with backend="diffusion_fuse".

Random weights, nothing downloaded: prompt and negative-prompt embeddings are passed directly, so the
Qwen2.5-VL text encoder and tokenizer are None. Runs the full denoising loop with true classifier-free guidance
(a cond and an uncond transformer call per step; as in the real pipeline the negative prompt is shorter than the
prompt, so the transformer sees two text lengths) and the VAE decode, eagerly and compiled, and checks that the
images are bit-identical.

    python examples/qwen_image_pipeline.py [--steps 3] [--device cuda|cpu] [--dtype bf16|fp32] [--repeated-blocks]

Shapes: 16x16 image; AutoencoderKLQwenImage (2x compression, 4 latent channels) -> latent 8x8 -> 2x2-packed to 16
tokens of 16 channels (img_shapes [(1, 4, 4)]); 7 prompt tokens, 5 negative-prompt tokens, 16 channels.
QwenImageTransformer2DModel from diffusion_fuse.testing.tiny_models (1 block).
"""

from __future__ import annotations

import math

import torch
from _common import main, parse_args

from diffusion_fuse.testing.tiny_models import build


def tiny_qwen_image_pipeline(dtype: torch.dtype, device: str):
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    transformer, _ = build("qwen_image", dtype, device)
    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage(base_dim=4, z_dim=4, dim_mult=[1, 1], num_res_blocks=1, temperal_downsample=[False],
                                 latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[1.5, 0.8, 1.2, 1.0])
    vae = vae.eval().to(device, dtype)
    # Qwen-Image/scheduler/scheduler_config.json
    scheduler = FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256, base_shift=math.log(3), max_image_seq_len=8192, max_shift=math.log(3), shift=1.0,
        shift_terminal=0.02, time_shift_type="exponential", use_dynamic_shifting=True)
    return QwenImagePipeline(scheduler=scheduler, vae=vae, text_encoder=None, tokenizer=None, transformer=transformer)


def generate(pipe, args) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    prompt_embeds = torch.randn(1, 7, 16, generator=g).to(args.device, args.torch_dtype)
    negative_embeds = torch.randn(1, 5, 16, generator=g).to(args.device, args.torch_dtype)
    ones = lambda e: torch.ones(e.shape[:2], dtype=torch.int64, device=args.device)  # noqa: E731
    with torch.no_grad():
        return pipe(prompt_embeds=prompt_embeds, prompt_embeds_mask=ones(prompt_embeds),
                    negative_prompt_embeds=negative_embeds, negative_prompt_embeds_mask=ones(negative_embeds),
                    true_cfg_scale=4.0, height=16, width=16, num_inference_steps=args.steps, output_type="pt",
                    generator=torch.Generator().manual_seed(1)).images


if __name__ == "__main__":
    from diffusers import QwenImageTransformer2DModel

    main(parse_args(__doc__, QwenImageTransformer2DModel), name="Qwen-Image (QwenImagePipeline)",
         build_pipeline=tiny_qwen_image_pipeline, generate=generate)
