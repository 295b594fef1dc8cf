"""Two user DiTs in plain PyTorch (diffusion_fuse/testing/user_dits.py), spelled unlike the diffusers models: the
lossless tier finds their forms and gives eager's bits on the CPU (the ops' reference paths; the kernels' bits are
tests/gpu/test_models_gpu.py's)."""

from __future__ import annotations

import collections

import pytest
import torch
from helpers import bitwise_equal

import diffusion_fuse
from diffusion_fuse.census import classify
from diffusion_fuse.testing.user_dits import USER_DITS, build_user_dit

# kept sites per family (bf16): RMSDiT's 12 RMSNorm variances (4 block norms and 2 QK norms a block, 2 blocks) in
# their tails' pointwise kernels (no mean_square site), the final LayerNorm reading the last gated residual;
# JointDiT's 16 LayerNorms (the streams' and the QK norms, each a layer_norm site: an addcmul modulate is not
# norm_modulate's form); each model's modulation linears of one silu(temb) in one grouped_gemv
EXPECTED = {
    "rms_dit": {"mean_square": 0, "gated_residual_norm_modulate": 1, "grouped_gemv": 1},
    "joint_dit": {"layer_norm": 16, "grouped_gemv": 1},
}


def _compile(name):
    torch._dynamo.reset()
    model, args = build_user_dit(name, torch.bfloat16)
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)
    with torch.no_grad():
        return model(*args), compiled(*args), report


@pytest.mark.parametrize("name", list(USER_DITS))
def test_user_dit_is_eager_bitwise_with_its_forms_found(name):
    ref, out, report = _compile(name)
    assert bitwise_equal(ref, out)
    assert not report.sites("rejected"), report.table()
    kept = collections.Counter(s.pattern for s in report.sites("kept"))
    assert {f: kept[f] for f in EXPECTED[name]} == EXPECTED[name], report.table()
    fused = collections.Counter(op.split(".")[0] for s in report.sites("kept") if s.pattern == "pointwise"
                                for op in s.before)
    left = collections.Counter(op for g in report.graphs for op in g.final_ops if classify(op) == "eager")
    if name == "rms_dit":
        # the norms' shared fp32 copy of x is folded into their tails (patterns/mean_square.py), and the complex
        # RoPE is grouped with the QK norms' tails
        assert not [op for op in left if "_to_copy" in op], left
        assert fused["view_as_complex"] == 4 and fused["mul"] > 0 and fused["mean"] == 12, fused
    else:
        # addcmul's modulates and gated residuals join the pointwise groups (one small lone residual stays eager)
        assert fused["addcmul"] >= 10, fused
        assert left["aten.addcmul.default"] <= 1, left
