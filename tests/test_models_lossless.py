"""Acceptance: tiny diffusers models compiled with the lossless tier equal eager, every AdaLN site matched.

Expected counts are those of ``python -m diffusion_fuse census``; a LayerNorm whose
input is a gated residual ``residual + gate * x`` goes to family gated_residual_norm_modulate:
- flux: 2 AdaLayerNormZero (img/txt) + 2 norm2 modulates (gated) + 1 single-block + 1 norm_out = 6
- flux2: same places = 6
- wan21 / wan22_ti2v: norm1 (norm_modulate) and three residual sites: norm3 after the ungated cross-attention
  residual ``x + attn2(...)`` (a gate of ones), the attention residual
  ``(x.float() + attn * gate_msa).type_as(x)`` with norm2 (the cross-attention LayerNorm: weight and
  bias, no modulate; it was a near miss before the Wan residual form was covered) and the FFN
  residual with norm_out, which reads it after the last block. bf16 and fp32 alike (in fp32 the
  casts vanish). Every modulation vector is a slice of ``(table + temb.float()).chunk(6)`` (norm_out:
  ``chunk(2)``), which the sites read as table + temb: no table sum is left in the graph
  (test_wan_temb_table_is_folded_into_its_consumers).
- sana: norm1 + norm2 + norm_out = 3; in fp32 its modulation is an fp32 ``table + timestep``
  chunk, so the attention residual ``x + gate_msa * attn`` (normalized after the cross-attention
  residual, not directly) becomes a ``gated_residual`` site (the family takes table gates)
- qwen_image: img_norm1, txt_norm1, img_norm2 + norm_out = 4; the last block's txt_norm2 feeds
  only the (unused) text stream and is dead code in the graph
- plain_dit (a DiT in plain PyTorch): the first block's norm1 reads the patch embedding (norm_modulate); the other
  three block LayerNorms and the final one read a gated residual (4); its QK norms
  (``nn.RMSNorm``, composite on the CPU: pow → mean → rsqrt) at head dim 32 are summed inside their tails'
  pointwise kernels (patterns/mean_square.py ``tail_reads_rows``): no mean_square site
- sd35: 8 LayerNorms with 9 modulates: the dual-attention block's SD35AdaLayerNormZeroX
  normalizes once for two modulates (one site, two ops); 6 LayerNorms read a gated residual
  (norm2 and norm2_context of both blocks, and block 1's norm1/norm1_context)

Family ``pointwise`` (on by default) then groups what is left; its counts are its own
(``POINTWISE_SITES``) and change none of the above.
"""

import pytest
import torch
from helpers import bitwise_equal, compile_and_run

from diffusion_fuse.testing.tiny_models import MODEL_NAMES, build

N, G, R = "norm_modulate", "gated_residual_norm_modulate", "gated_residual"
EXPECTED_BY_FAMILY = {
    "flux": {N: 4, G: 2}, "flux2": {N: 4, G: 2}, "wan21": {N: 1, G: 3}, "wan22_ti2v": {N: 1, G: 3},
    "sana": {N: 2, G: 1}, "qwen_image": {N: 2, G: 2}, "sd35": {N: 2, G: 6}, "plain_dit": {N: 1, G: 4},
}
FP32_EXPECTED_BY_FAMILY = {**EXPECTED_BY_FAMILY, "sana": {N: 2, G: 1, R: 1}}
# the AdaLN families' sites (tier high too)
EXPECTED_SITES = {name: sum(c.values()) for name, c in EXPECTED_BY_FAMILY.items()}
# Family pointwise (fxpasses/pointwise.py): the groups of pointwise ops the other families left
# (timestep embeddings, silu of temb, the QK-RMSNorm tails with RoPE, gated residual adds,
# gelu + cat, casts); fp32 graphs have fewer (no casts to group). The same on every torch: eval-mode Dropout's
# clone (traced up to torch 2.13) is dropped before the pointwise pass groups.
P = "pointwise"
POINTWISE_SITES = {"flux": 15, "flux2": 17, "wan21": 9, "wan22_ti2v": 9, "sana": 11, "qwen_image": 9, "sd35": 20,
                   "plain_dit": 4}
