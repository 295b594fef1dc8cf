"""Whole models at real shapes: eager vs Inductor vs diffusion_fuse lossless vs high, in one run.

Models (random weights, bf16, built directly on the GPU; configs are the official ``config.json`` values, written
below with their source): FLUX.1-dev 1024², SANA-1.6B 1024² batch 2, Wan2.2-TI2V-5B 704p/121f, Qwen-Image 1024²,
FLUX.2-dev 1024², Wan2.1-T2V-14B 480p/81f, SD3.5-large 1024² batch 2, at full depth (reduced only if the weights do
not fit, and then said); these seven run by default. With ``--models``, also DiTs no family was written for:
PixArt-Sigma, LTX-Video, CogVideoX-2B, Lumina-Image-2.0, HunyuanVideo (15 of its 60 blocks), and the plain-PyTorch
DiTs of ``diffusion_fuse.testing`` (``plain_dit``, ``rms_dit``, ``joint_dit``) at FLUX's width.

Variants: ``eager``; ``inductor`` (default mode); ``inductor-max-autotune`` (``max-autotune-no-cudagraphs``, only
with ``--max-autotune``: its compile is slow); ``lossless`` and ``high`` (``backend="diffusion_fuse"``). Every
compiled variant uses regional compilation, diffusers' ``compile_repeated_blocks`` (the transformer blocks are
compiled, the rest runs eagerly), to keep compile time down; each variant's compiled blocks are kept and swapped in
per timing, so all variants share one set of weights. ``--whole`` compiles the whole transformer instead, as the
one line ``torch.compile(pipe.transformer, ...)`` does: one graph per variant (also over the one set of weights),
in which the lossless tier sees across block boundaries.

Per variant: the first call's wall time (compile, and for diffusion_fuse the verification) and peak memory; one
forward per timing between CUDA events, after a warm-up call, variants interleaved ABBA (round r runs the variants
in order, round r+1 in reverse), medians; peak memory of the timed forwards; bit-exactness against eager
(``torch.equal`` on integer views, first call and last timed call); relative L2 error for the rest.

    python benchmarks/bench_models.py [--models flux1,sana,wan22_5b] [--reps 6] [--max-autotune] [--whole] [--json PATH]
    python benchmarks/bench_models.py --estimate           # the per-model time estimates only (no GPU needed)
    python benchmarks/bench_models.py --table [--json PATH] [--md BENCHMARKS.md]   # regenerate the table
    python benchmarks/bench_models.py --tiny               # tiny models on the CPU: the code path, in seconds (CI)

Writes JSON (default ``$OUT/bench_models.json``) after every model, so a run stopped by a time limit keeps what
it finished.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import gc
import importlib
import inspect
import json
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

warnings.filterwarnings("ignore")

# --------------------------------------------------------------------------------------------------------------
# Models: official configs (diffusers format), real input shapes
# --------------------------------------------------------------------------------------------------------------
# black-forest-labs/FLUX.1-dev, transformer/config.json
FLUX1_DEV = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                 num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                 axes_dims_rope=(16, 56, 56))
# Efficient-Large-Model/Sana_1600M_1024px_diffusers, transformer/config.json (diffusers'
# scripts/convert_sana_to_diffusers.py, SanaMS_1600M_P1_D20 at 1024px)
SANA_1600M = dict(in_channels=32, out_channels=32, num_attention_heads=70, attention_head_dim=32, num_layers=20,
                  num_cross_attention_heads=20, cross_attention_head_dim=112, cross_attention_dim=2240,
                  caption_channels=2304, mlp_ratio=2.5, attention_bias=False, sample_size=32, patch_size=1,
                  norm_elementwise_affine=False, norm_eps=1e-6, interpolation_scale=None)
# Wan-AI/Wan2.2-TI2V-5B-Diffusers, transformer/config.json
WAN22_TI2V_5B = dict(patch_size=(1, 2, 2), num_attention_heads=24, attention_head_dim=128, in_channels=48,
                     out_channels=48, text_dim=4096, freq_dim=256, ffn_dim=14336, num_layers=30, cross_attn_norm=True,
                     qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None,
                     rope_max_seq_len=1024)
# Qwen/Qwen-Image, transformer/config.json
QWEN_IMAGE = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                  num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=(16, 56, 56))
# black-forest-labs/FLUX.2-dev, transformer/config.json (diffusers' scripts/convert_flux2_to_diffusers.py, flux2-dev)
FLUX2_DEV = dict(patch_size=1, in_channels=128, num_layers=8, num_single_layers=48, attention_head_dim=128,
                 num_attention_heads=48, joint_attention_dim=15360, timestep_guidance_channels=256, mlp_ratio=3.0,
                 axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6, guidance_embeds=True)
# Wan-AI/Wan2.1-T2V-14B-Diffusers, transformer/config.json
WAN21_T2V_14B = dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
                     out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40, cross_attn_norm=True,
                     qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None,
                     rope_max_seq_len=1024)


def _randn(gen, *shape):
    return torch.randn(*shape, device=gen.device, generator=gen).to(torch.bfloat16)


# stabilityai/stable-diffusion-3.5-large, transformer/config.json
SD35_LARGE = dict(sample_size=128, patch_size=2, in_channels=16, num_layers=38, attention_head_dim=64,
                  num_attention_heads=38, joint_attention_dim=4096, caption_projection_dim=2432,
                  pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192, qk_norm="rms_norm")


def _flux1_inputs(gen):
    # 1024²: 128x128 latents, 2x2-packed -> 64x64 = 4096 tokens of 64 channels; 512 T5 tokens (max_sequence_length).
    d = gen.device
    ids = torch.zeros(64, 64, 3, device=d)
    ids[..., 1] = torch.arange(64, device=d)[:, None]
    ids[..., 2] = torch.arange(64, device=d)[None, :]
    return dict(hidden_states=_randn(gen, 1, 4096, 64), encoder_hidden_states=_randn(gen, 1, 512, 4096),
                pooled_projections=_randn(gen, 1, 768), timestep=torch.tensor([0.5], device=d).bfloat16(),
                img_ids=ids.reshape(-1, 3), txt_ids=torch.zeros(512, 3, device=d),
                guidance=torch.tensor([3.5], device=d).bfloat16(), return_dict=False)


def _sana_inputs(gen):
    # 1024² through the 32x DC-AE: 32x32 latents of 32 channels (1024 tokens); batch 2 (CFG); 300 Gemma tokens.
    d = gen.device
    return dict(hidden_states=_randn(gen, 2, 32, 32, 32), encoder_hidden_states=_randn(gen, 2, 300, 2304),
                timestep=torch.tensor([500.0, 500.0], device=d).bfloat16(),
                encoder_attention_mask=torch.ones(2, 300, dtype=torch.int64, device=d), return_dict=False)


def _wan22_inputs(gen):
    # 1280x704, 121 frames through the 16x VAE: 31 x 44 x 80 latents of 48 channels -> 27,280 tokens; TI2V per-token
    # timesteps, the conditioning frame at 0; 512 UMT5 tokens.
    d = gen.device
    ts = torch.full((31, 22, 40), 500, dtype=torch.int64, device=d)
    ts[0] = 0
    return dict(hidden_states=_randn(gen, 1, 48, 31, 44, 80), timestep=ts.flatten().unsqueeze(0),
                encoder_hidden_states=_randn(gen, 1, 512, 4096), return_dict=False)


def _qwen_inputs(gen):
    # 1024²: 128x128 latents, 2x2-packed -> 4096 tokens of 64 channels; 512 text tokens (max_sequence_length).
    d = gen.device
    return dict(hidden_states=_randn(gen, 1, 4096, 64), encoder_hidden_states=_randn(gen, 1, 512, 3584),
                encoder_hidden_states_mask=torch.ones(1, 512, dtype=torch.int64, device=d),
                timestep=torch.tensor([0.5], device=d).bfloat16(), img_shapes=[(1, 64, 64)], return_dict=False)


def _flux2_inputs(gen):
    # 1024²: 128x128 latents of 32 channels, 2x2-patchified -> 4096 tokens of 128; 512 Mistral tokens of 15360.
    d = gen.device
    img_ids = torch.cartesian_prod(*(torch.arange(n, device=d) for n in (1, 64, 64, 1)))
    txt_ids = torch.cartesian_prod(*(torch.arange(n, device=d) for n in (1, 1, 1, 512)))
    return dict(hidden_states=_randn(gen, 1, 4096, 128), encoder_hidden_states=_randn(gen, 1, 512, 15360),
                timestep=torch.tensor([0.5], device=d).bfloat16(), img_ids=img_ids, txt_ids=txt_ids,
                guidance=torch.tensor([4.0], device=d).bfloat16(), return_dict=False)


def _wan21_inputs(gen):
    # 832x480, 81 frames through the 8x VAE: 21 x 60 x 104 latents of 16 channels -> 32,760 tokens; 512 UMT5 tokens.
    d = gen.device
    return dict(hidden_states=_randn(gen, 1, 16, 21, 60, 104), timestep=torch.tensor([500], device=d),
                encoder_hidden_states=_randn(gen, 1, 512, 4096), return_dict=False)


def _sd35_inputs(gen):
    # 1024² through the 8x VAE: 128x128 latents of 16 channels (4096 tokens after 2x2 patches); batch 2 (CFG);
    # 333 text tokens (77 CLIP + 256 T5), pooled CLIP-L and CLIP-G embeddings.
    d = gen.device
    return dict(hidden_states=_randn(gen, 2, 16, 128, 128), encoder_hidden_states=_randn(gen, 2, 333, 4096),
                pooled_projections=_randn(gen, 2, 2048), timestep=torch.tensor([500.0, 500.0], device=d).bfloat16(),
                return_dict=False)


# --- models no family was written for: how the lossless tier does on forms it was not shown -------------------
# PixArt-alpha/PixArt-Sigma-XL-2-1024-MS, transformer/config.json
PIXART_SIGMA = dict(sample_size=128, num_layers=28, attention_head_dim=72, num_attention_heads=16, in_channels=4,
                    out_channels=8, patch_size=2, cross_attention_dim=1152, caption_channels=4096,
                    attention_bias=True, activation_fn="gelu-approximate", num_embeds_ada_norm=1000,
                    norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6, interpolation_scale=2,
                    use_additional_conditions=False)
# Lumina-Image 2.0: the class defaults, with Gemma-2-2B's hidden size (2304) for the caption features
LUMINA2 = dict(cap_feat_dim=2304)
# HunyuanVideo: the class defaults (the 13B model), 5 of its 20 double and 10 of its 40 single blocks to keep the
# compile short (the ratio between variants is per block)
HUNYUAN_VIDEO = dict(num_layers=5, num_single_layers=10)
# the plain-PyTorch DiTs of diffusion_fuse.testing at FLUX's width: 3072 wide, 24 heads of 128
PLAIN_DIT = dict(in_channels=16, patch=2, dim=3072, heads=24, depth=16)
JOINT_DIT = dict(dim=3072, heads=24, depth=8, out_dim=64)


def _pixart_inputs(gen):
    # 1024² through the 8x VAE: 128x128 latents of 4 channels (4096 tokens); batch 2 (CFG); 300 T5 tokens.
    d = gen.device
    return dict(hidden_states=_randn(gen, 2, 4, 128, 128), encoder_hidden_states=_randn(gen, 2, 300, 4096),
                encoder_attention_mask=torch.ones(2, 300, dtype=torch.int64, device=d),
                timestep=torch.tensor([500, 500], device=d), added_cond_kwargs={"resolution": None,
                                                                                "aspect_ratio": None},
                return_dict=False)


def _ltx_inputs(gen):
    # 768x512, 121 frames through the 32x/8x VAE: 16 x 16 x 24 latents of 128 channels -> 6,144 tokens; 128 T5
    # tokens; the pipeline's RoPE scale at 25 frames/s.
    d = gen.device
    return dict(hidden_states=_randn(gen, 1, 6144, 128), encoder_hidden_states=_randn(gen, 1, 128, 4096),
                timestep=torch.tensor([500.0], device=d).bfloat16(),
                encoder_attention_mask=torch.ones(1, 128, dtype=torch.int64, device=d),
                num_frames=16, height=16, width=24, rope_interpolation_scale=(8 / 25, 32, 32), return_dict=False)


def _cogvideox_inputs(gen):
    # 720x480, 49 frames through the 8x/4x VAE: 13 frames of 16 x 60 x 90 latents -> 17,550 tokens; 226 T5 tokens.
    d = gen.device
    return dict(hidden_states=_randn(gen, 1, 13, 16, 60, 90), encoder_hidden_states=_randn(gen, 1, 226, 4096),
                timestep=torch.tensor([500], device=d), return_dict=False)


def _lumina2_inputs(gen):
    # 1024²: 128x128 latents of 16 channels (4096 tokens); 256 Gemma tokens; t in [0, 1].
    d = gen.device
    return dict(hidden_states=_randn(gen, 1, 16, 128, 128), timestep=torch.tensor([0.5], device=d).bfloat16(),
                encoder_hidden_states=_randn(gen, 1, 256, 2304),
                encoder_attention_mask=torch.ones(1, 256, dtype=torch.int64, device=d), return_dict=False)


def _hunyuan_video_inputs(gen):
    # 960x544, 61 frames through the 8x/4x VAE: 16 x 68 x 120 latents, 2x2 patches -> 32,640 tokens; 256 LLaMA
    # tokens, a pooled CLIP embedding, embedded guidance 6 (the pipeline's x1000).
    d = gen.device
    return dict(hidden_states=_randn(gen, 1, 16, 16, 68, 120), timestep=torch.tensor([500], device=d),
                encoder_hidden_states=_randn(gen, 1, 256, 4096),
                encoder_attention_mask=torch.ones(1, 256, dtype=torch.int64, device=d),
                pooled_projections=_randn(gen, 1, 768), guidance=torch.tensor([6000.0], device=d).bfloat16(),
                return_dict=False)


def _plain_inputs(gen):
    # 1024² through an 8x VAE: 128x128 latents of 16 channels, 2x2 patches -> 4096 tokens.
    return dict(x=_randn(gen, 1, 16, 128, 128), t=torch.tensor([500.0], device=gen.device).bfloat16())


def _joint_inputs(gen):
    # 4096 image and 512 text tokens, already embedded, and a pooled conditioning.
    return dict(x=_randn(gen, 1, 4096, 3072), context=_randn(gen, 1, 512, 3072), temb=_randn(gen, 1, 3072))


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    label: str
    cls: str  # a diffusers class, or "module.Class" of a plain nn.Module
    config: dict
    source: str  # where the config comes from
    inputs: Callable[[torch.Generator], dict]
    shape: str
    tiny: str  # the same class at a tiny size: a name in tiny_models, the zoo or user_dits (build_tiny)
    eager_ms: float  # eager forward, for the time estimate: measured (H200 for the seven, H100 for the rest),
    # except cogvideox_2b and hunyuan_video (guesses until run)
    depth_keys: tuple[str, ...]
    repeated_blocks: tuple[str, ...] = ()  # when diffusers declares none: set here for regional compilation


MODELS = {s.name: s for s in [
    ModelSpec("flux1", "FLUX.1-dev", "FluxTransformer2DModel", FLUX1_DEV,
              "black-forest-labs/FLUX.1-dev transformer/config.json", _flux1_inputs,
              "1024², 4096 image + 512 text tokens", "flux", 177, ("num_layers", "num_single_layers")),
    ModelSpec("sana", "SANA-1.6B", "SanaTransformer2DModel", SANA_1600M,
              "Efficient-Large-Model/Sana_1600M_1024px_diffusers transformer/config.json", _sana_inputs,
              "1024², batch 2, 1024 image + 300 text tokens", "sana", 25, ("num_layers",),
              repeated_blocks=("SanaTransformerBlock",)),
    ModelSpec("wan22_5b", "Wan2.2-TI2V-5B", "WanTransformer3DModel", WAN22_TI2V_5B,
              "Wan-AI/Wan2.2-TI2V-5B-Diffusers transformer/config.json", _wan22_inputs,
              "704p/121f, 27,280 tokens, per-token timesteps", "wan22_ti2v", 1650, ("num_layers",)),
    ModelSpec("qwen_image", "Qwen-Image", "QwenImageTransformer2DModel", QWEN_IMAGE,
              "Qwen/Qwen-Image transformer/config.json", _qwen_inputs,
              "1024², 4096 image + 512 text tokens", "qwen_image", 196, ("num_layers",)),
    ModelSpec("flux2", "FLUX.2-dev", "Flux2Transformer2DModel", FLUX2_DEV,
              "black-forest-labs/FLUX.2-dev transformer/config.json", _flux2_inputs,
              "1024², 4096 image + 512 text tokens", "flux2", 556, ("num_layers", "num_single_layers")),
    ModelSpec("wan21_14b", "Wan2.1-T2V-14B", "WanTransformer3DModel", WAN21_T2V_14B,
              "Wan-AI/Wan2.1-T2V-14B-Diffusers transformer/config.json", _wan21_inputs,
              "480p/81f, 32,760 tokens", "wan21", 3306, ("num_layers",)),
    ModelSpec("sd35_large", "SD3.5-large", "SD3Transformer2DModel", SD35_LARGE,
              "stabilityai/stable-diffusion-3.5-large transformer/config.json", _sd35_inputs,
              "1024², batch 2, 4096 image + 333 text tokens", "sd35", 187, ("num_layers",),
              repeated_blocks=("JointTransformerBlock",)),
    # models no family was written for, and DiTs written in plain PyTorch
    ModelSpec("pixart_sigma", "PixArt-Sigma", "PixArtTransformer2DModel", PIXART_SIGMA,
              "PixArt-alpha/PixArt-Sigma-XL-2-1024-MS transformer/config.json", _pixart_inputs,
              "1024², batch 2, 4096 image + 300 text tokens", "pixart", 40, ("num_layers",),
              repeated_blocks=("BasicTransformerBlock",)),
    ModelSpec("ltx_video", "LTX-Video", "LTXVideoTransformer3DModel", {},
              "diffusers' class defaults (LTX-Video 2B)", _ltx_inputs,
              "768x512/121f, 6,144 video + 128 text tokens", "ltx", 93, ("num_layers",)),
    ModelSpec("cogvideox_2b", "CogVideoX-2B", "CogVideoXTransformer3DModel", {},
              "diffusers' class defaults (CogVideoX-2B)", _cogvideox_inputs,
              "720x480/49f, 17,550 video + 226 text tokens", "cogvideox", 300, ("num_layers",),
              repeated_blocks=("CogVideoXBlock",)),
    ModelSpec("lumina2", "Lumina-Image-2.0", "Lumina2Transformer2DModel", LUMINA2,
              "diffusers' class defaults, caption features 2304 wide", _lumina2_inputs,
              "1024², 4096 image + 256 text tokens", "lumina2", 92, ("num_layers",),
              repeated_blocks=("Lumina2TransformerBlock",)),
    ModelSpec("hunyuan_video", "HunyuanVideo, 15 of 60 blocks", "HunyuanVideoTransformer3DModel", HUNYUAN_VIDEO,
              "diffusers' class defaults (HunyuanVideo 13B), depth reduced", _hunyuan_video_inputs,
              "960x544/61f, 32,640 video + 256 text tokens", "hunyuan_video", 700,
              ("num_layers", "num_single_layers")),
    ModelSpec("plain_dit", "PlainDiT", "diffusion_fuse.testing.plain_dit.PlainDiT", PLAIN_DIT,
              "diffusion_fuse.testing.plain_dit at 3072 wide, 16 blocks", _plain_inputs,
              "1024², 4096 tokens", "plain_dit", 53, ("depth",), repeated_blocks=("Block",)),
    ModelSpec("rms_dit", "RMSDiT", "diffusion_fuse.testing.user_dits.RMSDiT", PLAIN_DIT,
              "diffusion_fuse.testing.user_dits at 3072 wide, 16 blocks", _plain_inputs,
              "1024², 4096 tokens", "rms_dit", 64, ("depth",), repeated_blocks=("RMSBlock",)),
    ModelSpec("joint_dit", "JointDiT", "diffusion_fuse.testing.user_dits.JointDiT", JOINT_DIT,
              "diffusion_fuse.testing.user_dits at 3072 wide, 8 blocks", _joint_inputs,
              "4096 image + 512 text tokens", "joint_dit", 34, ("depth",), repeated_blocks=("JointBlock",)),
]}
# the seven run by default; FLUX.1-dev, SANA and Wan2.2-5B first: the cheapest to run, the most telling
DEFAULT_MODELS = list(MODELS)[:7]

# --------------------------------------------------------------------------------------------------------------
# Variants
# --------------------------------------------------------------------------------------------------------------
VARIANTS = ("eager", "inductor", "inductor-max-autotune", "lossless", "high",
            # diagnostics (host overhead): torch's aot_eager (the ATen graph run as-is, what our executor
            # starts from), lossless with no family at all, lossless without the pointwise family
            "aot-eager", "lossless-nofuse", "lossless-nopw",
            # lossless under CUDA graphs without the grouped_gemv family (each modulation linear its own cuBLAS call)
            "lossless-nogemv-cudagraphs",
            # lossless under CUDA graphs with the opt-in families on (depthwise_conv: SANA's GLUMBConv)
            "lossless-optin-cudagraphs",
            # CUDA graphs (torch's cudagraph trees) for host-bound models: mode="reduce-overhead" for Inductor,
            # options={"cudagraphs": True} (the same mode) for lossless
            "inductor-cudagraphs", "lossless-cudagraphs",
            # host-time diagnostic: lossless-cudagraphs with Dynamo's guards built under
            # torch._dynamo.config.use_recursive_dict_tags_for_guards (an unchanged module tree skips its guards)
            "lossless-cudagraphs-tagguards")
DEFAULT_VARIANTS = ("eager", "inductor", "lossless", "high")


def compile_kwargs(variant: str, report) -> dict:
    """torch.compile arguments of a compiled variant (``report``: the diffusion_fuse Report of lossless/high).

    ``dynamic=False``: one resolution, static graphs for every variant. (Without it, Dynamo's automatic dynamic
    shapes would see the block classes' different shapes through the one frame they share, ``_call_impl``, and
    make later variants' graphs dynamic: variants would not compile alike.)
    """
    import diffusion_fuse

    if variant == "inductor":
        return dict(backend="inductor", dynamic=False)
    if variant == "inductor-max-autotune":
        return dict(backend="inductor", mode="max-autotune-no-cudagraphs", dynamic=False)
    if variant == "inductor-cudagraphs":
        return dict(backend="inductor", mode="reduce-overhead", dynamic=False)
    if variant == "aot-eager":
        return dict(backend="aot_eager", dynamic=False)
    quality = "high" if variant == "high" else "lossless"
    opts: dict[str, Any] = {"quality": quality}
    if variant == "lossless-nofuse":
        from diffusion_fuse.patterns.registry import REGISTRY

        opts["patterns"] = {f: False for f in REGISTRY.names()}
    elif variant == "lossless-nopw":
        opts["patterns"] = {"pointwise": False}
    elif variant in ("lossless-cudagraphs", "lossless-cudagraphs-tagguards"):
        opts["cudagraphs"] = True
    elif variant == "lossless-nogemv-cudagraphs":
        opts["patterns"] = {"grouped_gemv": False}
        opts["cudagraphs"] = True
    elif variant == "lossless-optin-cudagraphs":
        from diffusion_fuse.patterns.registry import REGISTRY

        opts["patterns"] = {f.name: True for f in REGISTRY.families() if not f.on_by_default}
        opts["cudagraphs"] = True
    return dict(backend=diffusion_fuse.DiffusionFuseBackend(opts, report), dynamic=False)


# Rough per-block-class compile seconds and extra forward-equivalents on the first call (verification), for the
# time estimate only.
COMPILE_S = {"eager": 0, "inductor": 30, "inductor-max-autotune": 240, "lossless": 8, "high": 40, "aot-eager": 8,
             "lossless-nofuse": 8, "lossless-nopw": 8, "inductor-cudagraphs": 30,
             "lossless-cudagraphs": 8,
             "lossless-cudagraphs-tagguards": 8, "lossless-nogemv-cudagraphs": 8, "lossless-optin-cudagraphs": 8}
FIRST_CALL_FORWARDS = {"eager": 1, "inductor": 1, "inductor-max-autotune": 1, "lossless": 3, "high": 3,
                       "aot-eager": 1, "lossless-nofuse": 1, "lossless-nopw": 3,
                       "inductor-cudagraphs": 3, "lossless-cudagraphs": 4,
                       "lossless-cudagraphs-tagguards": 4,
                       "lossless-nogemv-cudagraphs": 4, "lossless-optin-cudagraphs": 4}
BUILD_S = 10


def estimate_s(spec: ModelSpec, variants, reps: int) -> tuple[float, float, float]:
    """(total, compile, forwards) seconds: a rough guide for planning GPU time, not a measurement."""
    classes = len(spec.depth_keys)  # FLUX.1/FLUX.2: double and single blocks; the others: one block class
    compile_s = classes * sum(COMPILE_S[v] for v in variants)
    forwards = sum(FIRST_CALL_FORWARDS[v] + 1 + reps for v in variants) * spec.eager_ms / 1000
    return BUILD_S + compile_s + forwards, compile_s, forwards


# --------------------------------------------------------------------------------------------------------------
# Building and regional compilation
# --------------------------------------------------------------------------------------------------------------
def model_class(name: str) -> type:
    """A diffusers class by name, or any class by its dotted path (a plain-PyTorch DiT)."""
    if "." not in name:
        import diffusers

        return getattr(diffusers, name)
    module, _, cls = name.rpartition(".")
    return getattr(importlib.import_module(module), cls)


def build_tiny(name: str) -> tuple[torch.nn.Module, dict]:
    """``(model, kwargs)`` of the tiny CPU model ``name``: from tiny_models, the zoo or user_dits (whose positional
    arguments become keywords)."""
    from diffusion_fuse.testing import tiny_models, user_dits, zoo

    if name in tiny_models.MODEL_NAMES:
        return tiny_models.build(name, torch.bfloat16, "cpu")
    if name in zoo.ZOO:
        return zoo.ZOO[name].build(torch.bfloat16, "cpu")
    model, args = user_dits.build_user_dit(name, torch.bfloat16, "cpu")
    return model, dict(inspect.signature(model.forward).bind(*args).arguments)


def build_real(spec: ModelSpec, notes: list[str]) -> torch.nn.Module:
    """The model on the GPU in bf16 with random weights, full depth unless its weights do not fit."""
    from diffusion_fuse.testing.tiny_models import cast_like_from_pretrained

    cls = model_class(spec.cls)
    config = dict(spec.config)
    with torch.device("meta"):
        n_params = sum(p.numel() for p in cls(**config).parameters())
    free = torch.cuda.mem_get_info()[0]
    headroom = 24 * 2**30  # activations, the verifier's reference values, compiled code
    weights = 2 * n_params
    if weights + headroom > free:
        scale = (free - headroom) / weights
        for k in spec.depth_keys:
            config[k] = max(1, math.floor(config[k] * scale))
        notes.append(f"depth reduced to {', '.join(f'{k}={config[k]}' for k in spec.depth_keys)} of "
                     f"{', '.join(f'{spec.config[k]}' for k in spec.depth_keys)}: {weights / 2**30:.0f} GiB of "
                     f"weights, {free / 2**30:.0f} GiB free")
    # bf16 as the default dtype while constructing: no fp32 copy of the weights. Non-persistent buffers of these
    # classes set their dtypes explicitly, so they come out as from_pretrained leaves them.
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = cls(**config)
    finally:
        torch.set_default_dtype(torch.float32)
    cast_like_from_pretrained(model.eval(), torch.bfloat16)  # _keep_in_fp32_modules back to fp32 (Wan)
    return model.requires_grad_(False)


def compile_blocks(model: torch.nn.Module, kwargs: dict) -> dict[torch.nn.Module, Callable]:
    """diffusers' ``compile_repeated_blocks(**kwargs)``, its compiled blocks taken back so variants can be swapped.
    A plain nn.Module compiles its ``_repeated_blocks`` the same way, block by block."""
    if hasattr(model, "compile_repeated_blocks"):
        model.compile_repeated_blocks(**kwargs)
    else:
        for m in model.modules():
            if type(m).__name__ in model._repeated_blocks:
                m.compile(**kwargs)
    impls = {m: m._compiled_call_impl for m in model.modules() if m._compiled_call_impl is not None}
    for m in impls:
        m._compiled_call_impl = None
    return impls


def activate(blocks: list[torch.nn.Module], impls: dict | None) -> None:
    for m in blocks:
        m._compiled_call_impl = impls[m] if impls else None


# --------------------------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------------------------
def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[t.dtype])


def rel_l2(ref: torch.Tensor, out: torch.Tensor) -> float:
    r, o = ref.float(), out.float()
    return float((r - o).norm() / r.norm().clamp_min(1e-30))


def abba(variants: list[str], reps: int) -> list[tuple[int, str]]:
    """(round, variant) in timing order: even rounds run the variants in order, odd rounds in reverse."""
    return [(r, v) for r in range(reps) for v in (variants if r % 2 == 0 else variants[::-1])]


CPROFILE: str | None = None  # --cprofile VARIANT
BACK_TO_BACK = 0  # --back-to-back N: N forwards issued without a sync between them, per forward
WHOLE = False  # --whole: compile the whole transformer (one graph per variant), not the repeated blocks
PROFILE: list[str] = []  # --profile VARIANTS: one forward each under torch.profiler (kernel table, GPU idle gaps)
HOST_MS: list[float] = []  # host time of each timed_call on CUDA: until the call returned, before the sync


def timed_call(fn: Callable[[], Any], cuda: bool) -> tuple[Any, float, float | None]:
    """(output, ms, peak GiB) of one call: CUDA events on the GPU, perf_counter on the CPU."""
    if not cuda:
        t0 = time.perf_counter()
        out = fn()
        return out, (time.perf_counter() - t0) * 1e3, None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    a.record()
    out = fn()
    b.record()
    HOST_MS.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return out, a.elapsed_time(b), torch.cuda.max_memory_allocated() / 2**30


def run_model(spec: ModelSpec, variants: list[str], reps: int, tiny: bool) -> dict:
    import diffusion_fuse

    cuda = not tiny
    notes: list[str] = []
    t_start = time.perf_counter()
    if tiny:
        model, kwargs = build_tiny(spec.tiny)
    else:
        model = build_real(spec, notes)
        kwargs = spec.inputs(torch.Generator(device="cuda").manual_seed(0))
    if spec.repeated_blocks and not getattr(model, "_repeated_blocks", None):
        model._repeated_blocks = list(spec.repeated_blocks)
        notes.append(f"{spec.cls} declares no _repeated_blocks; set to {list(spec.repeated_blocks)}")
    block_classes = list(model._repeated_blocks)
    blocks = [m for m in model.modules() if type(m).__name__ in block_classes]
    if WHOLE:
        notes.append(f"compiled variants: the whole transformer (torch.compile(model, dynamic=False)), "
                     f"{len(blocks)} {'/'.join(block_classes)} blocks and the rest in one graph")
    else:
        notes.append(f"compiled variants: regional compilation (diffusers compile_repeated_blocks, dynamic=False) of "
                     f"{len(blocks)} {'/'.join(block_classes)} blocks; the rest of the model runs eagerly in every "
                     "variant")
    rec: dict[str, Any] = {"model": spec.name, "label": spec.label + (" (whole)" if WHOLE else ""), "phases": [],
                           "compile": "whole" if WHOLE else "regional",
                           "shape": f"tiny {spec.tiny} on the CPU" if tiny else spec.shape,
                           "config_source": "diffusion_fuse.testing (tiny)" if tiny else spec.source,
                           "tiny": tiny, "notes": notes,
                           "params_B": sum(p.numel() for p in model.parameters()) / 1e9, "variants": {}}
    impls: dict[str, dict | None] = {"eager": None}
    whole: dict[str, Callable] = {}  # --whole: each compiled variant's torch.compile(model)
    reports: dict[str, Any] = {}
    ref = None

    def fwd(v: str):
        call = whole.get(v, model)
        if "-cudagraphs" in v:  # a new forward for the cudagraph trees; the output outlives the next replay
            torch.compiler.cudagraph_mark_step_begin()
            return call(**kwargs)[0].clone()
        return call(**kwargs)[0]

    with torch.no_grad():
        for v in variants:  # first call (compile, verification) and one warm-up call per variant
            vr: dict[str, Any] = {}
            rec["variants"][v] = vr
            try:
                if v.startswith(("lossless", "high")):
                    reports[v] = diffusion_fuse.Report()
                if v != "eager" and WHOLE:
                    whole[v], impls[v] = torch.compile(model, **compile_kwargs(v, reports.get(v))), None
                elif v != "eager":
                    impls[v] = compile_blocks(model, compile_kwargs(v, reports.get(v)))
                activate(blocks, impls[v])
                t0 = time.perf_counter()
                # Dynamo builds the guards on the first call (the compile): the -tagguards variant's are built
                # with recursive dict tags (torch's option; a module tree whose dicts are unchanged is not walked)
                with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=v.endswith("-tagguards")):
                    out, _, vr["first_call_peak_GiB"] = timed_call(lambda: fwd(v), cuda)
                vr["first_call_s"] = time.perf_counter() - t0
                if ref is None:
                    ref = out.clone()
                vr["first_call_bit_exact"] = bool(torch.equal(bits(ref), bits(out)))
                timed_call(lambda: fwd(v), cuda)  # warm-up
                if "-cudagraphs" in v:  # the trees warm up, then record on the next call: not a timed one
                    timed_call(lambda: fwd(v), cuda)
                vr["times_ms"], vr["peaks_GiB"] = [], []
            except Exception as e:  # noqa: BLE001 - one variant failing must not lose the others
                vr["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                print(f"  {v}: failed: {vr['error']}", flush=True)
        live = [v for v in variants if "error" not in rec["variants"][v]]
        for r, v in abba(live, reps):
            activate(blocks, impls[v])
            t0 = time.time()  # wall clock, as run_gpu.sh's GPU clock log stamps its samples (clocks_summary.py)
            out, ms, peak = timed_call(lambda: fwd(v), cuda)
            rec["phases"].append([f"{v} one forward", t0, time.time()])
            vr = rec["variants"][v]
            if cuda:  # host-bound when the host time is close to the GPU time
                vr.setdefault("host_times_ms", []).append(HOST_MS[-1])
            vr["times_ms"].append(ms)
            vr["peaks_GiB"].append(peak)
            if r == reps - 1:
                vr["bit_exact"] = bool(vr["first_call_bit_exact"] and torch.equal(bits(ref), bits(out)))
                vr["rel_l2_vs_eager"] = rel_l2(ref, out)
        if BACK_TO_BACK and cuda:  # a denoising loop's view: the host issues the next forward while the GPU runs
            for _, v in abba(live, 3):
                activate(blocks, impls[v])
                fwd(v)
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0 = time.time()
                a.record()
                for _ in range(BACK_TO_BACK):
                    fwd(v)
                b.record()
                b.synchronize()
                rec["phases"].append([f"{v} back to back", t0, time.time()])
                rec["variants"][v].setdefault("b2b_times_ms", []).append(a.elapsed_time(b) / BACK_TO_BACK)
        if CPROFILE and CPROFILE in live:  # where the host time of one variant goes (--cprofile)
            import cProfile
            import io
            import pstats

            activate(blocks, impls[CPROFILE])
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(3):
                fwd(CPROFILE)
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(40)
            rec["cprofile"] = {"variant": CPROFILE, "forwards": 3, "top_by_tottime": buf.getvalue()}
            print(buf.getvalue())
        for v in (v for v in PROFILE if v in live and cuda):  # where the GPU time of a variant goes (--profile)
            from bench_e2e import profile_call  # benchmarks/ is sys.path[0] when this runs as a script

            activate(blocks, impls[v])
            fwd(v)
            rec["variants"][v]["kernel_ms"] = profile_call(lambda: fwd(v), f"{spec.name}_{v}")
    activate(blocks, None)
    for v in live:
        vr = rec["variants"][v]
        vr["ms"] = statistics.median(vr["times_ms"]) if vr["times_ms"] else None
        if vr.get("b2b_times_ms"):
            vr["b2b_ms"] = statistics.median(vr["b2b_times_ms"])
            vr["b2b_forwards"] = BACK_TO_BACK
        vr["host_ms"] = statistics.median(vr["host_times_ms"]) if vr.get("host_times_ms") else None
        vr["peak_GiB"] = max(vr["peaks_GiB"]) if cuda and vr["peaks_GiB"] else None
        if v in reports:
            rep = reports[v]
            ctr = rep.counters()
            vr.update(graphs=len(rep.graphs), sites=len(rep.sites()), kept=rep.count(status="kept"),
                      kernel_hits=sum(ctr["kernel"].values()),
                      graph_notes=sorted({n for g in rep.graphs for n in g.notes}))
    eager_ms = rec["variants"].get("eager", {}).get("ms")
    for v in live:
        vr = rec["variants"][v]
        vr["speedup_vs_eager"] = eager_ms / vr["ms"] if eager_ms and vr.get("ms") else None
        eager_b2b = rec["variants"].get("eager", {}).get("b2b_ms")
        vr["b2b_speedup_vs_eager"] = eager_b2b / vr["b2b_ms"] if eager_b2b and vr.get("b2b_ms") else None
    rec["wall_s"] = time.perf_counter() - t_start
    return rec


# --------------------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------------------
TABLE_HEADERS = ["model", "variant", "median ms", "vs eager", "back-to-back ms", "vs eager (b2b)", "bit-exact",
                 "rel L2 vs eager", "peak GiB", "first call s", "sites kept", "host ms"]


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table_rows(rec: dict) -> list[list[str]]:
    rows = []
    for v, vr in rec["variants"].items():
        if "error" in vr:
            rows.append([rec["label"], v, "failed", "", "", "", "", "", "", "", vr["error"][:60], ""])
            continue
        kept = f"{vr['kept']}/{vr['sites']}" if "sites" in vr else ""
        rows.append([rec["label"], v, _f(vr.get("ms"), ".2f"), _f(vr.get("speedup_vs_eager"), ".3f"),
                     _f(vr.get("b2b_ms"), ".2f"), _f(vr.get("b2b_speedup_vs_eager"), ".3f"),
                     "yes" if vr.get("bit_exact") else "no", _f(vr.get("rel_l2_vs_eager"), ".2e"),
                     _f(vr.get("peak_GiB"), ".2f"), _f(vr.get("first_call_s"), ".1f"), kept,
                     _f(vr.get("host_ms"), ".1f")])
    return rows


def print_model(rec: dict) -> None:
    from tabulate import tabulate

    print(tabulate(table_rows(rec), headers=TABLE_HEADERS))
    for n in rec["notes"]:
        print(f"  note: {n}")
    for v, vr in rec["variants"].items():
        for n in vr.get("graph_notes", []):
            print(f"  {v}: {n}")
    est = f" (estimated {rec['estimate_s']:.0f} s)" if rec.get("estimate_s") else ""
    print(f"  wall {rec['wall_s']:.0f} s{est}", flush=True)


BEGIN = "<!-- bench_models:begin (generated by `python benchmarks/bench_models.py --table`; edits are overwritten) -->"
END = "<!-- bench_models:end -->"


def markdown(runs: list[dict]) -> str:
    """The table of one or more runs (e.g. one per GPU of a two-GPU machine): a line per run, one table."""
    lines = []
    for data in runs:
        meta = data["meta"]
        clock = "perf_counter" if meta.get("tiny") else "CUDA events"
        models = ", ".join(rec["label"] for rec in data["models"])
        lines.append(f"`{meta['command']}` ({models}): {meta['device']}, torch {meta['torch']}, "
                     f"triton {meta['triton']}, diffusers {meta['diffusers']}; {meta['reps']} timed forwards per "
                     f"variant (ABBA-interleaved, {clock}, medians); random bf16 weights; "
                     + ("compiled variants compile the whole transformer (`torch.compile(model)`, `dynamic=False`)."
                        if meta.get("whole") else "compiled variants compile the repeated blocks only (diffusers "
                        "`compile_repeated_blocks`, `dynamic=False`).")
                     + (f" Back-to-back: {meta['back_to_back']} forwards issued without a sync between them (as a "
                        "denoising loop issues its steps), time per forward, median of 3 ABBA rounds."
                        if meta.get("back_to_back") else "")
                     + (" **Tiny CPU models (`--tiny`): checks the code path, not a benchmark.**"
                        if meta.get("tiny") else ""))
        lines.append("")
    lines += ["| " + " | ".join(TABLE_HEADERS) + " |", "|" + "---|" * len(TABLE_HEADERS)]
    # a model measured in more than one run: its rows and notes name the run by its start time
    seen = collections.Counter(rec["label"] for run in runs for rec in run["models"])
    data = {"models": [dict(rec, label=f"{rec['label']} [run {i + 1}]")
                       if seen[rec["label"]] > 1 else rec for i, run in enumerate(runs) for rec in run["models"]]}
    notes = []
    for rec in data["models"]:
        for row in table_rows(rec):
            lines.append("| " + " | ".join(str(c) for c in row) + " |")
        notes.append(f"{rec['label']}: {rec['shape']}; {rec['params_B']:.2f} B parameters; config from "
                     f"{rec['config_source']}; {rec['wall_s']:.0f} s for the whole model's run")
        notes += [f"{rec['label']}: {n}" for n in rec["notes"] if not n.startswith("compiled variants")]
        variants_of: dict[str, list[str]] = {}  # a note the variants share is listed once, naming them all
        for v, vr in rec["variants"].items():
            graph_notes = [n for n in vr.get("graph_notes", []) if not n.startswith("CUDA graphs")]
            cats = [n for n in graph_notes if n.startswith("cat_of_slices: cat_") and " rebuilt " in n]
            if cats:  # runs before the pass summarized its rewrites wrote one note per cat
                graph_notes = [n for n in graph_notes if n not in cats] + [
                    f"cat_of_slices: {len(cats)} cats that rebuild the tensor their inputs were sliced from use it "
                    "instead (no copy)"]
            for n in graph_notes:
                variants_of.setdefault(n, []).append(v)
        notes += [f"{rec['label']}, {' and '.join(vs)}: {n}" for n, vs in variants_of.items()]
    lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines).rstrip() + "\n"


def write_table(json_paths: str, md_path: str) -> None:
    runs = []
    for path in json_paths.split(","):
        with open(path) as f:
            data = json.load(f)
        # one run as this script writes it, or several gathered as {"about": ..., "runs": [...]}
        runs += data["runs"] if "runs" in data else [data]
    text = open(md_path).read()
    if BEGIN not in text or END not in text:
        sys.exit(f"{md_path}: markers not found ({BEGIN!r} ... {END!r})")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(md_path, "w") as f:
        f.write(head + BEGIN + "\n" + markdown(runs) + END + tail)
    print(f"{md_path}: table replaced from {json_paths} ({sum(len(r['models']) for r in runs)} models)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma-separated, from {list(MODELS)}")
    ap.add_argument("--variants", default=None, help=f"comma-separated, from {list(VARIANTS)}")
    ap.add_argument("--max-autotune", action="store_true", help="add inductor-max-autotune (slow compile)")
    ap.add_argument("--reps", type=int, default=6, help="timed forwards per variant (ABBA rounds)")
    ap.add_argument("--cprofile", default=None, help="a variant whose host time to profile (cProfile, 3 forwards)")
    ap.add_argument("--back-to-back", type=int, default=0, metavar="N",
                    help="also time N forwards issued without a sync between them (as a denoising loop issues its "
                         "steps), per forward; 3 ABBA rounds, median")
    ap.add_argument("--profile", default="", help="comma-separated variants to profile after timing (one forward "
                    "each): kernel table and GPU idle gaps to $OUT/profile_<model>_<variant>.txt")
    ap.add_argument("--whole", action="store_true", help="compile the whole transformer (one graph per variant) "
                    "instead of the repeated blocks")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "bench_models.json"),
                    help="where to write; with --table, one or more comma-separated runs to read")
    ap.add_argument("--table", action="store_true", help="regenerate the BENCHMARKS.md table from --json and exit")
    ap.add_argument("--md", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                 "BENCHMARKS.md"))
    ap.add_argument("--estimate", action="store_true", help="print the per-model time estimates and exit")
    ap.add_argument("--tiny", action="store_true", help="tiny models on the CPU (eager and lossless unless "
                                                        "--variants says otherwise): checks the code path")
    args = ap.parse_args(argv)
    global CPROFILE, PROFILE, BACK_TO_BACK, WHOLE
    CPROFILE = args.cprofile
    WHOLE = args.whole
    BACK_TO_BACK = args.back_to_back
    PROFILE = [v for v in args.profile.split(",") if v]
    if args.table:
        write_table(args.json, args.md)
        return
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    variants = (args.variants.split(",") if args.variants else
                ["eager", "lossless"] if args.tiny else list(DEFAULT_VARIANTS))
    if args.max_autotune and "inductor-max-autotune" not in variants:
        at = variants.index("lossless") if "lossless" in variants else len(variants)
        variants.insert(at, "inductor-max-autotune")
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    bad = [v for v in variants if v not in VARIANTS]
    if unknown or bad or "eager" not in variants:
        ap.error(f"unknown models {unknown} / variants {bad} (models: {list(MODELS)}, variants: {list(VARIANTS)}, "
                 "eager is required: every other variant is compared with it)")
    variants = ["eager"] + [v for v in variants if v != "eager"]
    print(f"bench_models: {names}, variants {variants}, {args.reps} timed forwards each"
          + (" (tiny CPU models: checks the code path, measures nothing)" if args.tiny else ""))
    if not args.tiny:
        total = 0.0
        for n in names:
            est, c, fw = estimate_s(MODELS[n], variants, args.reps)
            total += est
            print(f"  {n:11s} {MODELS[n].label:15s} estimate ~{est:4.0f} s (compile ~{c:.0f} s, forwards ~{fw:.0f} s)")
        print(f"  total estimate ~{total:.0f} s on an H200 (rough: measured eager times, typical "
              "compile times)", flush=True)
    if args.estimate:
        return
    if not args.tiny and not torch.cuda.is_available():
        sys.exit("bench_models: needs CUDA (or --tiny for the CPU code path)")
    # Every variant compiles the same frame (nn.Module._call_impl) once per block class; Dynamo counts other
    # backends' entries against one limit (8): raise it so no variant silently falls back to eager.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    import diffusers
    import triton

    data = {"meta": {"device": torch.cuda.get_device_name() if not args.tiny else "cpu", "torch": torch.__version__,
                     "triton": triton.__version__, "diffusers": diffusers.__version__, "reps": args.reps,
                     "back_to_back": args.back_to_back, "whole": args.whole,
                     "variants": variants, "tiny": args.tiny,
                     "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                     "command": " ".join(["python", "benchmarks/bench_models.py", *(argv or sys.argv[1:])])},
            "models": []}
    for n in names:
        spec = MODELS[n]
        where = f"tiny {spec.tiny} on the CPU" if args.tiny else f"{spec.shape} ({spec.source})"
        print(f"\n== {spec.label}: {where}", flush=True)
        torch._dynamo.reset()  # drops the previous model's compiled blocks (and with them its weights)
        gc.collect()
        if not args.tiny:
            torch.cuda.empty_cache()
        rec = run_model(spec, variants, args.reps, args.tiny)
        rec["estimate_s"] = None if args.tiny else estimate_s(spec, variants, args.reps)[0]
        data["models"].append(rec)
        print_model(rec)
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2, default=str)
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
