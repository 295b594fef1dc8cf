"""Acceptance: tiny diffusers models compiled with the lossless tier equal eager, every AdaLN site matched.

Expected counts are those of tests/SITE_CENSUS.md (read off the ATen graphs):
- flux: 2 AdaLayerNormZero (img/txt) + 2 norm2 modulates + 1 single-block + 1 norm_out = 6
- flux2: same places = 6
- wan21 / wan22_ti2v: norm1 + norm3 + norm_out = 3; norm2 is the cross-attention LayerNorm
  with weight and bias and no modulate (reported as a near miss, correctly not a site)
- sana: norm1 + norm2 + norm_out = 3
- qwen_image: img_norm1, txt_norm1, img_norm2 + norm_out = 4; the last block's txt_norm2 feeds
  only the (unused) text stream and is dead code in the graph
- sd35: 8 LayerNorms with 9 modulates: the dual-attention block's SD35AdaLayerNormZeroX
  normalizes once for two modulates (one site, two ops)
"""

import pytest
import torch

from diffusion_fuse.testing.tiny_models import MODEL_NAMES, build
from helpers import bitwise_equal, compile_and_run

EXPECTED_SITES = {"flux": 6, "flux2": 6, "wan21": 3, "wan22_ti2v": 3, "sana": 3, "qwen_image": 4, "sd35": 8}
EXPECTED_OPS = {**EXPECTED_SITES, "sd35": 9}
PLAIN_LAYER_NORMS = {"wan21": 1, "wan22_ti2v": 1}  # near misses that are not AdaLN sites


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_lossless_equals_eager_and_matches_every_site(name, dtype):
    model, kwargs = build(name, dtype)
    ref, out, report = compile_and_run(model, kwargs)
    assert bitwise_equal(ref, out)
    sites = report.sites()
    assert len(sites) == EXPECTED_SITES[name], report.table()
    assert sum(s.ops for s in sites) == EXPECTED_OPS[name]
    assert all(s.status == "kept" for s in sites), report.table()
    near = [m for g in report.graphs for m in g.near_misses]
    assert len(near) == PLAIN_LAYER_NORMS.get(name, 0), report.table()
    # On CPU every op call takes the reference path, and says so (verifier check + fused run).
    assert report.counters()["fallback"]["ln_modulate"] == {"device is cpu": 2 * EXPECTED_OPS[name]}


def test_wan_fp32_layernorm_cast_is_folded_into_the_site():
    model, kwargs = build("wan22_ti2v", torch.bfloat16)
    _, _, report = compile_and_run(model, kwargs)
    befores = [s.before for s in report.sites()]
    assert all(b[0] == "_to_copy" and b[-1] == "_to_copy" for b in befores), befores
