"""GPU: the rms_norm kernel is bit-identical to eager's ``_fused_rms_norm``; rms_norm_chain is within tolerance.

Stages (module-scoped fixtures, each runs once; a table per stage; ``$OUT/rms_norm_gpu.json``):

1. variants: ``rms_norm_exact`` with PUSH_FMA on (``fma(v, v, s)``, the default) and off
   (``s + v*v``) against ``torch.ops.aten._fused_rms_norm`` — y and rstd bits — over D in
   {24, 64, 128, 1000, 3072, 5120} (row packing, masks, 1/6/10 trips), rows 1/7/many (up to
   30k for QK-norm sizes), amplitudes 1e-4/1/100 plus adversarial rows, eps 1e-6 and None,
   bf16 with and without weight. Decides PUSH_FMA: the default must be the exact one.
2. dtypes: the default variant, fp16/fp32, with weight.
3. the op ``diffusion_fuse::rms_norm`` through its dispatch (kernel hits counted) against its
   reference impl on CUDA, bitwise: FLUX QK norm [2, 4096, 24, 128], Wan across heads
   [1, 8192, 5120], SD3.5's transposed [B, H, S, Dh] view, modulate + fp32 cast, per-token
   scale slices; a misaligned x takes the reference path and is counted.
4. ``diffusion_fuse::rms_norm_chain`` against diffusers' RMSNorm / the composite rms_norm,
   within the verifier's default tolerance; the share of bitwise-equal elements is printed.
5. tiny FLUX and Wan compiled on CUDA: the graph holds ``_fused_rms_norm`` (not the chain),
   every rms_norm site is kept, the kernel ran; FLUX's single-block q/k norms are rms_norm_rope sites.
6. ``diffusion_fuse::rms_norm_rope`` against eager's ``torch.nn.RMSNorm`` then diffusers' own
   ``apply_rotary_emb`` (FLUX single block: [B, S, 24, 128], cos/sin [S, 128] fp32), bitwise: FLUX's
   4608 tokens and small shapes, amplitudes 1e-4/1/100, bf16/fp16/fp32, with and without weight.
7. ``diffusion_fuse::rms_norm_cat_rope`` against the double block's eager: two ``torch.nn.RMSNorm`` (text, image),
   ``torch.cat`` along the sequence, ``apply_rotary_emb``, bitwise (FLUX 512 + 4096 tokens and small shapes).
8. row groups per program (``kernels/rms_norm.py`` ``SMALL_D_ROW_GROUPS``): ``rms_norm_exact`` with 1, 2, 4 and 8
   groups against ``_fused_rms_norm``, y and rstd bits, D in {24, 64, 128, 256, 512}, row counts that leave a
   partial last program.
9. the lane epilogue (the default for D = 32, 64, 128) against eager and the row epilogue, y and rstd bits, at
   contiguous, 8-byte-offset and D + 4 row-stride layouts; prints the builds whose shuffle layouts were refused.

Run: ``python -m pytest -q -s tests/gpu/test_rms_norm_gpu.py``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

try:
    import diffusion_fuse
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import diffusion_fuse
from diffusion_fuse.kernels.rms_norm import rms_norm_exact  # noqa: E402
from diffusion_fuse.lowering import counters  # noqa: E402
from diffusion_fuse.lowering.rms_norm import rms_norm as rms_norm_reference  # noqa: E402
from diffusion_fuse.lowering.rms_norm_chain import rms_norm_chain as rms_norm_chain_reference  # noqa: E402
from diffusion_fuse.verify.compare import compare_close  # noqa: E402

DIMS = (24, 64, 128, 1000, 3072, 5120)
AMPS = (1e-4, 1.0, 100.0)
EPSS = (1e-6, None)
_DT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
RESULTS: dict = {}


def _bits(t):
    return t.contiguous().view(torch.int32 if t.element_size() == 4 else torch.int16)


def _ndiff(a, b) -> int:
    return int((_bits(a).reshape(-1) != _bits(b).reshape(-1)).sum())


def _rows(d: int) -> int:
    return 30000 if d <= 128 else 4096


def make_input(rows, d, amp, dtype, seed):
    """Rows of varied scale, plus adversarial rows: zeros, a lone outlier, small integers, -0.0."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, d, device="cuda", generator=g) * torch.exp(torch.randn(rows, 1, device="cuda", generator=g))
    if rows > 4:
        x[1] = 0.0  # sum of squares exactly 0: rstd = rsqrt(eps)
        x[2] = torch.arange(d, device="cuda", dtype=torch.float32) % 7 - 3
        x[3, :] = -0.0
        x[3, d // 2] = 1000.0
        x[4] = torch.logspace(-3, 2.5, d, device="cuda")[torch.randperm(d, device="cuda", generator=g)]
    if dtype == torch.float16:
        x = x.clamp(-500.0, 500.0)  # amp 100 stays finite in fp16
    x = (amp * x).to(dtype)
    assert torch.isfinite(x).all()
    return x


def make_weight(d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = 1 + 0.3 * torch.randn(d, device="cuda", generator=g)
    w[:5] = torch.tensor([-1.0, 0.0, 1.0, -0.0, 2.0])
    return w.to(dtype)


def _native_override() -> str:
    """Whether torch._native overrides _fused_rms_norm on CUDA (quack; torch >= 2.12 with cutlass-dsl)."""
    try:
        from torch._native import cutedsl_utils
    except ImportError:
        return "none (no torch._native)"
    try:
        return "quack override ACTIVE" if cutedsl_utils.runtime_available() else "none (cutlass-dsl not installed)"
    except Exception as e:  # noqa: BLE001 - informational only
        return f"unknown ({type(e).__name__})"


def _sweep(dtypes, variants, weights):
    table = {}
    for push_fma in variants:
        for dtype in dtypes:
            for with_w in weights:
                key = f"{_DT[dtype]} push_fma={push_fma} w={with_w}"
                bad_cases, cases, first = 0, 0, ""
                for d in DIMS:
                    w = make_weight(d, dtype, seed=d) if with_w else None
                    for amp in AMPS:
                        x_all = make_input(_rows(d), d, amp, dtype, seed=d + int(amp * 10))
                        for rows in (1, 7, _rows(d)):
                            x = x_all[:rows]
                            for eps in EPSS:
                                y_ref, r_ref = torch.ops.aten._fused_rms_norm(x, [d], w, eps)
                                y, r = rms_norm_exact(x, w, eps, push_fma=push_fma)
                                nd = (_ndiff(y, y_ref), _ndiff(r, r_ref.reshape(-1)))
                                cases += 1
                                if any(nd):
                                    bad_cases += 1
                                    first = first or f"D={d} rows={rows} amp={amp} eps={eps}: y/rstd diffs {nd}"
                table[key] = {"cases": cases, "bad_cases": bad_cases, "first": first}
    print("\n" + "\n".join(f"  {'EXACT' if v['bad_cases'] == 0 else 'no   '} {v['bad_cases']:4d}/{v['cases']:4d}  {k}"
                           + (f"   first: {v['first']}" if v["first"] else "") for k, v in table.items()))
    return table


@pytest.fixture(scope="module")
def variants():
    print(f"\n== stage 1: PUSH_FMA variants vs aten._fused_rms_norm (torch {torch.__version__}; "
          f"torch._native: {_native_override()})")
    # fp32 inputs: for bf16/fp16 every v*v is exact in fp32 (at most 22 significant bits), so
    # fma(v, v, s) and s + v*v give the same bits and cannot tell the variants apart (measured).
    RESULTS["variants"] = _sweep((torch.float32,), (True, False), (False, True))
    return RESULTS["variants"]


def test_default_variant_is_bit_exact(variants):
    bad = {k: v for k, v in variants.items() if "push_fma=True" in k and v["bad_cases"]}
    exact = [k for k, v in variants.items() if v["bad_cases"] == 0]
    assert not bad, f"default PUSH_FMA not exact: {bad}; exact: {exact}"


def test_the_variants_are_told_apart(variants):
    # the sweep can tell fma(v, v, s) from s + v*v: the other variant misses somewhere
    assert any(v["bad_cases"] for k, v in variants.items() if "push_fma=False" in k), variants


def test_bf16_fp16_are_bit_exact(variants):
    print("\n== stage 2: default variant, bf16/fp16, with weight")
    table = _sweep((torch.bfloat16, torch.float16), (True,), (True,))
    RESULTS["dtypes"] = table
    assert all(v["bad_cases"] == 0 for v in table.values()), table


# ----------------------------------------------------------------------------------------
# stage 3: the op through its dispatch
# ----------------------------------------------------------------------------------------


def _op_cases():
    g = torch.Generator(device="cuda").manual_seed(3)

    def rn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    table = rn(2, 4096, 6, 3072)  # Wan2.2-style per-token modulation, sliced per chunk
    return {
        "flux_qk_norm": (rn(2, 4096, 24, 128), rn(128), 1e-6, None, None, None),
        "wan_across_heads": (rn(1, 8192, 5120), rn(5120), 1e-6, None, None, None),
        "sd35_transposed": (rn(2, 1024, 24, 64).transpose(1, 2), rn(64), 1e-6, None, None, None),
        "eps_none_fp32": (rn(3000, 1000, dtype=torch.float32), None, None, None, None, None),
        "modulate_cast_fp32": (rn(2, 4096, 3072), None, 1e-6, rn(2, 1, 3072), rn(2, 1, 3072), torch.float32),
        "modulate_per_token": (rn(2, 4096, 3072), rn(3072), 1e-6, table[:, :, 1], table[:, :, 0], None),
        "misaligned": (rn(4096 * 128 + 1)[1:].view(32, 128, 128), rn(128), 1e-6, None, None, None),
        # mean of squares subnormal with eps 0: eager's rsqrtf keeps it (finite rstd), rsqrt.approx.ftz would not
        "zero_eps_subnormal_ms": (rn(64, 24, 128) * 1e-20, rn(128), 0.0, None, None, None),
    }


@pytest.fixture(scope="module")
def op_results():
    res = {}
    for name, args in _op_cases().items():
        counters.reset()
        out = torch.ops.diffusion_fuse.rms_norm(*args)
        snap = counters.snapshot()
        ref = rms_norm_reference(*args)
        res[name] = {"diffs": _ndiff(out, ref), "numel": ref.numel(), "kernel": snap["kernel"].get("rms_norm", 0),
                     "fallback": snap["fallback"].get("rms_norm", {}), "layout": out.stride() == ref.stride()}
    print("\n== stage 3: diffusion_fuse::rms_norm vs its reference on CUDA")
    for k, v in res.items():
        print(f"  {k:22s} diffs {v['diffs']}/{v['numel']}  kernel {v['kernel']}  fallback {v['fallback']}")
    RESULTS["op"] = res
    return res


@pytest.mark.parametrize("name", ["flux_qk_norm", "wan_across_heads", "sd35_transposed", "eps_none_fp32",
                                  "modulate_cast_fp32", "modulate_per_token", "zero_eps_subnormal_ms"])
def test_op_kernel_is_bit_exact(op_results, name):
    r = op_results[name]
    assert r["kernel"] == 1 and r["diffs"] == 0 and r["layout"], r


def test_misaligned_x_takes_the_reference_path(op_results):
    r = op_results["misaligned"]
    assert r["kernel"] == 0 and r["diffs"] == 0
    assert list(r["fallback"]) == ["x is not 8-byte aligned (eager takes its non-vectorized RMSNorm)"]


# ----------------------------------------------------------------------------------------
# stage 4: rms_norm_chain (tier high) against eager's chain
# ----------------------------------------------------------------------------------------


def test_chain_is_within_tolerance():
    from diffusers.models.normalization import RMSNorm

    g = torch.Generator(device="cuda").manual_seed(4)
    res = {}
    forms = (  # name, D, x dtype, weight dtype, affine, modulate
        ("diffusers_bf16_qk", 128, torch.bfloat16, torch.bfloat16, True, False),
        ("diffusers_fp32", 3072, torch.float32, torch.float32, True, False),
        ("diffusers_no_weight_modulate", 3072, torch.bfloat16, None, False, True),
        ("composite_fp32_weight", 5120, torch.bfloat16, torch.float32, True, False),
    )
    for name, D, dtype, pdtype, affine, mod in forms:
        x = torch.randn(4, 2048, D, device="cuda", generator=g).to(dtype)
        sc, sh = (torch.randn(4, 1, D, device="cuda", generator=g).to(dtype) for _ in range(2))
        if name.startswith("composite"):  # weight dtype != x dtype: PyTorch runs rms_norm_composite
            w = torch.randn(D, device="cuda", generator=g).to(pdtype)
            ref = torch.nn.functional.rms_norm(x, [D], w, 1e-6)
            args = (x, 1e-6, None, w, None, torch.bfloat16, None, None, None)
        else:
            m = RMSNorm(D, eps=1e-6, elementwise_affine=affine).to("cuda")
            if affine:
                with torch.no_grad():
                    m.weight.normal_(generator=g)
                m.to(pdtype)
            ref = m(x) * (1 + sc) + sh if mod else m(x)
            cast1 = pdtype if pdtype in (torch.bfloat16, torch.float16) else (None if affine else dtype)
            args = (x, 1e-6, cast1, m.weight if affine else None, None, None, sc if mod else None,
                    sh if mod else None, None)
        counters.reset()
        out = torch.ops.diffusion_fuse.rms_norm_chain(*args)
        kernel = counters.snapshot()["kernel"].get("rms_norm_chain", 0)
        v = compare_close(ref, out, 2e-2, 1e-3)
        same = 1 - _ndiff(ref, out) / ref.numel()
        res[name] = {"ok": bool(v), "detail": v.detail, "max_abs_err": v.max_abs_err, "bitwise_equal_share": same,
                     "kernel": kernel, "reference_equal": _ndiff(rms_norm_chain_reference(*args), ref) == 0}
    print("\n== stage 4: diffusion_fuse::rms_norm_chain vs eager (tolerance; share of equal elements)")
    for k, v in res.items():
        print(f"  {k:30s} ok={v['ok']} max|err|={v['max_abs_err']:.3g} equal={v['bitwise_equal_share']:.4f} "
              f"kernel={v['kernel']} reference==eager: {v['reference_equal']}")
    RESULTS["chain"] = res
    assert all(v["ok"] and v["kernel"] == 1 and v["reference_equal"] for v in res.values()), res


# ----------------------------------------------------------------------------------------
# stage 5: tiny models on CUDA
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, sites", [("flux", {"rms_norm": 0, "rms_norm_rope": 2, "rms_norm_cat_rope": 2}),
                                         ("wan21", {"rms_norm": 4, "rms_norm_rope": 0, "rms_norm_cat_rope": 0})])
