"""Family gated_residual_norm_modulate: its residual forms, the ungated one (``residual + linear(a)``) included."""

import pytest
import torch
from helpers import bitwise_equal, compile_and_run

from diffusion_fuse.patterns.registry import example_tensor

F = "gated_residual_norm_modulate"


class CrossAttentionResidual(torch.nn.Module):
    """Wan's cross-attention residual, ungated, and the fp32 LayerNorm + modulate that reads it (norm3)."""

    def __init__(self, dim: int = 64, operand: str = "linear", modulate: bool = True) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim, eps=1e-6)
        self.operand, self.modulate = operand, modulate

    def forward(self, h, a, scale, shift):
        if self.operand == "linear":
            h = h + self.proj(a)
        elif self.operand == "linear_first":
            h = self.proj(a) + h
        elif self.operand == "pointwise":  # tanh(a) fuses into the pointwise kernel that adds it
            h = h + torch.tanh(a)
        else:  # "broadcast": a [1, S, D] residual
            h = h[:1] + self.proj(a)
        n = self.norm(h.float())
        return h, ((n * (1 + scale) + shift) if self.modulate else n).type_as(h)


def inputs(dtype=torch.bfloat16, batch=2):
    return dict(h=example_tensor(batch, 8, 64, dtype=dtype), a=example_tensor(batch, 8, 64, dtype=dtype, seed=1),
                scale=example_tensor(batch, 1, 64, dtype=torch.float32, seed=2),
                shift=example_tensor(batch, 1, 64, dtype=torch.float32, seed=3))


def model(dtype, **kw):
    m = CrossAttentionResidual(**kw).eval().to(dtype)
    m.norm.float()  # FP32LayerNorm's parameters
    return m


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("operand", ["linear", "linear_first"])
def test_an_ungated_residual_of_a_linear_is_one_site_with_a_unit_gate(dtype, operand):
    ref, out, report = compile_and_run(model(dtype, operand=operand), inputs(dtype))
    assert bitwise_equal(ref, out)
    (site,) = [s for s in report.sites() if s.pattern == F]
    assert site.status == "kept", report.table()
    code = report.graphs[0].final_code
    assert "aten.full.default([1, 1, 64], 1.0" in code and "aten.add.Tensor" not in code, code


def test_an_ungated_residual_read_by_a_plain_layer_norm_is_a_site_too():
    ref, out, report = compile_and_run(model(torch.bfloat16, modulate=False), inputs())
    assert bitwise_equal(ref, out) and report.count(F) == 1, report.table()


@pytest.mark.parametrize("operand", ["pointwise", "broadcast"])
def test_other_ungated_adds_are_left_to_the_other_families(operand):
    # an addend the pointwise pass computes where it adds, or a residual that broadcasts, is no unit-gated residual
    ref, out, report = compile_and_run(model(torch.bfloat16, operand=operand), inputs())
    assert bitwise_equal(ref, out) and report.count(F) == 0, report.table()


def test_the_gated_form_is_one_site():
    def block_end(residual, x, gate, scale, shift):
        r = residual + gate[:, None] * x
        ln = torch.nn.functional.layer_norm(r, (r.shape[-1],), eps=1e-6)
        return r, ln * (1 + scale[:, None]) + shift[:, None]

    class BlockEnd(torch.nn.Module):
        def forward(self, **kw):
            return block_end(**kw)

    kw = dict(residual=example_tensor(2, 8, 64), x=example_tensor(2, 8, 64, seed=1), gate=example_tensor(2, 64, seed=2),
              scale=example_tensor(2, 64, seed=3), shift=example_tensor(2, 64, seed=4))
    ref, out, report = compile_and_run(BlockEnd(), kw)
    assert bitwise_equal(ref, out) and report.count(F) == 1
    assert "aten.full" not in report.graphs[0].final_code


def test_blocks_share_one_unit_gate():
    class TwoBlocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([model(torch.bfloat16), model(torch.bfloat16)])

        def forward(self, h, a, scale, shift):
            outs = []
            for b in self.blocks:
                h, n = b(h, a, scale, shift)
                outs.append(n)
            return h, *outs

    ref, out, report = compile_and_run(TwoBlocks(), inputs())
    assert bitwise_equal(ref, out) and report.count(F) == 2, report.table()
    assert report.graphs[0].final_code.count("aten.full.default") == 1  # common_subexpressions
