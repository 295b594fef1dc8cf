"""Family cat_quant: ``cat([a, b], -1)`` read by a static FP8 quantizer is one op; the cat is written only when
something else reads it."""

import pytest
import torch
from helpers import bitwise_equal, compile_and_run

from diffusion_fuse.testing.fp8 import FP8StaticLinear

C = "cat_quant"


class CatProj(torch.nn.Module):
    """FLUX single-block tail: cat([attn, gelu(mlp)], 2) → FP8 proj_out (+ another reader of the cat)."""

    def __init__(self, extra_reader: bool) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.proj = FP8StaticLinear.from_linear(torch.nn.Linear(48, 16).to(torch.bfloat16), 6.0)
        self.extra_reader = extra_reader

    def forward(self, attn, mlp):
        c = torch.cat([attn, torch.nn.functional.gelu(mlp, approximate="tanh")], dim=2)
        y = self.proj(c)
        return (y, c.sum(-1)) if self.extra_reader else y


@pytest.mark.parametrize("extra_reader", [False, True])
def test_cat_quant(extra_reader):
    model = CatProj(extra_reader)
    g = torch.Generator().manual_seed(0)
    attn = torch.randn(1, 2, 8, 16, generator=g).to(torch.bfloat16).permute(0, 2, 1, 3).reshape(1, 8, 32)
    mlp = torch.randn(1, 8, 16, generator=g).to(torch.bfloat16)
    ref, out, report = compile_and_run(model, dict(attn=attn, mlp=mlp))
    assert bitwise_equal(ref, out)
    (site,) = [s for s in report.sites() if s.pattern == C]
    assert site.status == "kept" and site.after == "diffusion_fuse::cat_quant"
    assert [o.split("[")[0] for o in site.output_shapes] == ["bfloat16"] * extra_reader + ["float8_e4m3fn"]