def test_tiny_model_qk_norms_are_kept_with_the_kernel(name, sites):
    from diffusion_fuse.testing.tiny_models import build

    torch._dynamo.reset()
    model, kwargs = build(name, torch.bfloat16, "cuda")
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)
    with torch.no_grad():
        ref = model(**kwargs)[0]
        out = compiled(**kwargs)[0]
    kept = report.sites("kept")
    fams = ("rms_norm", "rms_norm_rope", "rms_norm_cat_rope")
    kernels = report.counters()["kernel"]
    res = {"equal": _ndiff(ref, out) == 0, "sites": {f: report.count(f) for f in fams},
           "kept": {f: sum(s.pattern == f for s in kept) for f in fams}, "kernel": {f: kernels.get(f, 0) for f in fams},
           "statuses": sorted({s.status for s in report.sites()})}
    RESULTS.setdefault("models", {})[name] = res
    print(f"\n== stage 5: tiny {name} bf16 on CUDA: {res}")
    assert res["equal"] and res["sites"] == sites and res["kept"] == sites, report.table()
    assert all(res["kernel"][f] > 0 for f in fams if sites[f]), res


# ----------------------------------------------------------------------------------------
# stage 6: rms_norm_rope against torch.nn.RMSNorm + diffusers' apply_rotary_emb
# ----------------------------------------------------------------------------------------


