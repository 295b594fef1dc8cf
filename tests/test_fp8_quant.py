"""FP8-static quantizers (patterns/quant_chain.py; families static_quant, cat_quant and the norm families' _quant
ops): tiny diffusers models with FP8StaticLinear compiled
lossless equal eager, and every quantizer in them is fused (alone, after the token cat, or into the norm
op that produces its input).

Expected sites, read off the ATen graphs of the tiny models with every eligible linear swapped
(diffusion_fuse.testing.fp8.quantize_linears_fp8):
Every model runs the ``x.float() / s`` form; tests with small modules check the ``* (1 / s)`` form too.
- flux: 30 linears. norm_modulate 4 (double-block norm1 + norm1_context, 3 quantizers each; the single
  block's norm, 4: proj_mlp, to_q/k/v; norm_out, 1), gated 2 (norm2 / norm2_context → ff, 1 each),
  cat_quant 1 (single block cat([attn, gelu(mlp)]) → proj_out), static_quant 16 (embedders, attention
  outputs, FF GELU → clone → quantizer, the AdaLN linears on silu(temb)).
- flux2: 25 linears. norm 4 + gated 2 + cat 1 (cat([attn, swiglu]) → to_out) + static 14.
- wan21: 14 linears. norm 2 (norm1 → 3 quantizers, norm3 → 1; Wan's FP32LayerNorm → bf16 → quantizers),
  gated 2 (the attention residual + norm2, no modulate → attn2's to_q; the FFN residual + norm_out →
  proj_out) + static 8.
"""

import pytest
import torch
from helpers import AdaLN, adaln_inputs, bitwise_equal, compile_and_run, full_only

import diffusion_fuse
from diffusion_fuse.testing.fp8 import FP8StaticLinear, quantize_linears_fp8
from diffusion_fuse.testing.tiny_models import build

N, G, Q, C = "norm_modulate", "gated_residual_norm_modulate", "static_quant", "cat_quant"
EXPECTED = {
    "flux": (30, {N: 4, G: 2, C: 1, Q: 16}),
    "flux2": (25, {N: 4, G: 2, C: 1, Q: 14}),
    "wan21": (14, {N: 2, G: 2, C: 0, Q: 8}),
}


def quantizers_fused(report) -> int:
    """Quantizers the kept sites took: one clamp each."""
    return sum(s.before.count("clamp") for s in report.sites() if s.status == "kept")


@pytest.mark.parametrize("name", [pytest.param(n, marks=full_only("FLUX.1's: the same quantizer forms")) if n == "flux2"
                                  else n for n in EXPECTED])
def test_fp8_models_equal_eager_and_every_quantizer_is_fused(name):
    model, kwargs = build(name, torch.bfloat16)
    swapped = quantize_linears_fp8(model, kwargs)
    n_linears, fams = EXPECTED[name]
    assert len(swapped) == n_linears
    ref, out, report = compile_and_run(model, kwargs)
    assert bitwise_equal(ref, out)
    assert {f: report.count(f) for f in fams} == fams, report.table()
    assert all(s.status == "kept" for s in report.sites()), report.table()
    assert quantizers_fused(report) == n_linears, report.table()
    # the norm sites became the ops with the quant epilogue, and the report names them
    norm = {s.id: s for s in report.sites() if s.pattern in (N, G)}
    assert {s.after for s in norm.values()} <= {"diffusion_fuse::norm_modulate_quant",
                                                 "diffusion_fuse::gated_residual_norm_modulate_quant"}
    assert "norm_modulate_quant" in report.table()
    # quantizers are named by the model line that called the linear, not by testing/fp8.py
    assert not any("testing/fp8.py" in s.id for s in report.sites())
    if name == "flux":  # norm sites keep the ids they have without FP8 (tests/test_models_lossless.py)
        assert set(norm) == {
            "norm_modulate@diffusers/models/normalization.py:169#0",
            "norm_modulate@diffusers/models/normalization.py:169#1",
            "gated_residual_norm_modulate@models/transformers/transformer_flux.py:476#0",
            "gated_residual_norm_modulate@models/transformers/transformer_flux.py:490#0",
            "norm_modulate@diffusers/models/normalization.py:201#0",
            "norm_modulate@diffusers/models/normalization.py:350#0",
        }
        # only quantizers read the modulated tensors: no bf16 output is written (the gated op returns r)
        for s in norm.values():
            outs = s.output_shapes[1:] if s.pattern == G else s.output_shapes
            assert outs and all(o.startswith("float8_e4m3fn") for o in outs), s.output_shapes


class QuantAfterAdaLN(torch.nn.Module):
    """AdaLN read by ``n`` FP8 linears and optionally by something else; optionally a mixed-form quantizer."""

    def __init__(self, n: int = 3, extra_reader: bool = False, reciprocal: str = "none", dim: int = 32) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.adaln = AdaLN(dim).to(torch.bfloat16)
        recip = [reciprocal == "all" or (reciprocal == "last" and i == n - 1) for i in range(n)]
        self.lins = torch.nn.ModuleList(
            FP8StaticLinear.from_linear(torch.nn.Linear(dim, 16).to(torch.bfloat16), 4.0 + i, reciprocal=recip[i])
            for i in range(n))
        self.extra_reader = extra_reader

    def forward(self, x, emb):
        h = self.adaln(x, emb)
        outs = [lin(h) for lin in self.lins]
        return (outs, h * 2) if self.extra_reader else outs


@pytest.mark.parametrize("n, extra_reader, reciprocal, quantizers_in_norm", [
    (3, False, "none", 3),
    (3, True, "none", 3),   # the bf16 output is written too (keep_out)
    (5, False, "none", 4),  # a kernel feeds at most 4; the 5th is fused alone
    (2, False, "all", 2),   # the `* (1 / s)` form
    (3, False, "last", 2),  # a `* (1 / s)` quantizer next to `/ s` ones is fused alone
])
def test_quantizers_join_the_norm_op(n, extra_reader, reciprocal, quantizers_in_norm):
    model = QuantAfterAdaLN(n, extra_reader, reciprocal)
    x, emb = (t.to(torch.bfloat16) for t in adaln_inputs())
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)
    with torch.no_grad():
        assert bitwise_equal(model(x, emb), compiled(x, emb))
    (norm,) = [s for s in report.sites() if s.pattern == N]
    assert norm.before.count("clamp") == quantizers_in_norm and norm.status == "kept"
    # the bf16 output is written when something other than the fused quantizers reads it
    assert norm.output_shapes[0].startswith("bfloat16") == (extra_reader or n > quantizers_in_norm)
    assert report.count(Q) == n - quantizers_in_norm
    assert quantizers_fused(report) == n


def test_disabling_static_quant_leaves_standalone_quantizers_as_aten():
    model, kwargs = build("flux", torch.bfloat16)
    quantize_linears_fp8(model, kwargs)
    # (family pointwise off too: it would fuse a quantizer's fp32 part, x.float() / s -> clamp)
    ref, out, report = compile_and_run(model, kwargs, {"patterns": {Q: False, C: False, "pointwise": False}})
    assert bitwise_equal(ref, out)
    assert report.count(Q) == report.count(C) == 0 and report.count(N) == 4
    assert quantizers_fused(report) == 11 + 2  # only those the norm sites take
