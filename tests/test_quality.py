"""The tier-high quality harness: PSNR/SSIM against eager over a full denoising run."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diffusion_fuse.verify.quality import QualityGate, psnr, ssim

ROOT = Path(__file__).resolve().parents[1]


def test_psnr_and_ssim_of_known_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 32, 32, generator=g)
    assert psnr(x, x) == math.inf and ssim(x, x) == pytest.approx(1.0)
    noisy = x + 0.01 * torch.randn(x.shape, generator=g)
    assert psnr(x, noisy) == pytest.approx(40.0, abs=0.2)  # MSE 1e-4 over a unit range
    assert 0.99 < ssim(x, noisy) < 1.0
    assert ssim(x, torch.rand(x.shape, generator=g)) < 0.1  # unrelated images


def test_videos_are_compared_frame_by_frame():
    g = torch.Generator().manual_seed(1)
    v = torch.rand(1, 3, 4, 16, 16, generator=g)
    w = v.clone()
    w[:, :, 2] = 0  # one frame wrong
    assert ssim(v, w) < ssim(v, v) and psnr(v, w) < 20
    with pytest.raises(ValueError, match="expected an image"):
        psnr(torch.rand(3, 16, 16), torch.rand(3, 16, 16))


def test_gate():
    x = torch.rand(1, 3, 16, 16)
    gate = QualityGate(min_psnr=35, min_ssim=0.98)
    assert gate.measure(x, x)["passed"]
    assert not gate.measure(x, x + 0.1)["passed"]


# One pipeline: a video's frame-by-frame comparison is tested above, and every example shares the gate's plumbing
# (examples/_common.py); a tier-high compile runs Inductor's CPU codegen, the suite's dearest step
@pytest.mark.parametrize("example", ["flux_pipeline.py"])
def test_tier_high_passes_the_gate_over_twenty_steps(example):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, f"examples/{example}", "--quality", "high", "--steps", "20",
                           "--device", "cpu"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "tier-high quality gate" in proc.stdout and "passed: True" in proc.stdout, proc.stdout[-1500:]