def _rope_eager(norm, x, cos, sin):
    from diffusers.models.embeddings import apply_rotary_emb

    return apply_rotary_emb(norm(x), (cos, sin), sequence_dim=1)


def _rope_tables(S, D):
    """cos/sin [S, D] fp32, pairs repeated along D, from random fp64 angles as FLUX's position table."""
    g = torch.Generator(device="cuda").manual_seed(S)
    pos = torch.randn(S, D // 2, device="cuda", generator=g).double() * 50
    return pos.cos().repeat_interleave(2, dim=1).float(), pos.sin().repeat_interleave(2, dim=1).float()


def _record(res, key, ref, out, op):
    res[key] = {"ndiff": _ndiff(ref, out), "kernel": counters.snapshot()["kernel"].get(op, 0),
                "layout": out.stride() == ref.stride() and out.dtype == ref.dtype}


def _report(res, name, title):
    print(f"\n== {title} (differing elements)")
    for k, v in res.items():
        print(f"  {k:42s} {v}")
    RESULTS[name] = res
    return res


@pytest.fixture(scope="module")
def rope_results():
    res = {}
    seed = 0
    for (B, S, H, D) in ((1, 4608, 24, 128), (2, 77, 24, 128), (1, 333, 4, 64), (1, 5, 2, 256)):
        cos, sin = _rope_tables(S, D)
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for amp in AMPS:
                for affine in (True, False):
                    if (dtype != torch.bfloat16 or not affine) and S == 4608 and amp != 1.0:
                        continue  # the large shape: every amplitude in the model's form, the rest at amp 1
                    seed += 1
                    norm = torch.nn.RMSNorm(D, eps=1e-6, elementwise_affine=affine, device="cuda", dtype=dtype)
                    if affine:
                        with torch.no_grad():
                            norm.weight.copy_(make_weight(D, dtype, seed))
                    x = make_input(B * S * H, D, amp, dtype, seed).view(B, S, H, D)
                    with torch.no_grad():
                        ref = _rope_eager(norm, x, cos, sin)
                        counters.reset()
                        out = torch.ops.diffusion_fuse.rms_norm_rope(
                            x, norm.weight if affine else None, 1e-6, cos[None, :, None, :], sin[None, :, None, :])
                    _record(res, f"[{B},{S},{H},{D}] {_DT[dtype]} amp={amp:g} w={affine}", ref, out,
                            "rms_norm_rope")
    return _report(res, "rope", "stage 6: diffusion_fuse::rms_norm_rope vs RMSNorm + apply_rotary_emb")


def test_rms_norm_rope_is_bit_exact_with_norm_then_apply_rotary_emb(rope_results):
    bad = {k: v for k, v in rope_results.items() if v["ndiff"] or v["kernel"] != 1 or not v["layout"]}
    assert not bad, bad
    assert len(rope_results) >= 30


def teardown_module(module):
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "rms_norm_gpu.json").write_text(json.dumps(
            {"torch": torch.__version__, "native_override": _native_override(), **RESULTS}, indent=1, default=str))



