"""Tiny random-weight diffusion transformers for tests, examples and pattern censuses.

Importable helper (no pytest dependency)::

    from diffusion_fuse.testing.tiny_models import MODEL_NAMES, build
    model, kwargs = build("flux", dtype=torch.bfloat16)
    out = model(**kwargs)[0]

Every diffusers model is built from a tiny config of its class (the ``_<model>()`` builders below; ``plain_dit``: a DiT
written in plain PyTorch, testing/plain_dit.py, at head dim 32), with random weights
drawn after ``torch.manual_seed(seed)``, in eval mode, and takes well under a second to build on CPU.

Dtype handling mirrors ``ModelMixin.from_pretrained(torch_dtype=dtype)`` (diffusers 0.42.1,
``model_loading_utils.load_model_dict_into_meta``): every floating-point tensor of the state dict is cast to
``dtype``, except those whose dotted name contains a component listed in ``model._keep_in_fp32_modules`` (Wan:
rope, time_embedder, scale_shift_table, norm1/2/3), which are kept in float32. Non-persistent buffers are not part
of the state dict, so ``from_pretrained`` leaves them as constructed (float32); we do the same.
"""

from __future__ import annotations

import torch

MODEL_NAMES = ["flux", "flux2", "wan21", "wan22_ti2v", "sana", "qwen_image", "sd35", "plain_dit"]

__all__ = ["MODEL_NAMES", "build", "cast_like_from_pretrained", "wider"]


