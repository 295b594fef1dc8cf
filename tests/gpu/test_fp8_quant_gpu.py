"""FP8 static quantization on CUDA: every quant kernel bitwise equal (uint8 views) to eager's ATen chain.

Checks (printed, and written to $OUT/fp8_quant_gpu.json when $OUT is set):
- that eager divides by a one-element CUDA scale as ``div_rn`` does, and whether eager's e4m3 cast keeps a
  NaN's sign (``eager_nan_keeps_sign``);
- every bf16 and fp16 bit pattern (NaN, Inf, subnormals, ties) through ``static_quant`` for
  scales 1e-3..1e1, both the ``/ s`` and ``* (1 / s)`` forms;
- the norm-issue matrix (D in {64, 1000, 1536, 2240, 3072, 5120, 6144}, rows 1/7/4096, amplitudes
  1e-4/1/100) for ``static_quant``, ``norm_modulate_quant`` (FLUX bf16 and Wan fp32-LN forms, 1/3/4
  quantizers, bf16 output kept or not), ``gated_residual_norm_modulate_quant`` and ``cat_quant``
  (FLUX 3072 + 12288, FLUX.2 6144 + 18432 widths, attention read through its permuted layout);
- tiny FLUX / FLUX.2 with FP8StaticLinear compiled lossless: output equal, kernels hit, all kept.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("needs CUDA with FP8 (sm_89+)", allow_module_level=True)

import diffusion_fuse  # noqa: E402
from diffusion_fuse.kernels.fp8_quant import eager_nan_keeps_sign  # noqa: E402
from diffusion_fuse.lowering import cat_quant as CQ  # noqa: E402
from diffusion_fuse.lowering import static_quant as SQ  # noqa: E402
from diffusion_fuse.lowering.fp8 import FP8  # noqa: E402
from diffusion_fuse.lowering.gated_residual_norm_modulate import QUANT_SPEC as GATED_QUANT  # noqa: E402
from diffusion_fuse.lowering.norm_modulate import QUANT_SPEC as NORM_QUANT  # noqa: E402

DIMS = (64, 1000, 1536, 2240, 3072, 5120, 6144)
ROWS = ((1, 1), (1, 7), (1, 4096))
AMPS = (1e-4, 1.0, 100.0)
SCALES = (1e-3, 3.7e-3, 0.02, 0.13, 1.0, 2.9, 10.0)
SUMMARY: dict = {}


def _u8(t):
    return t.view(torch.uint8) if t.dtype == FP8 else t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def ndiff(ref, got) -> int:
    ref, got = (ref if isinstance(ref, (list, tuple)) else [ref]), (got if isinstance(got, (list, tuple)) else [got])
    assert len(ref) == len(got)
    return sum(int((_u8(a) != _u8(b)).sum()) for a, b in zip(ref, got))


def scale_tensor(v, q_mode):
    s = torch.tensor(v, device="cuda", dtype=torch.float32)
    return s if q_mode == "div" else 1 / s  # the `* (1 / s)` form multiplies by a reciprocal computed on the GPU


def test_eager_divides_as_div_rn_and_its_nan_sign_is_read():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(4096, 1024, device="cuda", generator=g) * 50).bfloat16()
    found = sum(ndiff(SQ.static_quant(x, scale_tensor(v, "div"), "div", -448.0, 448.0),
                      SQ.SPEC.run_kernel(x, scale_tensor(v, "div"), "div", -448.0, 448.0)) for v in SCALES)
    SUMMARY["division"] = {"div_rn": found}
    SUMMARY["eager_nan_keeps_sign"] = eager_nan_keeps_sign(torch.device("cuda"))
    SUMMARY["torch"], SUMMARY["cuda"] = torch.__version__, torch.version.cuda
    assert found == 0, f"eager's division is not div_rn: {SUMMARY['division']}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("q_mode", ["div", "mul"])
def test_every_bit_pattern(dtype, q_mode):
    x = torch.arange(-(2 ** 15), 2 ** 15, device="cuda", dtype=torch.int32).to(torch.int16).view(dtype)
    x = x.reshape(64, 1024)
    bad = {v: ndiff(SQ.static_quant(x, scale_tensor(v, q_mode), q_mode, -448.0, 448.0),
                    SQ.SPEC.run_kernel(x, scale_tensor(v, q_mode), q_mode, -448.0, 448.0)) for v in SCALES}
    SUMMARY.setdefault("every_bit_pattern", {})[f"{dtype}-{q_mode}"] = bad
    assert not any(bad.values()), bad


def _rows(B, S, D, dtype, amp, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(B, S, D, device="cuda", generator=g) * amp
    x += amp * torch.randn(B, S, 1, device="cuda", generator=g)
    return x.to(dtype), g


@pytest.mark.parametrize("D", DIMS)
def test_static_quant_matrix(D):
    bad = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for B, S in ROWS:
            for amp in AMPS:
                x, _ = _rows(B, S, D, dtype, amp, seed=D + S)
                for v in SCALES:
                    for q_mode in ("div", "mul"):
                        s = scale_tensor(v * amp, q_mode)
                        args = (x, s, q_mode, -448.0, 448.0)
                        assert SQ.can_use_static_quant(SQ.SPEC.bind(args))[0]
                        n = ndiff(SQ.static_quant(*args), torch.ops.diffusion_fuse.static_quant(*args))
                        if n:
                            bad.append((str(dtype), S, amp, v, q_mode, n))
    SUMMARY.setdefault("static_quant", {})[D] = len(bad)
    assert not bad, f"D={D}: (dtype, S, amp, scale, q_mode, ndiff) {bad[:6]}"


@pytest.mark.parametrize("D", DIMS)
def test_norm_modulate_quant_matrix(D):
    bad = []
    for form in ("flux_bf16", "wan_fp32_ln"):
        for B, S in ROWS:
            for amp in AMPS:
                combos = ((1, False), (3, True), (4, False)) if form == "flux_bf16" else ((3, False),)
                for n_q, keep_out in combos:
                    x, g = _rows(B, S, D, torch.bfloat16, amp, seed=D + S + n_q)
                    md = torch.float32 if form == "wan_fp32_ln" else torch.bfloat16
                    sc, sh = (torch.randn(B, 1, D, device="cuda", generator=g).to(md) for _ in range(2))
                    casts = (torch.float32, torch.bfloat16) if form == "wan_fp32_ln" else (None, None)
                    scales = [scale_tensor(v, "div") for v in SCALES[1:1 + n_q]]
                    # the base op's arguments (no second addends), then the quantizers'
                    args = (x, None, None, 1e-6, sc, sh, *casts, None, None, scales, "div", -448.0, 448.0, keep_out)
                    assert NORM_QUANT.guard(NORM_QUANT.bind(args))[0]
                    n = ndiff(NORM_QUANT.reference(*args), torch.ops.diffusion_fuse.norm_modulate_quant(*args))
                    if n:
                        bad.append((form, S, amp, n_q, keep_out, n))
    SUMMARY.setdefault("norm_modulate_quant", {})[D] = len(bad)
    assert not bad, f"D={D}: (form, S, amp, n_q, keep_out, ndiff) {bad[:6]}"


@pytest.mark.parametrize("D", DIMS)
def test_gated_residual_norm_modulate_quant_matrix(D):
    bad = []
    for B, S in ROWS:
        for amp in AMPS:
            for n_q, keep_out in ((1, False), (2, True)):
                x, g = _rows(B, S, D, torch.bfloat16, amp, seed=3 * D + S)
                res = (torch.randn(B, S, D, device="cuda", generator=g) * amp * 4).bfloat16()
                gate, sc, sh = (torch.randn(B, 1, D, device="cuda", generator=g).bfloat16() for _ in range(3))
                scales = [scale_tensor(v * amp, "mul") for v in SCALES[-n_q:]]
                # the base op's arguments (no second addends, no casts, residual first), then the quantizers'
                args = (res, x, gate, None, None, 1e-6, sc, sh, None, None, None, None, None, None, None, scales,
                        "mul", -448.0, 448.0, keep_out)
                assert GATED_QUANT.guard(GATED_QUANT.bind(args))[0]
                got = torch.ops.diffusion_fuse.gated_residual_norm_modulate_quant(*args)
                n = ndiff(GATED_QUANT.reference(*args), got)
                if n:
                    bad.append((S, amp, n_q, keep_out, n))
    SUMMARY.setdefault("gated_residual_norm_modulate_quant", {})[D] = len(bad)
    assert not bad, f"D={D}: (S, amp, n_q, keep_out, ndiff) {bad[:6]}"


@pytest.mark.parametrize("heads, head_dim, mlp", [(24, 128, 12288), (48, 128, 18432), (2, 16, 96)])
def test_cat_quant(heads, head_dim, mlp):
    bad = []
    for S in (7, 4608):
        g = torch.Generator(device="cuda").manual_seed(S)
        # attention output as SDPA leaves it: [B, H, S, Dh] viewed through permute + reshape
        attn = torch.randn(1, S, heads, head_dim, device="cuda", generator=g).bfloat16().permute(0, 2, 1, 3)
        attn = attn.permute(0, 2, 1, 3).reshape(1, S, heads * head_dim)
        act = torch.nn.functional.gelu(torch.randn(1, S, mlp, device="cuda", generator=g).bfloat16(),
                                       approximate="tanh")
        for v in (1e-3, 0.02, 1.0, 10.0):
            for keep in (False, True):
                args = (attn, act, scale_tensor(v, "div"), "div", -448.0, 448.0, keep)
                assert CQ.can_use_cat_quant(CQ.SPEC.bind(args))[0]
                n = ndiff(CQ.cat_quant(*args), CQ.SPEC.run_kernel(*args))
                if n:
                    bad.append((S, v, keep, n))
    SUMMARY.setdefault("cat_quant", {})[f"{heads * head_dim}+{mlp}"] = len(bad)
    assert not bad, bad


@pytest.mark.parametrize("name", ["flux", "flux2"])
def test_tiny_fp8_models(name):
    from diffusion_fuse.testing.fp8 import quantize_linears_fp8
    from diffusion_fuse.testing.tiny_models import build

    torch._dynamo.reset()
    model, kwargs = build(name, torch.bfloat16, "cuda")
    swapped = quantize_linears_fp8(model, kwargs)
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)
    with torch.no_grad():
        ref, out, out2 = model(**kwargs)[0], compiled(**kwargs)[0], compiled(**kwargs)[0]
    hits = report.counters()["kernel"]
    SUMMARY.setdefault("tiny_models", {})[name] = {"linears": len(swapped), "sites": len(report.sites()),
                                                   "kept": report.count(status="kept"), "kernel_hits": hits,
                                                   "equal": torch.equal(ref.view(torch.int16), out.view(torch.int16))}
    assert torch.equal(ref.view(torch.int16), out.view(torch.int16)) and torch.equal(out, out2)
    assert report.count(status="kept") == len(report.sites()), report.table()
    assert {"static_quant", "norm_modulate_quant", "gated_residual_norm_modulate_quant", "cat_quant"} <= set(hits), hits


def teardown_module(module):
    print("\nFP8 quant on CUDA (mismatching cases per test; 0 = bit-exact):")
    print(json.dumps(SUMMARY, indent=1, default=str))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "fp8_quant_gpu.json"), "w") as f:
            json.dump(SUMMARY, f, indent=1, default=str)
