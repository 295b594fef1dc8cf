"""Wan's chunked timestep table read by the fused ops on CUDA: bitwise equal to eager's module code.

The eager side is diffusers' own expressions (WanTransformerBlock.forward lines 469-502 and the output
norm of WanTransformer3DModel.forward, diffusers 0.42.1) run on CUDA: ``(table + temb.float()).chunk(6)``
and its consumers. Our side is the ops as the patterns emit them (views of the table and of temb, the
fp32 add inside the kernel), called through ``torch.ops`` so the guard and the kernel run; every call
must be a kernel hit. Forms: norm1 (LN + modulate), attention residual + norm2 (affine LN, no modulate),
norm3, FFN residual + norm_out (its 2-chunk table, temb broadcast along the chunks), FFN residual alone
(a block's end under compile_repeated_blocks). Layouts: Wan 2.1 temb [B,6,D] and Wan 2.2 TI2V per token
[B,S,6,D]. Shapes: D 64..5120, B 1/2, S 1..333, activations 1e-4/1/100, table sums exactly -1, 0, -0.0;
real: Wan2.2-5B 704p/121f per token [1, 27280, 6, 3072] and Wan2.1-14B 480p/81f [1, 32760, 5120] with a
[1, 6, 5120] temb. Compares ``.view(int16)``. Prints a summary; writes $OUT/table_slice_gpu.json when $OUT is set.
"""

from __future__ import annotations

import json
import os
import types

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import diffusion_fuse  # noqa: E402,F401  (registers the ops)
from diffusion_fuse.lowering import counters  # noqa: E402

ops = torch.ops.diffusion_fuse
EPS = 1e-6
BF16, F32 = torch.bfloat16, torch.float32
RESULTS: list[dict] = []