# ----------------------------------------------------------------------------------------------------------------
# dtype casting as from_pretrained does it
# ----------------------------------------------------------------------------------------------------------------
def cast_like_from_pretrained(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast ``model`` in place the way ``from_pretrained(torch_dtype=dtype)`` would have loaded it.

    Floating state-dict entries go to ``dtype``; entries whose name has a component in
    ``model._keep_in_fp32_modules`` go to float32 (``param_name.split(".")`` matching, as diffusers does);
    non-persistent buffers are left untouched.
    """
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    if isinstance(keep, str):
        keep = [keep]
    state_names = set(model.state_dict(keep_vars=True).keys())

    def target(name: str) -> torch.dtype:
        if any(m in name.split(".") for m in keep):
            return torch.float32
        return dtype

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.is_floating_point():
                t = target(name)
                if p.dtype != t:
                    p.data = p.data.to(t)
        for mod_name, mod in model.named_modules():
            for b_name, b in list(mod._buffers.items()):
                if b is None or not b.is_floating_point():
                    continue
                full = f"{mod_name}.{b_name}" if mod_name else b_name
                if full not in state_names:  # non-persistent: from_pretrained never touches it
                    continue
                t = target(full)
                if b.dtype != t:
                    mod._buffers[b_name] = b.to(t)
    return model


# ----------------------------------------------------------------------------------------------------------------
# builders: each returns (model constructed in fp32 on CPU, kwargs-factory(dtype, device, generator))
# ----------------------------------------------------------------------------------------------------------------
def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen)


def _flux():
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=True,
        axes_dims_rope=(4, 6, 6),
    )

    def kwargs(dtype, device, gen):
        # 4x4 latent grid -> 16 image tokens; img_ids = (0, row, col) as the FLUX pipeline builds them.
        img_ids = torch.zeros(4, 4, 3)
        img_ids[..., 1] = torch.arange(4)[:, None]
        img_ids[..., 2] = torch.arange(4)[None, :]
        return dict(
            hidden_states=_randn(gen, 1, 16, 16).to(device, dtype),
            encoder_hidden_states=_randn(gen, 1, 8, 32).to(device, dtype),
            pooled_projections=_randn(gen, 1, 32).to(device, dtype),
            timestep=torch.tensor([0.5], device=device, dtype=dtype),
            img_ids=img_ids.reshape(16, 3).to(device, torch.float32),
            txt_ids=torch.zeros(8, 3, device=device, dtype=torch.float32),
            guidance=torch.tensor([3.5], device=device, dtype=dtype),
            return_dict=False,
        )

    return model, kwargs


def _flux2():
    from diffusers import Flux2Transformer2DModel

    model = Flux2Transformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        timestep_guidance_channels=32,
        mlp_ratio=3.0,
        axes_dims_rope=(4, 4, 4, 4),
        rope_theta=2000,
        guidance_embeds=True,
    )

    def kwargs(dtype, device, gen):
        # (T, H, W, L) coordinates as Flux2Pipeline._prepare_latent_ids / _prepare_text_ids build them.
        img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(4), torch.arange(4), torch.arange(1))
        txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(8))
        return dict(
            hidden_states=_randn(gen, 1, 16, 16).to(device, dtype),
            encoder_hidden_states=_randn(gen, 1, 8, 32).to(device, dtype),
            timestep=torch.tensor([0.5], device=device, dtype=dtype),
            img_ids=img_ids.to(device, torch.int64),
            txt_ids=txt_ids.to(device, torch.int64),
            guidance=torch.tensor([3.5], device=device, dtype=dtype),
            return_dict=False,
        )

    return model, kwargs


def _wan(per_token: bool):
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=4,
        out_channels=4,
        text_dim=16,
        freq_dim=16,
        ffn_dim=32,
        num_layers=1,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )

    def kwargs(dtype, device, gen):
        # hidden [1, C=4, F=2, H=8, W=8] -> patch (1,2,2) -> 2*4*4 = 32 tokens.
        if per_token:
            # Wan2.2 TI2V (pipeline expand_timesteps=True): timestep = (mask[0][0][:, ::2, ::2] * t).flatten(),
            # shape [batch, seq_len]; the first latent frame (image condition) has mask 0 -> timestep 0.
            ts = torch.full((2, 4, 4), 500, dtype=torch.int64)
            ts[0] = 0
            timestep = ts.flatten().unsqueeze(0)  # [1, 32] -> model takes the per-token (temb.ndim == 3) path
        else:
            timestep = torch.tensor([500], dtype=torch.int64)
        return dict(
            hidden_states=_randn(gen, 1, 4, 2, 8, 8).to(device, dtype),
            timestep=timestep.to(device),
            encoder_hidden_states=_randn(gen, 1, 12, 16).to(device, dtype),
            return_dict=False,
        )

    return model, kwargs


def _sana():
    from diffusers import SanaTransformer2DModel

    model = SanaTransformer2DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=1,
        num_cross_attention_heads=2,
        cross_attention_head_dim=8,
        cross_attention_dim=16,
        caption_channels=8,
        sample_size=8,
        patch_size=1,
    )

    def kwargs(dtype, device, gen):
        return dict(
            hidden_states=_randn(gen, 1, 4, 8, 8).to(device, dtype),
            encoder_hidden_states=_randn(gen, 1, 6, 8).to(device, dtype),
            # SanaPipeline: timestep = t.expand(B) * timestep_scale (float, 0..1000)
            timestep=torch.tensor([500.0], device=device, dtype=dtype),
            encoder_attention_mask=torch.ones(1, 6, device=device, dtype=torch.int64),
            return_dict=False,
        )

    return model, kwargs


def _qwen_image():
    from diffusers import QwenImageTransformer2DModel

    model = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=16,
        axes_dims_rope=(8, 4, 4),
    )

    def kwargs(dtype, device, gen):
        # packed latents: img_shapes (1, 4, 4) -> 16 tokens of 16 = 4 ch * 2 * 2 channels
        return dict(
            hidden_states=_randn(gen, 1, 16, 16).to(device, dtype),
            encoder_hidden_states=_randn(gen, 1, 7, 16).to(device, dtype),
            encoder_hidden_states_mask=torch.ones(1, 7, device=device, dtype=torch.int64),
            # QwenImagePipeline passes timestep / 1000 (float)
            timestep=torch.tensor([0.5], device=device, dtype=dtype),
            img_shapes=[(1, 4, 4)],
            return_dict=False,
        )

    return model, kwargs


def _sd35():
    from diffusers import SD3Transformer2DModel

    model = SD3Transformer2DModel(
        sample_size=8,
        patch_size=1,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        joint_attention_dim=32,
        pooled_projection_dim=64,
        out_channels=4,
        pos_embed_max_size=16,
        dual_attention_layers=(0,),
        qk_norm="rms_norm",
    )

    def kwargs(dtype, device, gen):
        return dict(
            hidden_states=_randn(gen, 1, 4, 8, 8).to(device, dtype),
            encoder_hidden_states=_randn(gen, 1, 8, 32).to(device, dtype),
            pooled_projections=_randn(gen, 1, 64).to(device, dtype),
            # StableDiffusion3Pipeline: timestep = t.expand(B) (float, 0..1000)
            timestep=torch.tensor([500.0], device=device, dtype=dtype),
            return_dict=False,
        )

    return model, kwargs


def _plain_dit():
    from .plain_dit import PlainDiT

    model = PlainDiT(in_channels=4, patch=2, dim=64, heads=2, depth=2)

    def kwargs(dtype, device, gen):
        # 16x16 latents in patches of 2: 64 tokens
        return dict(x=_randn(gen, 1, 4, 16, 16).to(device, dtype),
                    t=torch.tensor([500.0], device=device, dtype=dtype))

    return model, kwargs


_BUILDERS = {
    "flux": _flux,
    "flux2": _flux2,
    "wan21": lambda: _wan(per_token=False),
    "wan22_ti2v": lambda: _wan(per_token=True),
    "sana": _sana,
    "qwen_image": _qwen_image,
    "sd35": _sd35,
    "plain_dit": _plain_dit,
}


def build(
    name: str, dtype: torch.dtype = torch.bfloat16, device="cpu", seed: int = 0
) -> tuple[torch.nn.Module, dict]:
    """Return ``(model, kwargs)``: an eval-mode tiny model with random weights and the kwargs of its forward call.

    ``model(**kwargs)`` returns a tuple (``return_dict=False``) whose element 0 is the prediction. Inputs are drawn
    from a generator seeded with ``seed`` too, so two builds with the same arguments are identical.
    """
    if name not in _BUILDERS:
        raise KeyError(f"unknown tiny model {name!r}; choose from {MODEL_NAMES}")
    torch.manual_seed(seed)
    model, make_kwargs = _BUILDERS[name]()
    model.eval()
    cast_like_from_pretrained(model, dtype)
    model.to(device=device)  # device only; dtypes stay as set above
    gen = torch.Generator().manual_seed(seed + 1)
    return model, make_kwargs(dtype, torch.device(device), gen)


def wider(name: str, kwargs: dict, seed: int = 0) -> dict:
    """``kwargs`` of ``build(name)`` at twice the latent width: a second resolution (same dtypes and device).

    FLUX: a 4x8 latent grid (32 image tokens, ``img_ids`` to match); Wan 2.1 / 2.2 TI2V: 8x16 latents
    (64 tokens; Wan 2.2's per-token timesteps to match).
    """
    gen = torch.Generator().manual_seed(seed + 2)
    hs = kwargs["hidden_states"]
    device, dtype = hs.device, hs.dtype
    if name == "flux":
        ids = torch.zeros(4, 8, 3)
        ids[..., 1] = torch.arange(4)[:, None]
        ids[..., 2] = torch.arange(8)[None, :]
        return dict(kwargs, hidden_states=_randn(gen, 1, 32, hs.shape[-1]).to(device, dtype),
                    img_ids=ids.reshape(32, 3).to(device, torch.float32))
    if name in ("wan21", "wan22_ti2v"):
        out = dict(kwargs, hidden_states=_randn(gen, *hs.shape[:-1], 2 * hs.shape[-1]).to(device, dtype))
        if name == "wan22_ti2v":
            ts = torch.full((2, 4, 8), 500, dtype=torch.int64)
            ts[0] = 0
            out["timestep"] = ts.flatten().unsqueeze(0).to(device)
        return out
    raise KeyError(f"no second resolution for tiny model {name!r}; have flux, wan21, wan22_ti2v")


class QKNorm(torch.nn.Module):
    """An attention's q/k norm as diffusers builds it for Qwen-Image and SD3.5: ``RMSNorm`` over the head dim of
    ``[B, S, heads * head_dim]`` projections (at a ``head_dim`` of 32 to 1024, a power of two, the tail's pointwise
    kernel sums the variance; at others of 32 and more family ``mean_square`` takes it; the tiny models' 16 is
    neither's)."""

    def __init__(self, heads: int, head_dim: int, weight: bool = True):
        super().__init__()
        from diffusers.models.normalization import RMSNorm

        self.heads = heads
        self.norm = RMSNorm(head_dim, eps=1e-6, elementwise_affine=weight)

    def forward(self, q):
        return self.norm(q.unflatten(-1, (self.heads, -1)))
