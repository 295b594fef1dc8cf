"""Two more DiTs as users write them in plain PyTorch, spelled unlike ``PlainDiT`` and unlike any diffusers class:
what the lossless tier must find by form alone (tests/test_user_dits.py, tests/gpu/test_models_gpu.py).

- ``RMSDiT`` (the Llama / Lumina family of spellings): patches by ``view → permute → flatten`` and a ``Linear``,
  RMSNorm written out on one fp32 copy of x (``xf = x.float(); xf * rsqrt(xf.pow(2).mean(-1, keepdim=True) +
  eps)``, cast back, times the weight) for the block norms, sandwich norms and QK norms, separate q/k/v
  projections, a complex RoPE (``view_as_complex`` times a ``polar`` table, ``view_as_real``), SwiGLU
  ``w2(silu(w1(x)) * w3(x))``, and ``tanh`` gates ``x + gate.tanh() * norm(y)``.
- ``JointDiT`` (an MMDiT): text and image streams with their own weights, modulated and gated by ``torch.addcmul``
  (``addcmul(shift, norm(x), 1 + scale)``, ``addcmul(x, gate, y)``), ``nn.LayerNorm`` QK norms over the head dim,
  the streams' q/k/v joined by ``cat`` along the tokens, a rotate-every-two RoPE built with ``stack``, SDPA, the
  output split back by slicing, and a SwiGLU of ``chunk(2)``.

Each ``build_*`` returns ``(model, args)`` with random weights (seeded) at a tiny size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .plain_dit import timestep_embedding

__all__ = ["JointDiT", "RMSDiT", "USER_DITS", "build_user_dit"]


# --- RMSDiT -------------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def apply_complex_rope(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs_cis).flatten(3).type_as(x)


class RMSAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.q_norm, self.k_norm = RMSNorm(self.head_dim), RMSNorm(self.head_dim)
        self.to_out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q = self.q_norm(self.to_q(x).view(B, N, self.heads, self.head_dim))
        k = self.k_norm(self.to_k(x).view(B, N, self.heads, self.head_dim))
        v = self.to_v(x).view(B, N, self.heads, self.head_dim)
        q, k = apply_complex_rope(q, freqs_cis), apply_complex_rope(k, freqs_cis)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.to_out(o.transpose(1, 2).reshape(B, N, C))


class RMSBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn = RMSAttention(dim, heads)
        self.w1, self.w3 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(dim, 4 * dim, bias=False)
        self.w2 = nn.Linear(4 * dim, dim, bias=False)
        self.attn_norm1, self.attn_norm2 = RMSNorm(dim), RMSNorm(dim)
        self.ffn_norm1, self.ffn_norm2 = RMSNorm(dim), RMSNorm(dim)
        self.adaLN_modulation = nn.Linear(dim, 4 * dim)

    def forward(self, x: torch.Tensor, c: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        scale_msa, gate_msa, scale_mlp, gate_mlp = self.adaLN_modulation(F.silu(c)).chunk(4, dim=1)
        y = self.attn(self.attn_norm1(x) * (1 + scale_msa.unsqueeze(1)), freqs_cis)
        x = x + gate_msa.unsqueeze(1).tanh() * self.attn_norm2(y)
        h = self.ffn_norm1(x) * (1 + scale_mlp.unsqueeze(1))
        return x + gate_mlp.unsqueeze(1).tanh() * self.ffn_norm2(self.w2(F.silu(self.w1(h)) * self.w3(h)))


class RMSDiT(nn.Module):
    """``RMSDiT(...)(x, t)``: x ``[B, in_channels, H, W]``, t ``[B]``; returns ``(out,)`` of x's shape."""

    def __init__(self, in_channels: int = 4, patch: int = 2, dim: int = 64, heads: int = 2, depth: int = 2,
                 freq_dim: int = 256) -> None:
        super().__init__()
        self.patch, self.freq_dim, self.head_dim = patch, freq_dim, dim // heads
        self.x_embedder = nn.Linear(in_channels * patch * patch, dim)
        self.t_embedder = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.blocks = nn.ModuleList(RMSBlock(dim, heads) for _ in range(depth))
        self.norm_final = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.final_scale = nn.Linear(dim, dim)
        self.linear = nn.Linear(dim, patch * patch * in_channels)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor]:
        B, C, H, W = x.shape
        p, h, w = self.patch, H // self.patch, W // self.patch
        tokens = self.x_embedder(x.view(B, C, h, p, w, p).permute(0, 2, 4, 3, 5, 1).flatten(3).flatten(1, 2))
        c = self.t_embedder(timestep_embedding(t, self.freq_dim).to(x.dtype))
        pos = torch.arange(h * w, dtype=torch.float32, device=x.device)
        inv = 1.0 / 10000 ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=x.device) / self.head_dim)
        angles = torch.outer(pos, inv)
        freqs_cis = torch.polar(torch.ones_like(angles), angles)[None, :, None]
        for block in self.blocks:
            tokens = block(tokens, c, freqs_cis)
        out = self.linear(self.norm_final(tokens) * (1 + self.final_scale(F.silu(c))[:, None]))
        return (out.view(B, h, w, p, p, C).permute(0, 5, 1, 3, 2, 4).reshape(B, C, H, W),)