def make(B, S, D, per_token, amp=1.0, seed=0, special=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
    t = types.SimpleNamespace(per_token=per_token, D=D)
    t.table, t.out_table = rn(1, 6, D) / D**0.5, rn(1, 2, D) / D**0.5  # kept in fp32 (_keep_in_fp32_modules)
    t.temb = rn(*((B, S, 6, D) if per_token else (B, 6, D))).to(BF16)
    t.temb_out = rn(*((B, S, D) if per_token else (B, D))).to(BF16)
    if special:  # table + temb exactly -1, 0, -0.0 (and 1) in every chunk's first columns
        tab = torch.tensor([0.5, 0.25, -0.0, 0.5], device="cuda")
        tmb = torch.tensor([-1.5, -0.25, -0.0, 0.5], device="cuda", dtype=BF16)
        t.table[..., :4], t.out_table[..., :4] = tab, tab
        t.temb[..., :4], t.temb_out[..., :4] = tmb, tmb
    t.x, t.attn, t.cross, t.ff = ((rn(B, S, D) * amp).to(BF16) for _ in range(4))
    t.w2, t.b2 = 1 + 0.3 * rn(D), 0.1 * rn(D)  # norm2: affine FP32LayerNorm, fp32 parameters
    return t


def eager(t) -> dict:
    """diffusers' expressions, as eager runs them."""
    D = t.D
    if t.per_token:
        parts = [p.squeeze(2) for p in (t.table.unsqueeze(0) + t.temb.float()).chunk(6, dim=2)]
        shift_o, scale_o = [p.squeeze(2) for p in (t.out_table.unsqueeze(0) + t.temb_out.unsqueeze(2)).chunk(2, 2)]
    else:
        parts = (t.table + t.temb.float()).chunk(6, dim=1)
        shift_o, scale_o = (t.out_table + t.temb_out.unsqueeze(1)).chunk(2, dim=1)
    shift, scale, gate, c_shift, c_scale, c_gate = parts
    x = t.x
    n1 = (F.layer_norm(x.float(), (D,), None, None, EPS) * (1 + scale) + shift).type_as(x)
    h = (x.float() + t.attn * gate).type_as(x)
    n2 = F.layer_norm(h.float(), (D,), t.w2, t.b2, EPS).to(h.dtype)
    h2 = h + t.cross
    n3 = (F.layer_norm(h2.float(), (D,), None, None, EPS) * (1 + c_scale) + c_shift).type_as(h2)
    h3 = (h2.float() + t.ff.float() * c_gate).type_as(h2)
    out = (F.layer_norm(h3.float(), (D,), None, None, EPS) * (1 + scale_o) + shift_o).type_as(h3)
    return dict(n1=n1, h=h, n2=n2, n3=n3, h3=h3, out=out, h3_alone=h3)


def fused(t) -> dict:
    """The ops as patterns/table_slice.py emits them: table and temb rows, added in the kernel."""
    def row(u, j):  # chunk j of a table [1,n,D] / temb [B,n,D], or per token [1,1,n,D] / [B,S,n,D] (squeezed)
        return u.select(2, j) if t.per_token else u.narrow(1, j, 1)

    table = t.table.unsqueeze(0) if t.per_token else t.table
    (sh, sht), (sc, sct), (g, gt), (csh, csht), (csc, csct), (cg, cgt) = (
        (row(table, j), row(t.temb, j)) for j in range(6))
    out_table = t.out_table.unsqueeze(0) if t.per_token else t.out_table
    osh, osc = row(out_table, 0), row(out_table, 1)
    o_temb = t.temb_out if t.per_token else t.temb_out.unsqueeze(1)  # one temb row for both chunks
    x = t.x
    n1 = ops.norm_modulate(x, None, None, EPS, sc, sh, F32, BF16, sct, sht)
    h, n2 = ops.gated_residual_norm_modulate(x, t.attn, g, t.w2, t.b2, EPS, None, None, BF16, gt, None, None, BF16, F32)
    h2 = h + t.cross
    n3 = ops.norm_modulate(h2, None, None, EPS, csc, csh, F32, BF16, csct, csht)
    h3, out = ops.gated_residual_norm_modulate(h2, t.ff, cg, None, None, EPS, osc, osh, BF16, cgt, o_temb, o_temb,
                                             BF16, F32)
    h3_alone = ops.gated_residual(h2, t.ff, cg, cgt, BF16)
    return dict(n1=n1, h=h, n2=n2, n3=n3, h3=h3, out=out, h3_alone=h3_alone)


def check(B, S, D, per_token, amp=1.0, seed=0, special=False) -> dict[str, int]:
    """Mismatching elements per output; asserts every op call ran its kernel."""
    t = make(B, S, D, per_token, amp, seed, special)
    ref = eager(t)
    counters.reset()
    got = fused(t)
    ctr = counters.snapshot()
    assert ctr["fallback"] == {} and sum(ctr["kernel"].values()) == 5, ctr
    nd = {k: int((ref[k].view(torch.int16) != got[k].view(torch.int16)).sum()) for k in ref}
    assert all(ref[k].dtype == got[k].dtype == BF16 and ref[k].shape == got[k].shape for k in ref)
    RESULTS.append(dict(B=B, S=S, D=D, per_token=per_token, amp=amp, special=special, ndiff=nd))
    return {k: v for k, v in nd.items() if v}


@pytest.mark.parametrize("per_token", [False, True], ids=["b6d", "per_token"])
@pytest.mark.parametrize("D", [64, 1000, 3072, 5120])
def test_bit_exact_small(D, per_token):
    bad = []
    for B, S in ((1, 1), (2, 7), (1, 333)):
        for amp in (1e-4, 1.0, 100.0):
            for special in (False, True):
                nd = check(B, S, D, per_token, amp, seed=D + S, special=special)
                if nd:
                    bad.append((B, S, amp, special, nd))
    assert not bad, f"D={D} per_token={per_token}: (B, S, amp, special, ndiff per output) {bad[:4]}"


@pytest.mark.parametrize("B, S, D, per_token", [(1, 27280, 3072, True), (1, 32760, 5120, False)],
                         ids=["wan22_5b_704p_121f", "wan21_14b_480p_81f"])
def test_bit_exact_real_shapes(B, S, D, per_token):
    assert not check(B, S, D, per_token, seed=1)
    torch.cuda.empty_cache()


def test_tiny_wan_repeated_blocks_on_cuda():
    from diffusion_fuse.testing.tiny_models import build

    torch._dynamo.reset()
    model, kwargs = build("wan22_ti2v", BF16, "cuda")
    report = diffusion_fuse.Report()
    with torch.no_grad():
        ref = model(**kwargs)[0]
        model.compile_repeated_blocks(backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)
        out = model(**kwargs)[0]
    torch._dynamo.reset()
    assert torch.equal(ref.view(torch.int16), out.view(torch.int16))
    # per block graph (as tests/test_table_slice_pattern.py counts on the CPU): norm1; norm2 with the self-attention's
    # gated residual (fp32 round trip) and norm3 with the cross-attention's residual; the FFN's gated residual;
    # the 4 QK RMSNorms (family rms_norm) of the two attentions
    counts = {f: report.count(f) for f in ("norm_modulate", "gated_residual_norm_modulate", "gated_residual",
                                           "rms_norm")}
    assert counts == {"norm_modulate": 1, "gated_residual_norm_modulate": 2, "gated_residual": 1, "rms_norm": 4}, \
        report.table()
    assert report.count(status="kept") == len(report.sites()), report.table()
    assert report.counters()["kernel"].get("gated_residual", 0) > 0, report.table()


def teardown_module(module):
    bad = [r for r in RESULTS if any(r["ndiff"].values())]
    print(f"\nWan table + temb forms vs eager: {len(RESULTS)} cases, {len(bad)} with mismatches")
    for r in bad[:10]:
        print("  ", r)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "table_slice_gpu.json"), "w") as f:
            json.dump({"cases": RESULTS, "mismatching": bad}, f)