# ----------------------------------------------------------------------------------------
# stage 7: rms_norm_cat_rope against two RMSNorms + cat + diffusers' apply_rotary_emb
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cat_rope_results():
    from diffusers.models.embeddings import apply_rotary_emb

    res = {}
    seed = 1000
    for (B, S_txt, S_img, H, D) in ((1, 512, 4096, 24, 128), (2, 7, 77, 4, 64), (1, 3, 5, 2, 256)):
        S = S_txt + S_img
        cos, sin = _rope_tables(S, D)
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for amp in AMPS:
                if S == 4608 and (dtype != torch.bfloat16) and amp != 1.0:
                    continue
                seed += 1
                norms = []
                for k, eps in enumerate((1e-6, 1e-5)):
                    n = torch.nn.RMSNorm(D, eps=eps, device="cuda", dtype=dtype)
                    with torch.no_grad():
                        n.weight.copy_(make_weight(D, dtype, seed + k))
                    norms.append(n)
                x_txt = make_input(B * S_txt * H, D, amp, dtype, seed).view(B, S_txt, H, D)
                x_img = make_input(B * S_img * H, D, amp, dtype, seed + 7).view(B, S_img, H, D)
                with torch.no_grad():
                    ref = apply_rotary_emb(torch.cat([norms[0](x_txt), norms[1](x_img)], dim=1), (cos, sin),
                                           sequence_dim=1)
                    counters.reset()
                    out = torch.ops.diffusion_fuse.rms_norm_cat_rope(
                        x_txt, norms[0].weight, 1e-6, x_img, norms[1].weight, 1e-5, 1, cos[None, :, None, :],
                        sin[None, :, None, :])
                _record(res, f"[{B},{S_txt}+{S_img},{H},{D}] {_DT[dtype]} amp={amp:g}", ref, out, "rms_norm_cat_rope")
    return _report(res, "cat_rope",
                   "stage 7: diffusion_fuse::rms_norm_cat_rope vs 2 RMSNorm + cat + apply_rotary_emb")


