"""A tiny Wan 2.2 TI2V pipeline (per-token timesteps) whose transformer is compiled with backend="diffusion_fuse".

Wan2.2-TI2V-5B-Diffusers is a WanPipeline with expand_timesteps=True (model_index.json): the transformer gets a
timestep per latent token, [batch, seq_len], and takes its per-token modulation path. Text-to-video (default):
WanPipeline(expand_timesteps=True), every token at the step's t. Image-to-video (--image): the same checkpoint
through WanImageToVideoPipeline(expand_timesteps=True): the image's VAE latent replaces the first latent frame,
whose tokens get timestep 0 while the others get t. Random weights, nothing downloaded (text embeddings are
passed directly; no text/image encoder). Runs the full loop with classifier-free guidance eagerly and compiled
and checks that the videos are bit-identical.

    python examples/wan22_ti2v_pipeline.py [--image] [--steps 3] [--device cuda|cpu] [--dtype bf16|fp32]
        [--repeated-blocks]

Shapes: 3 frames of 32x32; AutoencoderKLWan in its Wan 2.2 form (is_residual=True, 2x2 pixel patchify, 4x spatial
and 2x temporal compression) -> latent [1, 4, 2, 8, 8] -> 32 tokens, timestep [1, 32]; 12 text tokens.
WanTransformer3DModel from diffusion_fuse.testing.tiny_models ("wan22_ti2v").
"""

from __future__ import annotations

import torch
from _common import main, parse_args
from wan21_pipeline import text_embeddings, tiny_wan_vae

from diffusion_fuse.testing.tiny_models import build


def _pipeline_cls(image: bool):
    from diffusers import WanImageToVideoPipeline, WanPipeline

    return WanImageToVideoPipeline if image else WanPipeline


def tiny_wan22_ti2v_pipeline(dtype: torch.dtype, device: str, image: bool = False):
    from diffusers import UniPCMultistepScheduler

    transformer, _ = build("wan22_ti2v", dtype, device)
    # the Wan 2.2 VAE: residual blocks, 2x2 patchify of the 3 RGB channels (12 in/out channels)
    vae = tiny_wan_vae(dtype, device, in_channels=12, out_channels=12, is_residual=True, patch_size=2,
                       scale_factor_spatial=4)
    # Wan2.2-TI2V-5B-Diffusers/scheduler/scheduler_config.json
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        num_train_timesteps=1000, flow_shift=5.0)
    return _pipeline_cls(image)(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler,
                                transformer=transformer, expand_timesteps=True)


def first_frame(size: int = 32):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def generate(pipe, args) -> torch.Tensor:
    prompt_embeds, negative_embeds = text_embeddings(args)
    extra = {"image": first_frame()} if args.image else {}
    with torch.no_grad():
        return pipe(prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_embeds, height=32, width=32,
                    num_frames=3, num_inference_steps=args.steps, guidance_scale=5.0, output_type="pt",
                    generator=torch.Generator().manual_seed(1), **extra).frames


def _add_arguments(ap):
    ap.add_argument("--image", action="store_true",
                    help="image-to-video: WanImageToVideoPipeline(expand_timesteps=True) conditioned on a random "
                         "32x32 image (first-frame tokens at timestep 0)")


if __name__ == "__main__":
    from diffusers import WanTransformer3DModel

    args = parse_args(__doc__, WanTransformer3DModel, add_arguments=_add_arguments)
    main(args, name=f"Wan 2.2 TI2V ({_pipeline_cls(args.image).__name__}, expand_timesteps=True, "
                    f"{'image' if args.image else 'text'}-to-video)",
         build_pipeline=lambda dtype, device: tiny_wan22_ti2v_pipeline(dtype, device, args.image), generate=generate)
