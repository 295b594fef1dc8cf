"""Demo: a tiny FluxPipeline whose transformer is compiled with backend="diffusion_fuse".

Random weights (nothing is downloaded): the prompt embeddings are passed directly, so no
tokenizer or text encoder is needed. Runs the full denoising loop eagerly and compiled,
asserts the images are bit-identical, and prints what the backend did.

    python examples/flux_pipeline.py [--steps 4] [--device cuda|cpu] [--dtype bf16|fp32]
"""

from __future__ import annotations

import argparse
import logging
import warnings

import torch

import diffusion_fuse
from diffusion_fuse.testing.tiny_models import build

warnings.filterwarnings("ignore")
logging.getLogger("diffusers").setLevel(logging.ERROR)


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


def generate(pipe, steps: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    prompt_embeds = torch.randn(1, 8, 32, generator=g).to(device, dtype)
    pooled = torch.randn(1, 32, generator=g).to(device, dtype)
    with torch.no_grad():
        return pipe(prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled, height=16, width=16,
                    num_inference_steps=steps, guidance_scale=3.5, output_type="pt",
                    generator=torch.Generator().manual_seed(1)).images


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    pipe = tiny_flux_pipeline(dtype, args.device)
    eager = generate(pipe, args.steps, args.device, dtype)

    pipe.transformer = torch.compile(pipe.transformer, backend="diffusion_fuse")
    fused = generate(pipe, args.steps, args.device, dtype)

    equal = torch.equal(eager.view(torch.int16) if eager.dtype == torch.bfloat16 else eager,
                        fused.view(torch.int16) if fused.dtype == torch.bfloat16 else fused)
    print(diffusion_fuse.last_report().table())
    print(f"\n{args.steps}-step tiny FLUX on {args.device} ({args.dtype}): image {tuple(fused.shape)}, "
          f"bit-identical to eager: {equal}")
    if not equal:
        raise SystemExit("compiled output differs from eager")


if __name__ == "__main__":
    main()
