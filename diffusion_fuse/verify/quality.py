"""Quality metrics for tier "high": how far a non-exact pipeline output is from eager's.

``psnr`` and ``ssim`` compare final images or videos ([B, C, H, W] or [B, C, F, H, W],
values in ``data_range``); ``QualityGate`` is what tests use to admit a non-exact family:
a full denoising run (>= 20 steps) must stay above its PSNR and SSIM floors.
SSIM is Wang et al. 2004: 11x11 Gaussian window (sigma 1.5), K1 0.01, K2 0.03, mean over
channels, frames and positions (valid windows only).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F


def _as_images(t: torch.Tensor) -> torch.Tensor:
    """[N, C, H, W] float64: videos [B, C, F, H, W] become B*F images."""
    t = t.detach().to(torch.float64)
    if t.dim() == 5:
        b, c, f, h, w = t.shape
        t = t.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w)
    if t.dim() != 4:
        raise ValueError(f"expected an image [B,C,H,W] or a video [B,C,F,H,W], got shape {tuple(t.shape)}")
    return t


def psnr(ref: torch.Tensor, out: torch.Tensor, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB (``inf`` when equal)."""
    mse = float(F.mse_loss(_as_images(out), _as_images(ref)))
    return math.inf if mse == 0 else 10 * math.log10(data_range**2 / mse)


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    return g / g.sum()


def ssim(ref: torch.Tensor, out: torch.Tensor, data_range: float = 1.0, window: int = 11) -> float:
    """Mean structural similarity (1.0 when equal)."""
    x, y = _as_images(ref), _as_images(out)
    n, c, h, w = x.shape
    size = min(window, h, w)
    g = _gaussian_window(size)
    kernel = (g[:, None] * g[None, :]).expand(c, 1, size, size).contiguous()

    def blur(t):
        return F.conv2d(t, kernel, groups=c)

    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mx, my = blur(x), blur(y)
    vx, vy, cov = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
    s = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    return float(s.mean())


@dataclasses.dataclass(frozen=True)
class QualityGate:
    """Floors a non-exact output must stay above (defaults: visually indistinguishable)."""

    min_psnr: float = 35.0
    min_ssim: float = 0.98
    data_range: float = 1.0

    def measure(self, ref: torch.Tensor, out: torch.Tensor) -> dict[str, float | bool]:
        p, s = psnr(ref, out, self.data_range), ssim(ref, out, self.data_range)
        return {"psnr": p, "ssim": s, "passed": p >= self.min_psnr and s >= self.min_ssim}
