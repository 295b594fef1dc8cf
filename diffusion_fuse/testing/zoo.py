"""The diffusers zoo: every DiT-style transformer of ``diffusers.models.transformers`` (0.42.1) at a tiny size.

    from diffusion_fuse.testing.zoo import ZOO
    model, kwargs = ZOO["pixart"].build(torch.bfloat16)
    out = model(**kwargs)

DiT-style here means a transformer whose norms the timestep modulates: AdaLayerNorm(-Zero/-Single/-Continuous),
a scale-shift table added to the timestep embedding, or a LayerNorm / RMSNorm followed by ``* (1 + scale) + shift``
of the timestep (FiLM included). ``ZOO`` holds one entry per such class (two for Wan: Wan2.1's one timestep, Wan2.2
TI2V's per-token timesteps); the seven ``tiny_models`` builds are those of ``tiny_models.build``. Configs and inputs
follow diffusers' own model tests (tests/models/transformers/test_models_transformer_*.py), cut to one block of each
kind and batch 1, so that each builds in milliseconds and compiles in one to a few seconds on the CPU. Where a test
has no config or is longer, these choices:

- cosmos: ``concat_padding_mask=False`` (resizing the padding mask needs torchvision);
- hidream: its MoE routes to 1 of 2 experts (the data-dependent expert loop breaks the graph; still compiled);
- sana_wm: one softmax block (the gated-delta-net block doubles the compile time); its camera conditions are fp32;
- wan_animate: a 6-frame clip, an 8x8 face and a two-level motion encoder;
- kandinsky5/6, kandinsky6_sr, flux3, hunyuanimage, rfd4_proteina, t5film: configs written from the classes'
  signatures (no diffusers test at this version), the smallest the classes accept.

``ZooModel.fullgraph`` is False where Dynamo breaks the graph on the model's own data-dependent code: hidream (MoE
routing), hunyuan_video15, lumina2, omnigen, qwen_image21 (``tolist`` of a float tensor) and wan_animate2 (its
rotary cache keyed by tensor values).

Left out (no timestep-modulated norm):

- Cosmos3OmniTransformer: a language-model trunk; the timestep embedding is scatter-added to the noisy tokens and
  its RMSNorms are plain;
- DreamLiteTransformer2DModel, DualTransformer2DModel, Transformer2DModel, TransformerTemporalModel: spatial and
  temporal transformers of UNets, with plain LayerNorms (Transformer2DModel's ada_norm configurations are the blocks
  of DiTTransformer2DModel and PixArtTransformer2DModel, which are in the zoo);
- MiniMaxMusic3Transformer1DModel, PriorTransformer, StableAudioDiTModel: the timestep embedding is a token of
  the sequence (prepended or added to prepended global tokens), the norms are plain;
- MiniMaxMusic3RVQDepthDecoder: a token decoder without a timestep.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from . import tiny_models

__all__ = ["ZOO", "ZooModel"]

Inputs = Callable[[torch.Generator], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """One zoo entry: a diffusers transformer class, a tiny config of it and the inputs of one forward call.

    ``build(dtype, device, seed)`` returns ``(model, kwargs)``: the model in eval mode with random weights drawn
    after ``torch.manual_seed(seed)`` (parameters diffusers initializes to zero get a normal distribution of std
    ``1/sqrt(fan_in)``, or the output is all zeros; ``tiny`` entries are built by ``tiny_models.build``), cast as
    ``from_pretrained(torch_dtype=dtype)`` casts (``_keep_in_fp32_modules`` stay float32), and the kwargs of
    ``model(**kwargs)`` (``return_dict=False`` where the forward takes it). Most models then return a tuple whose
    element 0 is the prediction; Kandinsky 5 and T5FilmDecoder return the tensor, Z-Image and WanAnimate2 a list per
    sample. Floating inputs are cast to ``dtype`` except those named in ``fp32_inputs``.
    """

    name: str
    class_path: str  # "module.Class"
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    inputs: Inputs | None = None
    fp32_inputs: tuple[str, ...] = ()
    tiny: str = ""  # the name of the same model in tiny_models, built there
    fullgraph: bool = True  # whether Dynamo takes the forward as one graph

    @property
    def cls(self) -> type:
        module, _, cls = self.class_path.rpartition(".")
        return getattr(importlib.import_module(module), cls)

    def build(self, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
              seed: int = 0) -> tuple[torch.nn.Module, dict[str, Any]]:
        if self.tiny:
            return tiny_models.build(self.tiny, dtype, device, seed)
        assert self.inputs is not None
        torch.manual_seed(seed)
        model = self.cls(**self.config)
        _distribute_zeros(model, torch.Generator().manual_seed(seed))
        model.eval()
        tiny_models.cast_like_from_pretrained(model, dtype)
        model.to(device=device)
        kwargs = self.inputs(torch.Generator().manual_seed(seed + 1))
        kwargs = {k: _to(v, device, torch.float32 if k in self.fp32_inputs else dtype) for k, v in kwargs.items()}
        if "return_dict" in inspect.signature(self.cls.forward).parameters:
            kwargs["return_dict"] = False
        return model, kwargs


def _distribute_zeros(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Parameters that are all zero (zero-initialized projections, gates, tokens) get N(0, 1/fan_in)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and p.numel() and not p.any():
                fan_in = p.shape[1:].numel() if p.ndim >= 2 else p.numel()
                p.copy_(torch.randn(p.shape, generator=gen) * fan_in**-0.5)


def _to(v: Any, device: str | torch.device, dtype: torch.dtype) -> Any:
    if isinstance(v, torch.Tensor):
        return v.to(device, dtype) if v.is_floating_point() else v.to(device)
    if isinstance(v, (list, tuple)):
        return type(v)(_to(x, device, dtype) for x in v)
    if isinstance(v, dict):
        return {k: _to(x, device, dtype) for k, x in v.items()}
    return v


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def _steps(gen: torch.Generator, n: int = 1) -> torch.Tensor:
    """Integer timesteps in [0, 1000), as the schedulers of the DDPM-style pipelines give them."""
    return torch.randint(0, 1000, (n,), generator=gen)


_T = "diffusers.models.transformers."
_ENTRIES: list[ZooModel] = []


def _add(name: str, class_path: str, config: Mapping[str, Any] | None = None, inputs: Inputs | None = None,
         **kw: Any) -> None:
    _ENTRIES.append(ZooModel(name, _T + class_path, dict(config or {}), inputs, **kw))


# --- the models tiny_models builds ------------------------------------------------------------------------------
for _name, _path in [("flux", "transformer_flux.FluxTransformer2DModel"),
                     ("flux2", "transformer_flux2.Flux2Transformer2DModel"),
                     ("wan21", "transformer_wan.WanTransformer3DModel"),
                     ("wan22_ti2v", "transformer_wan.WanTransformer3DModel"),
                     ("sana", "sana_transformer.SanaTransformer2DModel"),
                     ("qwen_image", "transformer_qwenimage.QwenImageTransformer2DModel"),
                     ("sd35", "transformer_sd3.SD3Transformer2DModel")]:
    _add(_name, _path, tiny=_name)


# --- the rest -------------------------------------------------------------------------------------------------
_add("ace_step", "ace_step_transformer.AceStepTransformer1DModel",
     dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          head_dim=8, in_channels=24, audio_acoustic_hidden_dim=8, patch_size=2, sliding_window=16),
     lambda g: dict(hidden_states=_randn(g, 1, 8, 8), timestep=torch.tensor([0.7]), timestep_r=torch.tensor([0.3]),
                    encoder_hidden_states=_randn(g, 1, 10, 32), context_latents=_randn(g, 1, 8, 16)))

_add("auraflow", "auraflow_transformer_2d.AuraFlowTransformer2DModel",
     dict(sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=1, num_single_dit_layers=1,
          attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
          out_channels=4, pos_embed_max_size=16),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 8, 8), encoder_hidden_states=_randn(g, 1, 8, 32),
                    timestep=torch.tensor([0.5])))

_add("cogvideox", "cogvideox_transformer_3d.CogVideoXTransformer3DModel",
     dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=2,
          text_embed_dim=8, num_layers=1, sample_width=8, sample_height=8, sample_frames=8, patch_size=2,
          temporal_compression_ratio=4, max_text_seq_length=8),
     lambda g: dict(hidden_states=_randn(g, 1, 1, 4, 8, 8), encoder_hidden_states=_randn(g, 1, 8, 8),
                    timestep=_steps(g)))

_add("consisid", "consisid_transformer_3d.ConsisIDTransformer3DModel",
     dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=2,
          text_embed_dim=8, num_layers=1, sample_width=8, sample_height=8, sample_frames=8, patch_size=2,
          temporal_compression_ratio=4, max_text_seq_length=8, cross_attn_interval=1, is_kps=False,
          is_train_face=True, cross_attn_dim_head=1, cross_attn_num_heads=1, LFE_id_dim=2, LFE_vit_dim=2,
          LFE_depth=5, LFE_dim_head=8, LFE_num_heads=2, LFE_num_id_token=1, LFE_num_querie=1, LFE_output_dim=10,
          LFE_ff_mult=1, LFE_num_scale=1),
     lambda g: dict(hidden_states=_randn(g, 1, 1, 4, 8, 8), encoder_hidden_states=_randn(g, 1, 8, 8),
                    timestep=_steps(g), id_vit_hidden=[_randn(g, 1, 2, 2)], id_cond=_randn(g, 1, 2)))

_add("dit", "dit_transformer_2d.DiTTransformer2DModel",
     dict(in_channels=4, out_channels=8, activation_fn="gelu-approximate", num_attention_heads=2,
          attention_head_dim=4, attention_bias=True, num_layers=1, norm_type="ada_norm_zero", num_embeds_ada_norm=8,
          patch_size=2, sample_size=8),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 8, 8), timestep=_steps(g), class_labels=torch.tensor([3])))

_add("pixart", "pixart_transformer_2d.PixArtTransformer2DModel",
     dict(sample_size=8, num_layers=1, patch_size=2, attention_head_dim=2, num_attention_heads=2, in_channels=4,
          cross_attention_dim=8, out_channels=8, attention_bias=True, activation_fn="gelu-approximate",
          num_embeds_ada_norm=8, norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6,
          use_additional_conditions=False, caption_channels=None),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 8, 8), timestep=_steps(g), encoder_hidden_states=_randn(g, 1, 8, 8),
                    added_cond_kwargs={"aspect_ratio": None, "resolution": None}))

_add("allegro", "transformer_allegro.AllegroTransformer3DModel",
     dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, num_layers=1,
          cross_attention_dim=16, sample_width=8, sample_height=8, sample_frames=8, caption_channels=8),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 2, 8, 8), encoder_hidden_states=_randn(g, 1, 16, 8),
                    timestep=_steps(g)))

_add("anyflow", "transformer_anyflow.AnyFlowTransformer3DModel",
     dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
          text_dim=16, freq_dim=256, ffn_dim=32, num_layers=1, cross_attn_norm=True, rope_max_seq_len=32,
          gate_value=0.25, deltatime_type="r"),
     lambda g: dict(hidden_states=_randn(g, 1, 2, 4, 8, 8), timestep=torch.full((1, 2), 500.0),
                    r_timestep=torch.full((1, 2), 250.0), encoder_hidden_states=_randn(g, 1, 12, 16)))

_add("bria", "transformer_bria.BriaTransformer2DModel",
     dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8,
          num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=None, axes_dims_rope=[0, 4, 4]),
     lambda g: dict(hidden_states=_randn(g, 1, 16, 4), encoder_hidden_states=_randn(g, 1, 8, 32),
                    img_ids=_randn(g, 16, 3), txt_ids=_randn(g, 8, 3), timestep=torch.tensor([1.0])))

_add("bria_fibo", "transformer_bria_fibo.BriaFiboTransformer2DModel",
     dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8,
          num_attention_heads=2, joint_attention_dim=64, text_encoder_dim=32, pooled_projection_dim=None,
          axes_dims_rope=[0, 4, 4]),
     lambda g: (lambda text: dict(
         hidden_states=_randn(g, 1, 16, 16), encoder_hidden_states=text, img_ids=_randn(g, 16, 3),
         txt_ids=_randn(g, 8, 3), timestep=torch.tensor([1.0]),
         text_encoder_layers=[text[:, :, :32], text[:, :, 32:]]))(_randn(g, 1, 8, 64)))

_add("chroma", "transformer_chroma.ChromaTransformer2DModel",
     dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
          num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=[4, 4, 8], approximator_num_channels=8,
          approximator_hidden_dim=16, approximator_layers=1),
     lambda g: dict(hidden_states=_randn(g, 1, 16, 4), encoder_hidden_states=_randn(g, 1, 8, 32),
                    img_ids=_randn(g, 16, 3), txt_ids=_randn(g, 8, 3), timestep=torch.tensor([1.0])))

_add("chronoedit", "transformer_chronoedit.ChronoEditTransformer3DModel",
     dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=16, out_channels=16,
          text_dim=32, freq_dim=16, ffn_dim=32, num_layers=1, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
          rope_max_seq_len=64, rope_temporal_skip_len=8),
     lambda g: dict(hidden_states=_randn(g, 1, 16, 2, 8, 8), timestep=_steps(g),
                    encoder_hidden_states=_randn(g, 1, 12, 32)))

_add("cogview3plus", "transformer_cogview3plus.CogView3PlusTransformer2DModel",
     dict(patch_size=2, in_channels=4, num_layers=1, attention_head_dim=4, num_attention_heads=2, out_channels=4,
          text_embed_dim=8, time_embed_dim=8, condition_dim=2, pos_embed_max_size=8, sample_size=8),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 8, 8), encoder_hidden_states=_randn(g, 1, 8, 8),
                    original_size=torch.tensor([[64, 64]]), target_size=torch.tensor([[64, 64]]),
                    crop_coords=torch.tensor([[0, 0]]), timestep=_steps(g)))

_add("cogview4", "transformer_cogview4.CogView4Transformer2DModel",
     dict(patch_size=2, in_channels=4, num_layers=1, attention_head_dim=4, num_attention_heads=4, out_channels=4,
          text_embed_dim=8, time_embed_dim=8, condition_dim=4),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 8, 8), encoder_hidden_states=_randn(g, 1, 8, 8),
                    timestep=_steps(g), original_size=torch.tensor([[64, 64]]), target_size=torch.tensor([[64, 64]]),
                    crop_coords=torch.tensor([[0, 0]])))

_add("cosmos", "transformer_cosmos.CosmosTransformer3DModel",
     dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=12, num_layers=1, mlp_ratio=2,
          text_embed_dim=16, adaln_lora_dim=4, max_size=(4, 32, 32), patch_size=(1, 2, 2), rope_scale=(2.0, 1.0, 1.0),
          concat_padding_mask=False, extra_pos_embed_type="learnable"),  # (the padding mask needs torchvision)
     lambda g: dict(hidden_states=_randn(g, 1, 4, 1, 8, 8), timestep=_steps(g),
                    encoder_hidden_states=_randn(g, 1, 12, 16), attention_mask=torch.ones(1, 12), fps=30))

_add("easyanimate", "transformer_easyanimate.EasyAnimateTransformer3DModel",
     dict(attention_head_dim=16, num_attention_heads=2, in_channels=4, mmdit_layers=1, num_layers=1, out_channels=4,
          patch_size=2, sample_height=60, sample_width=90, text_embed_dim=16, time_embed_dim=8,
          time_position_encoding_type="3d_rope", timestep_activation_fn="silu"),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 2, 8, 8), timestep=_steps(g),
                    encoder_hidden_states=_randn(g, 1, 16, 16)))

_add("ernie_image", "transformer_ernie_image.ErnieImageTransformer2DModel",
     dict(hidden_size=16, num_attention_heads=1, num_layers=1, ffn_hidden_size=16, in_channels=16, out_channels=16,
          patch_size=1, text_in_dim=16, rope_theta=256, rope_axes_dim=(8, 4, 4), eps=1e-6, qk_layernorm=True),
     lambda g: dict(hidden_states=_randn(g, 1, 16, 4, 4), timestep=torch.tensor([1.0]), text_bth=_randn(g, 1, 8, 16),
                    text_lens=torch.tensor([8])))

_add("glm_image", "transformer_glm_image.GlmImageTransformer2DModel",
     dict(patch_size=2, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
          text_embed_dim=32, time_embed_dim=16, condition_dim=8, prior_vq_quantizer_codebook_size=64),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 8, 8), encoder_hidden_states=_randn(g, 1, 12, 32),
                    prior_token_id=torch.randint(0, 64, (1, 16), generator=g),
                    prior_token_drop=torch.zeros(1, dtype=torch.bool), timestep=_steps(g),
                    target_size=torch.tensor([[8.0, 8.0]]), crop_coords=torch.tensor([[0.0, 0.0]])))

_add("helios", "transformer_helios.HeliosTransformer3DModel",
     dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
          text_dim=16, freq_dim=256, ffn_dim=32, num_layers=1, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
          rope_dim=(4, 4, 4), has_multi_term_memory_patch=True, guidance_cross_attn=True, zero_history_timestep=True,
          is_amplify_history=False),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 2, 8, 8), timestep=_steps(g),
                    encoder_hidden_states=_randn(g, 1, 12, 16),
                    indices_hidden_states=torch.ones(1, 2), indices_latents_history_short=torch.ones(1, 1),
                    indices_latents_history_mid=torch.ones(1, 1), indices_latents_history_long=torch.ones(1, 4),
                    latents_history_short=_randn(g, 1, 4, 1, 8, 8), latents_history_mid=_randn(g, 1, 4, 1, 8, 8),
                    latents_history_long=_randn(g, 1, 4, 4, 8, 8)))

_add("hidream", "transformer_hidream_image.HiDreamImageTransformer2DModel",
     dict(patch_size=2, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8,
          num_attention_heads=4, caption_channels=[8, 4], text_emb_dim=8, num_routed_experts=2, num_activated_experts=1,
          axes_dims_rope=(4, 2, 2), max_resolution=(32, 32), llama_layers=(0, 1), force_inference_output=True),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 8, 8), encoder_hidden_states_t5=_randn(g, 1, 8, 8),
                    encoder_hidden_states_llama3=_randn(g, 2, 1, 8, 4), pooled_embeds=_randn(g, 1, 8),
                    timesteps=_steps(g)),
     fullgraph=False)

_add("hunyuan_dit", "hunyuan_transformer_2d.HunyuanDiT2DModel",
     dict(sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
          cross_attention_dim=8, cross_attention_dim_t5=8, pooled_projection_dim=4, hidden_size=16, text_len=4,
          text_len_t5=4, activation_fn="gelu-approximate"),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 8, 8), encoder_hidden_states=_randn(g, 1, 4, 8),
                    text_embedding_mask=torch.ones(1, 4), encoder_hidden_states_t5=_randn(g, 1, 4, 8),
                    text_embedding_mask_t5=torch.ones(1, 4), timestep=_steps(g).float(),
                    image_meta_size=torch.tensor([[1024.0, 1024, 16, 16, 0, 0]]),
                    style=torch.zeros(1, dtype=torch.int64), image_rotary_emb=[torch.ones(1, 8), torch.zeros(1, 8)]),
     fp32_inputs=("image_rotary_emb",))

_add("hunyuanimage", "transformer_hunyuanimage.HunyuanImageTransformer2DModel",
     dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1, num_single_layers=1,
          num_refiner_layers=1, patch_size=(1, 1), text_embed_dim=16, rope_axes_dim=(4, 4)),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 4, 4), timestep=_steps(g).float(),
                    encoder_hidden_states=_randn(g, 1, 6, 16),
                    encoder_attention_mask=torch.ones(1, 6, dtype=torch.int64)))

_add("hunyuan_video", "transformer_hunyuan_video.HunyuanVideoTransformer3DModel",
     dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
          num_single_layers=1,
          num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True, text_embed_dim=16,
          pooled_projection_dim=8, rope_axes_dim=(2, 4, 4), image_condition_type=None),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 1, 4, 4), timestep=_steps(g).float(),
                    encoder_hidden_states=_randn(g, 1, 6, 16), pooled_projections=_randn(g, 1, 8),
                    encoder_attention_mask=torch.ones(1, 6), guidance=torch.tensor([3500.0])))

_add("hunyuan_video15", "transformer_hunyuan_video15.HunyuanVideo15Transformer3DModel",
     dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
          num_refiner_layers=1,
          mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=16, text_embed_2_dim=8, image_embed_dim=12,
          rope_axes_dim=(2, 2, 4), target_size=16, task_type="t2v"),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 1, 4, 4), timestep=torch.tensor([1.0]),
                    encoder_hidden_states=_randn(g, 1, 6, 16), encoder_hidden_states_2=_randn(g, 1, 4, 8),
                    encoder_attention_mask=torch.ones(1, 6), encoder_attention_mask_2=torch.ones(1, 4),
                    image_embeds=torch.zeros(1, 3, 12)),
     fullgraph=False)

_add("hunyuan_framepack", "transformer_hunyuan_video_framepack.HunyuanVideoFramepackTransformer3DModel",
     dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
          num_single_layers=1,
          num_refiner_layers=1, patch_size=2, patch_size_t=1, guidance_embeds=True, text_embed_dim=16,
          pooled_projection_dim=8, rope_axes_dim=(2, 4, 4), image_condition_type=None, has_image_proj=True,
          image_proj_dim=16, has_clean_x_embedder=True),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 3, 4, 4), timestep=_steps(g), encoder_hidden_states=_randn(g, 1, 6,
                    16),
                    pooled_projections=_randn(g, 1, 8), encoder_attention_mask=torch.ones(1, 6),
                    guidance=_steps(g), image_embeds=_randn(g, 1, 6, 16), indices_latents=torch.ones(3),
                    latents_clean=_randn(g, 1, 4, 2, 4, 4), indices_latents_clean=torch.ones(2),
                    latents_history_2x=_randn(g, 1, 4, 2, 4, 4), indices_latents_history_2x=torch.ones(2),
                    latents_history_4x=_randn(g, 1, 4, 8, 4, 4), indices_latents_history_4x=torch.ones(8)))


def _ideogram4_inputs(g: torch.Generator) -> dict[str, Any]:
    from diffusers.models.transformers.transformer_ideogram4 import (
        IMAGE_POSITION_OFFSET,
        LLM_TOKEN_INDICATOR,
        OUTPUT_IMAGE_INDICATOR,
    )

    text, image = 4, 4  # tokens: the text first, then a 2x2 image
    hidden = torch.zeros(1, text + image, 16)
    hidden[:, text:] = _randn(g, 1, image, 16)
    context = torch.zeros(1, text + image, 24)
    context[:, :text] = _randn(g, 1, text, 24)
    pos = torch.zeros(1, text + image, 3, dtype=torch.int64)
    pos[:, :text] = torch.arange(text)[:, None]
    pos[:, text:, 0] = IMAGE_POSITION_OFFSET
    pos[:, text:, 1] = torch.tensor([0, 0, 1, 1]) + IMAGE_POSITION_OFFSET
    pos[:, text:, 2] = torch.tensor([0, 1, 0, 1]) + IMAGE_POSITION_OFFSET
    indicator = torch.full((1, text + image), OUTPUT_IMAGE_INDICATOR, dtype=torch.int64)
    indicator[:, :text] = LLM_TOKEN_INDICATOR
    return dict(hidden_states=hidden, encoder_hidden_states=context, timestep=torch.tensor([0.5]), position_ids=pos,
                segment_ids=torch.ones(1, text + image, dtype=torch.int64), indicator=indicator)


_add("ideogram4", "transformer_ideogram4.Ideogram4Transformer2DModel",
     dict(in_channels=16, num_layers=1, attention_head_dim=8, num_attention_heads=4, intermediate_size=32, adaln_dim=16,
          llm_features_dim=24, rope_theta=10_000, mrope_section=(2, 1, 1), norm_eps=1e-5),
     _ideogram4_inputs)

_add("joyimage", "transformer_joyimage.JoyImageEditTransformer3DModel",
     dict(patch_size=[1, 2, 2], in_channels=16, hidden_size=32, num_attention_heads=2, text_dim=16, num_layers=1,
          rope_dim_list=[4, 6, 6], theta=256),
     lambda g: dict(hidden_states=_randn(g, 1, 16, 1, 4, 4), encoder_hidden_states=_randn(g, 1, 12, 16),
                    timestep=torch.tensor([1.0])))

_add("joyimage_edit_plus", "transformer_joyimage_edit_plus.JoyImageEditPlusTransformer3DModel",
     dict(patch_size=[1, 2, 2], in_channels=16, hidden_size=32, num_attention_heads=2, text_dim=16, num_layers=1,
          rope_dim_list=[4, 6, 6], theta=256),
     lambda g: dict(hidden_states=_randn(g, 1, 2, 16, 1, 2, 2), encoder_hidden_states=_randn(g, 1, 12, 16),
                    timestep=torch.tensor([1.0]), shape_list=[[(1, 1, 1), (1, 1, 1)]]))


def _krea2_inputs(g: torch.Generator) -> dict[str, Any]:
    text, side = 4, 2  # 4 text tokens, a 2x2 image grid
    pos = torch.zeros(text + side * side, 3)
    pos[text:, 1] = torch.arange(side).repeat_interleave(side)
    pos[text:, 2] = torch.arange(side).repeat(side)
    mask = torch.ones(1, text, dtype=torch.bool)
    mask[:, -1] = False  # one padded text token: the key-padding mask path
    return dict(hidden_states=_randn(g, 1, side * side, 16), encoder_hidden_states=_randn(g, 1, text, 3, 16),
                timestep=torch.tensor([0.5]), position_ids=pos, encoder_attention_mask=mask)


_add("krea2", "transformer_krea2.Krea2Transformer2DModel",
     dict(in_channels=16, num_layers=1, attention_head_dim=8, num_attention_heads=4, num_key_value_heads=2,
          intermediate_size=32, timestep_embed_dim=8, text_hidden_dim=16, num_text_layers=3, text_num_attention_heads=2,
          text_num_key_value_heads=1, text_intermediate_size=16, num_layerwise_text_blocks=1, num_refiner_text_blocks=1,
          axes_dims_rope=(4, 2, 2)),
     _krea2_inputs, fp32_inputs=("position_ids",))

_add("latte", "latte_transformer_3d.LatteTransformer3DModel",
     dict(sample_size=8, num_layers=1, patch_size=2, attention_head_dim=4, num_attention_heads=2, caption_channels=8,
          in_channels=4, cross_attention_dim=8, out_channels=8, attention_bias=True, activation_fn="gelu-approximate",
          num_embeds_ada_norm=1000, norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6,
          video_length=2),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 2, 8, 8), encoder_hidden_states=_randn(g, 1, 8, 8),
                    timestep=_steps(g),
                    enable_temporal_attentions=True))

_add("longcat_audio_dit", "transformer_longcat_audio_dit.LongCatAudioDiTTransformer",
     dict(dit_dim=64, dit_depth=1, dit_heads=4, dit_text_dim=32, latent_dim=8, text_conv=False),
     lambda g: dict(hidden_states=_randn(g, 1, 16, 8), encoder_hidden_states=_randn(g, 1, 10, 32),
                    encoder_attention_mask=torch.ones(1, 10, dtype=torch.bool),
                    attention_mask=torch.ones(1, 16, dtype=torch.bool), timestep=torch.tensor([0.5])))

_add("longcat_image", "transformer_longcat_image.LongCatImageTransformer2DModel",
     dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
          joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8]),
     lambda g: dict(hidden_states=_randn(g, 1, 16, 4), encoder_hidden_states=_randn(g, 1, 8, 32),
                    img_ids=_randn(g, 16, 3), txt_ids=_randn(g, 8, 3), timestep=torch.tensor([1.0]),
                    guidance=torch.tensor([3.5])))

_add("ltx", "transformer_ltx.LTXVideoTransformer3DModel",
     dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
          num_layers=1, qk_norm="rms_norm_across_heads", caption_channels=16),
     lambda g: dict(hidden_states=_randn(g, 1, 2 * 4 * 4, 4), encoder_hidden_states=_randn(g, 1, 8, 16),
                    timestep=_steps(g), encoder_attention_mask=torch.ones(1, 8, dtype=torch.bool), num_frames=2,
                    height=4, width=4))

_add("ltx2", "transformer_ltx2.LTX2VideoTransformer3DModel",
     dict(in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
          cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
          audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=1, qk_norm="rms_norm_across_heads",
          caption_channels=16, rope_double_precision=False),
     lambda g: dict(hidden_states=_randn(g, 1, 2 * 4 * 4, 4), audio_hidden_states=_randn(g, 1, 9, 4),
                    encoder_hidden_states=_randn(g, 1, 8, 16), audio_encoder_hidden_states=_randn(g, 1, 8, 16),
                    timestep=torch.tensor([500.0]), encoder_attention_mask=torch.ones(1, 8, dtype=torch.bool),
                    num_frames=2, height=4, width=4, audio_num_frames=9, fps=25.0))


def _lumina_next_inputs(g: torch.Generator) -> dict[str, Any]:
    from diffusers.models.embeddings import get_2d_rotary_pos_embed_lumina

    return dict(hidden_states=_randn(g, 1, 4, 8, 8), encoder_hidden_states=_randn(g, 1, 8, 32),
                timestep=torch.tensor([0.6]), encoder_mask=torch.ones(1, 8, dtype=torch.int64),
                image_rotary_emb=get_2d_rotary_pos_embed_lumina(8, 8, 8),  # complex: head_dim 8 over an 8x8 grid
                cross_attention_kwargs={})  # (its blocks unpack it)


_add("lumina_next", "lumina_nextdit2d.LuminaNextDiT2DModel",
     dict(sample_size=8, patch_size=2, in_channels=4, hidden_size=24, num_layers=1, num_attention_heads=3,
          num_kv_heads=1, multiple_of=16, norm_eps=1e-5, learn_sigma=False, qk_norm=True, cross_attention_dim=32,
          scaling_factor=1.0),
     _lumina_next_inputs)

_add("lumina2", "transformer_lumina2.Lumina2Transformer2DModel",
     dict(sample_size=8, patch_size=2, in_channels=4, hidden_size=24, num_layers=1, num_refiner_layers=1,
          num_attention_heads=3, num_kv_heads=1, multiple_of=2, norm_eps=1e-5, scaling_factor=1.0,
          axes_dim_rope=(4, 2, 2), axes_lens=(128, 128, 128), cap_feat_dim=32),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 8, 8), encoder_hidden_states=_randn(g, 1, 8, 32),
                    timestep=torch.tensor([0.6]), encoder_attention_mask=torch.ones(1, 8, dtype=torch.bool)),
     fullgraph=False)


def _minimax_h3_inputs(g: torch.Generator) -> dict[str, Any]:
    text, audio, video = 4, 6, 8  # one packed sequence: text rows, audio rows, video rows
    n = text + audio + video
    text_idx, audio_idx, video_idx = torch.arange(text), torch.arange(text, text + audio), torch.arange(text + audio, n)
    tags = torch.zeros(n, dtype=torch.int64)  # 0 video, 1 text, 2 audio
    tags[text_idx], tags[audio_idx] = 1, 2
    t_idx = torch.zeros(n, dtype=torch.int64)
    t_idx[audio_idx] = 1  # the audio rows read the second timestep
    pos = torch.zeros(n, 3)
    pos[:, 0] = torch.arange(n)
    pos[video_idx, 1] = torch.arange(video) % 4.0
    pos[video_idx, 2] = torch.arange(video) % 2.0
    return dict(hidden_states=_randn(g, 1, video, 16), audio_hidden_states=_randn(g, 1, audio, 6),
                encoder_hidden_states=_randn(g, 1, text, 8), timestep=torch.tensor([0.7, 0.3]), timestep_indices=t_idx,
                token_tags=tags, position_ids=pos, video_indices=video_idx, audio_indices=audio_idx,
                text_indices=text_idx)


_add("minimax_h3", "transformer_minimax_h3.MiniMaxH3Transformer3DModel",
     dict(num_attention_heads=2, attention_head_dim=16, hidden_size=24, num_layers=1, num_refiner_layers=1, ffn_dim=32,
          in_channels=4, audio_in_channels=6, patch_size=(1, 2, 2), text_dim=8, freq_dim=8, time_embed_hidden_dim=24,
          time_embed_dim=16, rope_freq_dim=2),
     _minimax_h3_inputs, fp32_inputs=("position_ids", "timestep"))

_add("mochi", "transformer_mochi.MochiTransformer3DModel",
     dict(patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=1, pooled_projection_dim=16,
          in_channels=4, out_channels=None, qk_norm="rms_norm", text_embed_dim=16, time_embed_dim=4,
          activation_fn="swiglu", max_sequence_length=16),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 2, 8, 8), encoder_hidden_states=_randn(g, 1, 8, 16),
                    timestep=_steps(g), encoder_attention_mask=torch.ones(1, 8, dtype=torch.bool)))


_add("motif_video", "transformer_motif_video.MotifVideoTransformer3DModel",
     dict(in_channels=33, out_channels=16, num_attention_heads=2, attention_head_dim=12, num_layers=1,
          num_single_layers=1, num_decoder_layers=0, mlp_ratio=4.0, patch_size=1, patch_size_t=1, qk_norm="rms_norm",
          norm_type="layer_norm", text_embed_dim=32, image_embed_dim=4, rope_theta=256.0, rope_axes_dim=(4, 4, 4),
          enable_text_cross_attention_dual=False, enable_text_cross_attention_single=False),
     lambda g: dict(hidden_states=_randn(g, 1, 33, 2, 4, 4), encoder_hidden_states=_randn(g, 1, 12, 32),
                    timestep=_steps(g)))

_add("nucleusmoe_image", "transformer_nucleusmoe_image.NucleusMoEImageTransformer2DModel",
     dict(patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=16, num_attention_heads=4,
          joint_attention_dim=16, axes_dims_rope=(8, 4, 4), moe_enabled=False, capacity_factors=[8.0, 8.0]),
     lambda g: dict(hidden_states=_randn(g, 1, 16, 16), encoder_hidden_states=_randn(g, 1, 8, 16),
                    encoder_hidden_states_mask=torch.ones(1, 8, dtype=torch.int64), timestep=torch.tensor([1.0]),
                    img_shapes=[(1, 4, 4)]))


def _omnigen_inputs(g: torch.Generator) -> dict[str, Any]:
    text, image = 16, 16  # the input image's 16 tokens (2x2 patches of 8x8) replace text tokens 0..15; one time token
    n = text + 1 + image
    return dict(hidden_states=_randn(g, 1, 4, 8, 8), timestep=torch.tensor([0.6]),
                input_ids=torch.randint(0, 10, (1, text), generator=g), input_img_latents=[_randn(g, 1, 4, 8, 8)],
                input_image_sizes={0: [[0, image]]}, attention_mask=torch.ones(1, n, n),
                position_ids=torch.arange(n)[None])


_add("omnigen", "transformer_omnigen.OmniGenTransformer2DModel",
     dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=4, intermediate_size=32, num_layers=1,
          pad_token_id=0, vocab_size=1000, in_channels=4, time_step_dim=4,
          rope_scaling={"long_factor": [1, 2], "short_factor": [1, 2]}),
     _omnigen_inputs, fullgraph=False)

_add("ovis_image", "transformer_ovis_image.OvisImageTransformer2DModel",
     dict(patch_size=1, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
          num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 4, 8)),
     lambda g: dict(hidden_states=_randn(g, 1, 16, 4), encoder_hidden_states=_randn(g, 1, 8, 32),
                    img_ids=_randn(g, 16, 3), txt_ids=_randn(g, 8, 3), timestep=torch.tensor([1.0])))

_add("prx", "transformer_prx.PRXTransformer2DModel",
     dict(in_channels=16, patch_size=2, context_in_dim=16, hidden_size=32, mlp_ratio=3.5, num_heads=2, depth=1,
          axes_dim=[8, 8], theta=10_000),
     lambda g: dict(hidden_states=_randn(g, 1, 16, 8, 8), encoder_hidden_states=_randn(g, 1, 8, 16),
                    timestep=torch.tensor([1.0])))

_add("sana_video", "transformer_sana_video.SanaVideoTransformer3DModel",
     dict(in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=12, num_layers=1,
          num_cross_attention_heads=2, cross_attention_head_dim=12, cross_attention_dim=24, caption_channels=16,
          mlp_ratio=2.5, attention_bias=False, sample_size=8, patch_size=(1, 2, 2), norm_elementwise_affine=False,
          norm_eps=1e-6, qk_norm="rms_norm_across_heads", rope_max_seq_len=32),
     lambda g: dict(hidden_states=_randn(g, 1, 16, 2, 8, 8), encoder_hidden_states=_randn(g, 1, 12, 16),
                    timestep=_steps(g)))

_add("skyreels_v2", "transformer_skyreels_v2.SkyReelsV2Transformer3DModel",
     dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
          text_dim=16,
          freq_dim=256, ffn_dim=32, num_layers=1, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
          rope_max_seq_len=32),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 2, 8, 8), encoder_hidden_states=_randn(g, 1, 12, 16),
                    timestep=_steps(g)))

_add("stable_audio3", "transformer_stable_audio3.StableAudio3DiTModel",
     dict(io_channels=8, patch_size=1, embed_dim=32, depth=1, num_heads=4, cond_token_dim=16, global_cond_dim=12,
          local_add_cond_dim=5, timestep_features_dim=16, ff_mult=2, num_memory_tokens=3,
          use_differential_attention=False),
     lambda g: dict(hidden_states=_randn(g, 1, 8, 16), timestep=torch.tensor([0.4]),
                    encoder_hidden_states=_randn(g, 1, 4, 16), global_hidden_states=_randn(g, 1, 12)))

_add("wan_animate", "transformer_wan_animate.WanAnimateTransformer3DModel",
     dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=12, latent_channels=4,
          out_channels=4, text_dim=16, freq_dim=256, ffn_dim=32, num_layers=1, cross_attn_norm=True,
          qk_norm="rms_norm_across_heads", image_dim=16, rope_max_seq_len=32,
          motion_encoder_channel_sizes={"4": 16, "8": 16}, motion_encoder_size=8, motion_style_dim=8,
          motion_dim=4, motion_encoder_dim=16, face_encoder_hidden_dim=16, face_encoder_num_heads=2,
          inject_face_latents_blocks=1),
     lambda g: dict(hidden_states=_randn(g, 1, 12, 6, 4, 4), timestep=_steps(g),
                    encoder_hidden_states=_randn(g, 1, 12, 16), encoder_hidden_states_image=_randn(g, 1, 12, 16),
                    pose_hidden_states=_randn(g, 1, 4, 5, 4, 4), face_pixel_values=_randn(g, 1, 3, 17, 8, 8)))


def _wan_animate2_inputs(g: torch.Generator) -> dict[str, Any]:
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2KVCache

    # The reference pass (kv_cache_mode="extract") over 2 latent frames of 4x4: dense self-attention whose K/V
    # fill a fresh cache.
    return dict(hidden_states=[_randn(g, 16, 2, 4, 4)], timestep=torch.tensor([1.0]),
                encoder_hidden_states=[_randn(g, 8, 32)], condition_latents=[_randn(g, 20, 2, 4, 4)],
                encoder_hidden_states_image=_randn(g, 1, 4, 1280), kv_cache=WanAnimate2KVCache(1),
                kv_cache_mode="extract", seq_len=2 * 2 * 2, offset_grid_sizes=torch.tensor([[2, 2, 2]]))


_add("wan_animate2", "transformer_wan_animate_2.WanAnimate2Transformer3DModel",
     dict(patch_size=(1, 2, 2), text_len=16, in_dim=36, dim=32, ffn_dim=64, freq_dim=16, text_dim=32, out_dim=16,
          num_heads=2, num_layers=1, cross_attn_norm=True, use_img_emb=True),
     _wan_animate2_inputs, fullgraph=False)

_add("wan_vace", "transformer_wan_vace.WanVACETransformer3DModel",
     dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
          text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
          rope_max_seq_len=32, vace_layers=[0], vace_in_channels=48),
     lambda g: dict(hidden_states=_randn(g, 1, 16, 2, 8, 8), encoder_hidden_states=_randn(g, 1, 12, 32),
                    control_hidden_states=_randn(g, 1, 48, 2, 8, 8), timestep=_steps(g)))

_add("z_image", "transformer_z_image.ZImageTransformer2DModel",
     dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=16, n_layers=1, n_refiner_layers=1, n_heads=1,
          n_kv_heads=2, qk_norm=True, cap_feat_dim=16, rope_theta=256.0, t_scale=1000.0, axes_dims=[8, 4, 4],
          axes_lens=[256, 32, 32]),
     lambda g: dict(x=[_randn(g, 16, 1, 8, 8)], cap_feats=[_randn(g, 16, 16)], t=torch.tensor([0.3])))


def _flux3_inputs(g: torch.Generator) -> dict[str, Any]:
    # (t, h, w, l) position ids as FLUX.2 builds them: a 4x4 image grid, 8 text tokens along l
    img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(4), torch.arange(4), torch.arange(1))
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(8))
    return dict(hidden_states=_randn(g, 1, 16, 16), encoder_hidden_states=_randn(g, 1, 8, 32),
                timestep=torch.tensor([0.5]), img_ids=img_ids, txt_ids=txt_ids)


_add("flux3", "transformer_flux3.Flux3Transformer2DModel",
     dict(in_channels=16, cond_in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
          num_attention_heads=2, joint_attention_dim=32, timestep_channels=32, mlp_ratio=3.0,
          axes_dims_rope=(4, 4, 4, 4)),
     _flux3_inputs)

_add("kandinsky5", "transformer_kandinsky.Kandinsky5Transformer3DModel",
     dict(in_visual_dim=4, in_text_dim=8, in_text_dim2=8, time_dim=16, out_visual_dim=4, patch_size=(1, 2, 2),
          model_dim=48, ff_dim=64, num_text_blocks=1, num_visual_blocks=1, axes_dims=(4, 4, 4), visual_cond=False),
     lambda g: dict(hidden_states=_randn(g, 1, 2, 4, 4, 4), encoder_hidden_states=_randn(g, 1, 6, 8),
                    timestep=torch.tensor([500.0]), pooled_projections=_randn(g, 1, 8),
                    visual_rope_pos=[torch.arange(2), torch.arange(2), torch.arange(2)], text_rope_pos=torch.arange(6)))

_add("kandinsky6", "transformer_kandinsky6.Kandinsky6Transformer3DModel",
     dict(in_visual_dim=4, out_visual_dim=4, in_text_dim=8, in_text_dim2=8, time_dim=16, patch_size=(1, 2, 2),
          model_dim=48, ff_dim=64, num_text_blocks=1, num_visual_blocks=1, axes_dims=(4, 4, 4), visual_cond=True,
          in_audio_dim=4, out_audio_dim=4),
     lambda g: dict(hidden_states=_randn(g, 1, 2, 4, 4, 9), encoder_hidden_states=_randn(g, 1, 6, 8),
                    pooled_projections=_randn(g, 1, 8), timestep=torch.tensor([500.0])))

_add("kandinsky6_sr", "transformer_kandinsky6_sr.Kandinsky6SRTransformer3DModel",
     dict(in_visual_dim=4, out_visual_dim=8, time_dim=16, patch_size=(1, 2, 2), model_dim=24, ff_dim=32,
          num_visual_blocks=1, axes_dims=(4, 4, 4)),
     lambda g: dict(hidden_states=_randn(g, 1, 2, 16, 16, 9), timestep=torch.tensor([500.0])))


def _sana_wm_inputs(g: torch.Generator) -> dict[str, Any]:
    frames, side = 4, 8
    # camera: a flat 4x4 camera-to-world matrix (identity rotation, forward translation) then fx, fy, cx, cy
    c2w = torch.eye(4).repeat(1, frames, 1, 1)
    c2w[..., 2, 3] = torch.arange(frames) * 0.1
    intrinsics = torch.tensor([float(side), float(side), side / 2, side / 2]).expand(1, frames, 4)
    return dict(hidden_states=_randn(g, 1, 4, frames, side, side),
                timestep=torch.randint(0, 1000, (1, 1, frames), generator=g).float(),
                encoder_hidden_states=_randn(g, 1, 1, 16, 8),
                encoder_attention_mask=torch.ones(1, 16, dtype=torch.int64),
                camera_conditions=torch.cat([c2w.flatten(-2), intrinsics], dim=-1),
                chunk_plucker=_randn(g, 1, 8, frames, side, side))


_add("sana_wm", "transformer_sana_wm.SanaWMTransformer3DModel",
     dict(in_channels=4, num_layers=1, hidden_size=32, num_attention_heads=2, patch_size=(1, 1, 1), softmax_every_n=1,
          linear_head_dim=16, t_kernel_size=3, conv_kernel_size=4, caption_channels=8, mlp_ratio=2.0,
          # one softmax block (a GDN block doubles the time)
          chunk_plucker_channels=8, chunk_plucker_post_attn_blocks=1),
     _sana_wm_inputs, fp32_inputs=("camera_conditions",))


def _sana_wm_refiner_inputs(g: torch.Generator) -> dict[str, Any]:
    from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMLTX2AudioVideoRotaryPosEmbed

    frames, side = 2, 4
    rope = SanaWMLTX2AudioVideoRotaryPosEmbed(dim=16, base_num_frames=20, base_height=2048, base_width=2048,
                                              scale_factors=(8, 32, 32), modality="video", double_precision=False,
                                              num_attention_heads=2)
    coords = rope.prepare_video_coords(1, frames, side, side, device=torch.device("cpu"), fps=24.0)
    n = frames * side * side
    return dict(hidden_states=_randn(g, 1, n, 4), encoder_hidden_states=_randn(g, 1, 8, 16),
                timestep=torch.rand(1, n, generator=g) * 1000, video_rotary_emb=rope(coords),
                encoder_attention_mask=torch.ones(1, 8))


_add("sana_wm_refiner", "transformer_sana_wm_refiner.SanaWMLTX2RefinerTransformer3DModel",
     dict(in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
          cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
          audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=1, qk_norm="rms_norm_across_heads",
          caption_channels=16, rope_double_precision=False),
     _sana_wm_refiner_inputs, fp32_inputs=("video_rotary_emb",))

_add("bria_fibo2", "transformer_bria_fibo2.BriaFibo2Transformer2DModel",
     dict(in_channels=4, patch_size=2, dim=32, n_layers=1, n_refiner_layers=1, n_heads=2, cap_feat_dim=24,
          injection_layer_ids=(0,), perceiver_num_layers=1, min_num_gist_tokens=4, max_num_gist_tokens=8, gist_step=4,
          gist_min_text_len=4, gist_max_text_len=16, axes_dims=(4, 6, 6), axes_lens=(16, 16, 16)),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 8, 8), timestep=torch.tensor([0.5]),
                    encoder_hidden_states=_randn(g, 1, 2, 6, 24)))  # one text bundle + one per injection block


def _qwen_image21_inputs(g: torch.Generator) -> dict[str, Any]:
    text, side = 4, 2
    img_mask = torch.zeros(1, text + side * side // 4, dtype=torch.bool)
    img_mask[:, text:] = True  # one vision slot per 2x2 group of target latents, after the text
    return dict(hidden_states=_randn(g, 1, side * side, 4), encoder_hidden_states=_randn(g, 1, text, 8),
                encoder_hidden_states_mask=torch.ones(1, text, dtype=torch.int64), timestep=torch.tensor([1.0]),
                img_shapes=[[(1, side, side)]], img_mask=img_mask)


_add("qwen_image21", "transformer_qwenimage21.QwenImage21Transformer2DModel",
     dict(patch_size=1, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=16, num_attention_heads=2,
          context_in_dim=8, mlp_ratio=2, axes_dims_rope=(4, 6, 6)),
     _qwen_image21_inputs, fullgraph=False)

_add("anyflow_far", "transformer_anyflow_far.AnyFlowFARTransformer3DModel",
     dict(patch_size=(1, 2, 2), compressed_patch_size=(1, 4, 4), full_chunk_limit=3, num_attention_heads=2,
          attention_head_dim=12, in_channels=4, out_channels=4, text_dim=16, freq_dim=256, ffn_dim=32, num_layers=1,
          cross_attn_norm=True, rope_max_seq_len=32, gate_value=0.25, deltatime_type="r"),
     lambda g: dict(hidden_states=_randn(g, 1, 4, 4, 8, 8), timestep=torch.full((1, 4), 500.0),
                    r_timestep=torch.full((1, 4), 250.0), encoder_hidden_states=_randn(g, 1, 12, 16),
                    chunk_partition=[2, 2]))

_add("t5film", "t5_film_transformer.T5FilmDecoder",
     dict(input_dims=8, targets_length=16, d_model=32, num_layers=1, num_heads=2, d_kv=16, d_ff=64, dropout_rate=0.0),
     lambda g: dict(encodings_and_masks=[(_randn(g, 1, 6, 32), torch.ones(1, 6, dtype=torch.bool))],
                    decoder_input_tokens=_randn(g, 1, 16, 8), decoder_noise_time=torch.tensor([0.4])))


_add("rfd4_proteina", "transformer_rfd4_proteina.RFD4ProteinaTransformer",
     dict(nlayers=1, token_dim=32, nheads=2, dim_cond=16, pair_repr_dim=16, latent_dim=4, token_type_emb_dim=4,
          cath_emb_dim=4, t_emb_dim=16, seq_sep_dim=8, xt_pair_dist_dim=4, feats_seq=("xt_bb_ca", "xt_local_latents"),
          feats_cond_seq=("time_emb_bb_ca", "time_emb_local_latents"), feats_pair_repr=("xt_bb_ca_pair_dists",),
          feats_pair_cond=("time_emb_bb_ca",), tri_mult_c=8, num_sequence_classes=8, num_token_types=3),
     lambda g: dict(bb_ca=_randn(g, 1, 8, 3), local_latents=_randn(g, 1, 8, 4), bb_ca_time=torch.tensor([0.4]),
                    local_latents_time=torch.tensor([0.6]), padding_mask=torch.ones(1, 8, dtype=torch.bool),
                    conditioning={"is_in_context_conditioning": torch.zeros(1, 8, dtype=torch.bool),
                                  "supports_local_latent": torch.ones(1, 8, dtype=torch.bool)}),
     fp32_inputs=("bb_ca", "local_latents", "bb_ca_time", "local_latents_time"))  # the sampler state


ZOO: dict[str, ZooModel] = {m.name: m for m in _ENTRIES}
