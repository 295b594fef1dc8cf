"""Family rms_norm_rope: an RMSNorm whose output only diffusers' apply_rotary_emb reads is one op."""

from __future__ import annotations

import pytest
import torch
from test_rms_norm_pattern import _assert_compiled_equals_eager

R, RR = "rms_norm", "rms_norm_rope"


# ----------------------------------------------------------------------------------------
# rms_norm_rope: the norm feeding diffusers' apply_rotary_emb only
# ----------------------------------------------------------------------------------------


class NormRope(torch.nn.Module):
    """FLUX single-block q: RMSNorm over head_dim, then apply_rotary_emb along the sequence dim."""

    def __init__(self, D=32, affine=True, also_read_norm=False):
        super().__init__()
        self.norm = torch.nn.RMSNorm(D, eps=1e-6, elementwise_affine=affine)
        if affine:
            with torch.no_grad():
                self.norm.weight.normal_()
        self.also_read_norm = also_read_norm

    def forward(self, x, cos, sin):
        from diffusers.models.embeddings import apply_rotary_emb

        y = self.norm(x)
        out = apply_rotary_emb(y, (cos, sin), sequence_dim=1)
        return (out, y * 2) if self.also_read_norm else out


def _rope_inputs(dtype, B=2, S=7, H=3, D=32):
    g = torch.Generator().manual_seed(3)
    pos = torch.randn(S, D // 2, generator=g).double() * 20
    cos, sin = (f(pos).repeat_interleave(2, dim=1).float() for f in (torch.cos, torch.sin))
    return torch.randn(B, S, H, D, generator=g).to(dtype), cos, sin


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_norm_then_rope_is_one_site(fused_rms_norm_kernel_on_cpu, dtype, affine):
    model = NormRope(affine=affine).to(dtype)
    args = _rope_inputs(dtype)
    report = _assert_compiled_equals_eager(model, args)
    (site,) = report.sites()
    assert site.pattern == RR and site.status == "kept", report.table()
    casts = [] if dtype == torch.float32 else ["_to_copy"]
    assert site.before[:2] == ["_fused_rms_norm", "getitem"] and site.before.count("_to_copy") == 3 * len(casts)
    assert {"unbind.int", "neg", "stack", "add.Tensor"} <= set(site.before), site.before


def test_norm_read_elsewhere_stays_an_rms_norm_site(fused_rms_norm_kernel_on_cpu):
    model = NormRope(also_read_norm=True).to(torch.bfloat16)
    args = _rope_inputs(torch.bfloat16)
    report = _assert_compiled_equals_eager(model, args)
    assert report.count(RR) == 0 and report.count(R) == 1, report.table()
