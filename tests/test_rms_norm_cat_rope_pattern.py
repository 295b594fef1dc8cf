"""Family rms_norm_cat_rope: two RMSNorms concatenated along a row dim, then the RoPE, as one op."""

from __future__ import annotations

import pytest
import torch
from test_rms_norm_pattern import _assert_compiled_equals_eager
from test_rms_norm_rope_pattern import _rope_inputs

R, RCR = "rms_norm", "rms_norm_cat_rope"


class NormCatRope(torch.nn.Module):
    """FLUX double-block q: text and image RMSNorms, cat along the sequence, then apply_rotary_emb."""

    def __init__(self, D=32, read_text_norm=False):
        super().__init__()
        self.norm_img = torch.nn.RMSNorm(D, eps=1e-6)
        self.norm_txt = torch.nn.RMSNorm(D, eps=1e-5)
        with torch.no_grad():
            self.norm_img.weight.normal_()
            self.norm_txt.weight.normal_()
        self.read_text_norm = read_text_norm

    def forward(self, x_img, x_txt, cos, sin):
        from diffusers.models.embeddings import apply_rotary_emb

        t = self.norm_txt(x_txt)
        q = torch.cat([t, self.norm_img(x_img)], dim=1)
        out = apply_rotary_emb(q, (cos, sin), sequence_dim=1)
        return (out, t + 1) if self.read_text_norm else out


def _cat_rope_inputs(dtype, S_img=7, S_txt=3):
    x, cos, sin = _rope_inputs(dtype, S=S_img + S_txt)
    return x[:, :S_img].contiguous(), x[:, S_img:].contiguous(), cos, sin


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_norms_cat_then_rope_is_one_site(fused_rms_norm_kernel_on_cpu, dtype):
    report = _assert_compiled_equals_eager(NormCatRope().to(dtype), _cat_rope_inputs(dtype))
    (site,) = report.sites()
    assert site.pattern == RCR and site.status == "kept", report.table()
    assert site.before.count("_fused_rms_norm") == 2 and "cat" in site.before


def test_cat_of_a_norm_read_elsewhere_is_not_one_site(fused_rms_norm_kernel_on_cpu):
    report = _assert_compiled_equals_eager(NormCatRope(read_text_norm=True).to(torch.bfloat16),
                                           _cat_rope_inputs(torch.bfloat16))
    assert report.count(RCR) == 0 and report.count(R) == 2, report.table()