def test_rms_norm_cat_rope_is_bit_exact_with_norms_cat_then_apply_rotary_emb(cat_rope_results):
    bad = {k: v for k, v in cat_rope_results.items() if v["ndiff"] or v["kernel"] != 1 or not v["layout"]}
    assert not bad, bad
    assert len(cat_rope_results) >= 20


# ----------------------------------------------------------------------------------------
# stage 8: every row-group count per program gives eager's bits
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def row_group_results():
    res = {}
    for d in (24, 64, 128, 256, 512):
        w = make_weight(d, torch.bfloat16, seed=d)
        for amp in (1.0, 100.0):
            x_all = make_input(4608 * 3 + 5, d, amp, torch.bfloat16, seed=d + int(amp))
            for rows in (1, 13, x_all.shape[0]):
                x = x_all[:rows]
                y_ref, r_ref = torch.ops.aten._fused_rms_norm(x, [d], w, 1e-6)
                for groups in (1, 2, 4, 8):
                    y, r = rms_norm_exact(x, w, 1e-6, groups=groups)
                    res[f"D={d} amp={amp:g} rows={rows} groups={groups}"] = {
                        "ndiff": _ndiff(y, y_ref) + _ndiff(r, r_ref.reshape(-1))}
    bad = {k: v for k, v in res.items() if v["ndiff"]}
    print(f"\n== stage 8: row groups per program vs aten._fused_rms_norm: {len(res) - len(bad)}/{len(res)} exact")
    RESULTS["row_groups"] = res
    return res


