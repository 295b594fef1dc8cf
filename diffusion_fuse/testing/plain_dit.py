"""A DiT written in plain PyTorch, as a user writes one (no diffusers): the lossless tier's forms without a
diffusers class behind them.

The spellings are those of the DiT reference code and its descendants: a conv patch embedding, a sinusoidal
timestep MLP, ``adaLN_modulation = Sequential(SiLU(), Linear(dim, 6 * dim))`` chunked per block,
``modulate(x, shift, scale) = x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)`` after an affine-free
``nn.LayerNorm``, one fused qkv ``Linear`` split by ``reshape → permute → unbind``, ``nn.RMSNorm`` QK norms, a
rotate-half RoPE in fp32 (``x * cos + cat([-x2, x1]) * sin``), ``F.scaled_dot_product_attention``, a GELU-tanh MLP,
gated residuals ``x + gate.unsqueeze(1) * y``, and a final modulated LayerNorm, linear and unpatchify.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PlainDiT"]


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def timestep_embedding(t: torch.Tensor, freq_dim: int) -> torch.Tensor:
    """The sinusoidal embedding [B, freq_dim] of timesteps t [B], in fp32: cos then sin."""
    half = freq_dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-6)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=1e-6)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        q = (q.float() * cos + rotate_half(q.float()) * sin).to(v.dtype)
        k = (k.float() * cos + rotate_half(k.float()) * sin).to(v.dtype)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def forward(self, x: torch.Tensor, c: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa), cos, sin)
        h = F.gelu(self.fc1(modulate(self.norm2(x), shift_mlp, scale_mlp)), approximate="tanh")
        return x + gate_mlp.unsqueeze(1) * self.fc2(h)


class PlainDiT(nn.Module):
    """``PlainDiT(...)(x, t)``: x ``[B, in_channels, H, W]`` latents, t ``[B]`` timesteps; returns ``(out,)``,
    out of x's shape (a tuple, as the diffusers models return with ``return_dict=False``)."""

    def __init__(self, in_channels: int = 4, patch: int = 2, dim: int = 64, heads: int = 2, depth: int = 2,
                 freq_dim: int = 256) -> None:
        super().__init__()
        self.patch, self.heads, self.freq_dim = patch, heads, freq_dim
        self.x_embedder = nn.Conv2d(in_channels, dim, patch, stride=patch)
        self.t_embedder = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm_final = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.final_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.linear = nn.Linear(dim, patch * patch * in_channels)

    def rope(self, h: int, w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """2-D rotary tables [h * w, head_dim] in fp32: rows then columns, each over half the head dim."""
        quarter = self.blocks[0].attn.head_dim // 4
        inv = 1.0 / (10000 ** (torch.arange(quarter, dtype=torch.float32, device=device) / quarter))
        rows = torch.arange(h, dtype=torch.float32, device=device).repeat_interleave(w)
        cols = torch.arange(w, dtype=torch.float32, device=device).repeat(h)
        ang = torch.cat([rows[:, None] * inv, cols[:, None] * inv], dim=-1)
        ang = torch.cat([ang, ang], dim=-1)
        return ang.cos(), ang.sin()

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor]:
        B, C, H, W = x.shape
        h, w = H // self.patch, W // self.patch
        tokens = self.x_embedder(x).flatten(2).transpose(1, 2)
        c = self.t_embedder(timestep_embedding(t, self.freq_dim).to(x.dtype))
        cos, sin = self.rope(h, w, x.device)
        for block in self.blocks:
            tokens = block(tokens, c, cos, sin)
        shift, scale = self.final_modulation(c).chunk(2, dim=1)
        out = self.linear(modulate(self.norm_final(tokens), shift, scale))
        out = out.reshape(B, h, w, self.patch, self.patch, C).permute(0, 5, 1, 3, 2, 4)
        return (out.reshape(B, C, H, W),)