FP32_POINTWISE_SITES = {"flux": 9, "flux2": 11, "wan21": 4, "wan22_ti2v": 4, "sana": 6, "qwen_image": 4, "sd35": 10,
                        "plain_dit": 4}
# Family linear_cat: the joint attention's value cat of the text and image projections
# (batch 1); SD3.5 cats [B, heads, S, D] along S, not contiguous rows
L = "linear_cat"
LINEAR_CAT_SITES = {"flux": 1, "flux2": 1, "qwen_image": 1}
# Family grouped_gemv: the modulation linears of silu(temb), bf16 / fp16 only (Wan and SANA modulate from one
# linear: no group)
GG = "grouped_gemv"
GROUPED_GEMV_SITES = {"flux": 1, "flux2": 1, "qwen_image": 1, "sd35": 1, "plain_dit": 1}
# Family mean_square: RMSNorm variances over rows its kernel takes and no tail's kernel does (the diffusers models'
# head dims of 16 are near misses; plain_dit's 32 go to the pointwise tails)
MS = "mean_square"
MEAN_SQUARE_SITES: dict[str, int] = {}
FAMILIES = (N, G, R, P, L, GG, MS)


def expected(name, dtype):
    """(sites per family, op calls per op) for one model and dtype."""
    fp32 = dtype == torch.float32
    fams = {**(FP32_EXPECTED_BY_FAMILY if fp32 else EXPECTED_BY_FAMILY)[name],
            P: (FP32_POINTWISE_SITES if fp32 else POINTWISE_SITES)[name], L: LINEAR_CAT_SITES.get(name, 0),
            GG: 0 if fp32 else GROUPED_GEMV_SITES.get(name, 0), MS: MEAN_SQUARE_SITES.get(name, 0)}
    # an SD3.5 AdaLayerNormZeroX site is two norm_modulate calls; a pointwise site is one call
    calls = {"norm_modulate": fams.get(N, 0) + (name == "sd35"), "gated_residual_norm_modulate": fams.get(G, 0),
             "gated_residual": fams.get(R, 0), "pointwise": fams[P], "linear_cat": fams[L], "grouped_gemv": fams[GG],
             "mean_square": fams[MS]}
    return fams, calls


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_lossless_equals_eager_and_matches_every_site(name, dtype):
    model, kwargs = build(name, dtype)
    ref, out, report = compile_and_run(model, kwargs)
    assert bitwise_equal(ref, out)
    fams, calls = expected(name, dtype)
    sites = report.sites()
    assert len(sites) == sum(fams.values()), report.table()
    assert {f: report.count(f) for f in FAMILIES} == {f: fams.get(f, 0) for f in FAMILIES}, report.table()
    assert sum(s.ops for s in sites) == sum(calls.values())
    assert all(s.status == "kept" for s in sites), report.table()
    assert "rms_norm_chain" not in report.graphs[0].families  # tier high only
    near = [m for g in report.graphs for m in g.near_misses]
    # what the tiny models hold that no kernel takes (head dims of 16) is a near miss with its reason
    assert all(m.pattern == "mean_square" and m.reason.startswith("last dim") for m in near), report.table()
    # On CPU every Triton op call takes the reference path, and says so (verifier check + fused run); linear_cat's
    # "kernel" is the ATen GEMM with out=, which runs on the CPU too
    assert report.counters()["fallback"] == {op: {"device is cpu": 2 * n} for op, n in calls.items()
                                             if n and op != "linear_cat"}
    assert report.counters()["kernel"] == ({"linear_cat": 2 * calls["linear_cat"]} if calls["linear_cat"] else {})
    # the runtime rewrites ran and were kept: the verified graph is the fast one
    for g in report.graphs:
        assert not any("runtime rewrites" in n for n in g.notes), g.notes
        assert all(v["python_bindings"] > 0 and v["end_to_end_equal"] for v in g.verifications), g.verifications


def test_wan_fp32_layernorm_cast_is_folded_into_the_site():
    model, kwargs = build("wan22_ti2v", torch.bfloat16)
    _, _, report = compile_and_run(model, kwargs)
    befores = [s.before for s in report.sites() if s.pattern == N]
    assert all(b[0] == "_to_copy" and b[-1] == "_to_copy" for b in befores), befores
