"""Family layer_norm: LayerNorms no modulate reads, each a site with eager's bits; the input and output casts of an
fp32-upcast LayerNorm are folded in; forms the kernel cannot take are near misses with the reason."""

import pytest
import torch
from helpers import bitwise_equal, compile_and_run

from diffusion_fuse.patterns.registry import example_tensor

L = "layer_norm"


class Norms(torch.nn.Module):
    def __init__(self, D: int = 64, affine: bool = True, fp32: bool = False) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(D, elementwise_affine=affine, eps=1e-6)
        self.fp32 = fp32
        if affine:
            with torch.no_grad():
                self.norm.weight.normal_()
                self.norm.bias.normal_()

    def forward(self, x):
        if self.fp32:  # FP32LayerNorm: the norm in fp32, the output back in x's dtype
            return torch.nn.functional.layer_norm(x.float(), self.norm.normalized_shape, self.norm.weight,
                                                  self.norm.bias, self.norm.eps).to(x.dtype)
        return self.norm(x)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_layer_norm_is_one_site(affine, dtype):
    model = Norms(affine=affine).to(dtype)
    ref, out, report = compile_and_run(model, dict(x=example_tensor(2, 8, 64, dtype=dtype)))
    assert bitwise_equal(ref, out)
    (site,) = report.sites()
    assert site.pattern == L and site.status == "kept" and site.before[:2] == ["native_layer_norm", "getitem"]


def test_an_fp32_layer_norm_folds_its_casts():
    model = Norms(fp32=True)  # fp32 parameters, bf16 activations
    ref, out, report = compile_and_run(model, dict(x=example_tensor(2, 8, 64)))
    assert bitwise_equal(ref, out)
    (site,) = report.sites()
    assert site.pattern == L and site.before[0] == "_to_copy" and site.before[-1] == "_to_copy", site.before


def test_a_modulated_layer_norm_stays_norm_modulates():
    def adaln(x, scale):
        return torch.nn.functional.layer_norm(x, (64,), eps=1e-6) * (1 + scale[:, None])

    ref, out, report = compile_and_run(adaln, dict(x=example_tensor(2, 8, 64), scale=example_tensor(2, 64, seed=1)))
    assert bitwise_equal(ref, out) and report.count("norm_modulate") == 1 and report.count(L) == 0
    assert not [m for g in report.graphs for m in g.near_misses if m.pattern == L]


class TransposedNorm(Norms):
    def forward(self, x):  # [B, S, H, D] → [B, H, S, D], as attention QK norms read their heads
        return self.norm(x.transpose(1, 2))


@pytest.mark.parametrize("model, shape", [(Norms(), (2, 3, 8, 64)), (Norms(), (2, 8, 3, 64)),
                                          (TransposedNorm(), (2, 3, 8, 64))])
def test_rows_of_a_rank_4_input_are_one_site(model, shape):
    model = model.to(torch.bfloat16)
    ref, out, report = compile_and_run(model, dict(x=example_tensor(*shape)))
    assert bitwise_equal(ref, out) and report.count(L) == 1, report.table()


class PermutedNorm(Norms):
    def forward(self, x):  # rows of four strided dims
        return self.norm(x.permute(3, 2, 1, 0, 4))


@pytest.mark.parametrize("model, shape, reason", [(Norms(D=62), (2, 8, 62), "D=62"),
                                                  (PermutedNorm(), (2, 3, 4, 5, 64), "more than three strided dims")])
def test_what_the_kernel_cannot_take_is_a_near_miss(model, shape, reason):
    model = model.to(torch.bfloat16)
    ref, out, report = compile_and_run(model, dict(x=example_tensor(*shape)))
    assert bitwise_equal(ref, out) and report.count(L) == 0
    assert any(m.pattern == L and reason in m.reason for g in report.graphs for m in g.near_misses), report.table()