# --- JointDiT -----------------------------------------------------------------------------------------------------
def rope_every_two(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack([-x2, x1], dim=-1).flatten(-2)
    return (x.float() * cos + rotated.float() * sin).type_as(x)


class JointAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv, self.qkv_context = nn.Linear(dim, 3 * dim), nn.Linear(dim, 3 * dim)
        self.q_norm, self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6), nn.LayerNorm(self.head_dim, eps=1e-6)
        self.q_norm_context = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.k_norm_context = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.proj, self.proj_context = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x, context, cos, sin):
        B, N, C = x.shape
        M = context.shape[1]
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, self.head_dim).unbind(2)
        qc, kc, vc = self.qkv_context(context).view(B, M, 3, self.heads, self.head_dim).unbind(2)
        q = torch.cat([self.q_norm_context(qc), self.q_norm(q)], dim=1)
        k = torch.cat([self.k_norm_context(kc), self.k_norm(k)], dim=1)
        v = torch.cat([vc, v], dim=1)
        q, k = rope_every_two(q, cos, sin), rope_every_two(k, cos, sin)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        o = o.transpose(1, 2).flatten(2)
        return self.proj(o[:, M:]), self.proj_context(o[:, :M])


class JointBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm1_context = (nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6) for _ in range(2))
        self.norm2, self.norm2_context = (nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6) for _ in range(2))
        self.attn = JointAttention(dim, heads)
        self.fc1, self.fc2 = nn.Linear(dim, 8 * dim), nn.Linear(4 * dim, dim)
        self.fc1_context, self.fc2_context = nn.Linear(dim, 8 * dim), nn.Linear(4 * dim, dim)
        self.modulation, self.modulation_context = nn.Linear(dim, 6 * dim), nn.Linear(dim, 6 * dim)

    @staticmethod
    def swiglu(h, fc1, fc2):
        a, b = fc1(h).chunk(2, dim=-1)
        return fc2(F.silu(a) * b)

    def forward(self, x, context, temb, cos, sin):
        shift, scale, gate, shift2, scale2, gate2 = self.modulation(F.silu(temb))[:, None].chunk(6, dim=-1)
        c_shift, c_scale, c_gate, c_shift2, c_scale2, c_gate2 = (
            self.modulation_context(F.silu(temb))[:, None].chunk(6, dim=-1))
        y, yc = self.attn(torch.addcmul(shift, self.norm1(x), 1 + scale),
                          torch.addcmul(c_shift, self.norm1_context(context), 1 + c_scale), cos, sin)
        x, context = torch.addcmul(x, gate, y), torch.addcmul(context, c_gate, yc)
        h = torch.addcmul(shift2, self.norm2(x), 1 + scale2)
        hc = torch.addcmul(c_shift2, self.norm2_context(context), 1 + c_scale2)
        x = torch.addcmul(x, gate2, self.swiglu(h, self.fc1, self.fc2))
        context = torch.addcmul(context, c_gate2, self.swiglu(hc, self.fc1_context, self.fc2_context))
        return x, context


class JointDiT(nn.Module):
    """``JointDiT(...)(x, context, temb)``: image tokens ``[B, N, dim]``, text tokens ``[B, M, dim]``, a pooled
    conditioning ``[B, dim]``; returns ``(out,)``, ``[B, N, out_dim]``."""

    def __init__(self, dim: int = 64, heads: int = 2, depth: int = 2, out_dim: int = 16) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.blocks = nn.ModuleList(JointBlock(dim, heads) for _ in range(depth))
        self.norm_out = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.proj_out = nn.Linear(dim, out_dim)

    def forward(self, x, context, temb):
        tokens = x.shape[1] + context.shape[1]
        pos = torch.arange(tokens, dtype=torch.float32, device=x.device)
        inv = 1.0 / 10000 ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=x.device) / self.head_dim)
        angles = torch.outer(pos, inv).repeat_interleave(2, dim=-1)[None, :, None]
        cos, sin = angles.cos(), angles.sin()
        for block in self.blocks:
            x, context = block(x, context, temb, cos, sin)
        return (self.proj_out(self.norm_out(x)),)


def _rmsdit(dtype, device, gen):
    model = RMSDiT()
    # 16x16 latents in patches of 2: 64 tokens, heads of 32
    return model, (torch.randn(2, 4, 16, 16, generator=gen).to(device, dtype),
                   torch.tensor([500.0, 20.0], device=device, dtype=dtype))


def _jointdit(dtype, device, gen):
    model = JointDiT()
    return model, tuple(torch.randn(*s, generator=gen).to(device, dtype) for s in ((2, 64, 64), (2, 12, 64), (2, 64)))


USER_DITS = {"rms_dit": _rmsdit, "joint_dit": _jointdit}


def build_user_dit(name: str, dtype: torch.dtype = torch.bfloat16, device="cpu", seed: int = 0):
    """``(model, args)`` of one of ``USER_DITS``: eval mode on ``device`` in ``dtype``, seeded random weights (norm
    weights drawn around 1, so that they are not all ones)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model, args = USER_DITS[name](dtype, device, gen)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n and n.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
    return model.to(device, dtype).eval(), args