def test_every_row_group_count_is_bit_exact(row_group_results):
    bad = {k: v for k, v in row_group_results.items() if v["ndiff"]}
    assert not bad, bad
    assert len(row_group_results) == 5 * 2 * 3 * 4


# ----------------------------------------------------------------------------------------
# stage 9: the lane epilogue (kernels/rms_norm.py _rms_lane_epilogue) against eager and the row epilogue,
# at aligned and misaligned layouts (x 8 bytes off, rows D + 4 apart): each plan checks its build's shuffle
# layouts on first use and runs the row epilogue where they are not the lanes' (LANE_EPILOGUE_REJECTED)
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lane_results():
    from diffusion_fuse.kernels import rms_norm as rk

    res = {}
    rejected_before = len(rk.LANE_EPILOGUE_REJECTED)
    for d in (32, 64, 128):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            w = make_weight(d, dtype, seed=d)
            for amp in (1.0, 100.0):
                rows = 4608 * 3 + 5
                base = make_input(rows + 2, d + 4, amp, dtype, seed=d + int(amp)).reshape(-1)
                layouts = {"contiguous": base[: rows * d].view(rows, d),
                           "offset_8B": base[8 // base.element_size():][: rows * d].view(rows, d),
                           "stride_D+4": base[: rows * (d + 4)].view(rows, d + 4)[:, :d]}
                for name, x in layouts.items():
                    # eager's vectorized kernel on an aligned copy: the order the kernel reproduces (a misaligned
                    # fp32 x takes eager's generic kernel, which the op's guard sends to the reference path)
                    y_ref, r_ref = torch.ops.aten._fused_rms_norm(x.clone(memory_format=torch.contiguous_format),
                                                                  [d], w, 1e-6)
                    y0, r0 = rms_norm_exact(x, w, 1e-6, lane_epilogue=False)
                    y1, r1 = rms_norm_exact(x, w, 1e-6, lane_epilogue=True)
                    res[f"D={d} {_DT[dtype]} amp={amp:g} {name}"] = {
                        "ndiff_eager": _ndiff(y1, y_ref) + _ndiff(r1, r_ref.reshape(-1)),
                        "ndiff_rows": _ndiff(y1, y0) + _ndiff(r1, r0)}
    res["rejected"] = rk.LANE_EPILOGUE_REJECTED[rejected_before:]
    print(f"\n== stage 9: lane epilogue vs eager and the row epilogue; builds not taken: {res['rejected']}")
    RESULTS["lanes"] = res
    return res


def test_the_lane_epilogue_is_bit_exact_at_every_layout(lane_results):
    bad = {k: v for k, v in lane_results.items() if k != "rejected" and (v["ndiff_eager"] or v["ndiff_rows"])}
    assert not bad, bad
    assert len(lane_results) == 3 * 3 * 2 * 3 + 1
