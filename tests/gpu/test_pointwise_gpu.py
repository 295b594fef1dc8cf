"""diffusion_fuse::pointwise on CUDA: every recipe and the fused chains bitwise equal to eager.

1. Per op (kernels/pointwise_ops.py's table): each op alone as a generated kernel vs the eager
   op, bf16/fp16/fp32, over 3 x 2^16 values at amplitudes 1e-4, 1 and 100 with 0, -0, +-1,
   +-inf, NaN and extremes mixed in; compared as int views (NaN bits too). Decides the
   ``Variants``: each candidate (gelu-tanh's FMA contraction, how a float is negated, FMA contraction for erf) runs,
   and the default must be one of the exact ones. A mismatch names the op: that op's recipe is what to fix.
2. Chains as the pass groups them, at FLUX-dev / FLUX.2 / Wan shapes (testing/pointwise.py
   CHAINS: RoPE with and without the txt/img cat, gated residual, gelu + cat, residual + split
   + cat, gelu + clone, SwiGLU, Wan's fp32 residual, SANA's GLUMBConv with its convolutions' biases added in
   the kernel): through the registered op (kernel hits counted), repeated calls, CUDA-graph replay; and
   through the backend, the depthwise conv on channels-last input (cuDNN: the bias is added after it, so the
   kernel takes it) and on NCHW input (ATen's own kernel adds the bias inside, so the convolution keeps it).
3. Exhaustively: ``tanh`` on all 2**32 fp32 patterns (normal and subnormal inputs reported apart),
   gelu-tanh on every bf16/fp16 value, every libdevice op on every fp32 subnormal input with libdevice's
   flush-to-zero reflect off (the default, ``Variants.reflect_ftz``) and, recorded beside it, on (Triton's
   default, which flushes them: the reason it is off).

Prints a table; writes ``$OUT/pointwise_gpu.json`` when OUT is set. About a minute on an H200
(most of it compiling ~60 small kernels).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

from diffusion_fuse.kernels.pointwise_ops import DEFAULT_VARIANTS, RECIPES, Variants  # noqa: E402
from diffusion_fuse.lowering import counters  # noqa: E402
from diffusion_fuse.testing.pointwise import CHAINS, chain, fuse, program_of, run_program, site_ops  # noqa: E402
from diffusion_fuse.verify.compare import layout_difference  # noqa: E402

aten = torch.ops.aten
bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
DTYPES = (bf16, f16, f32)
RESULTS: list[dict] = []
_INT = {2: torch.int16, 4: torch.int32}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_INT[t.element_size()])


def ndiff(ref: torch.Tensor, got: torch.Tensor) -> int:
    # the layout as the verifier compares it: a size-1 dim's stride addresses nothing
    assert not layout_difference(ref, got), layout_difference(ref, got)
    return int((_bits(ref) != _bits(got)).sum())


def first_diffs(args, ref: torch.Tensor, got: torch.Tensor, k: int = 6) -> list[str]:
    """The first ``k`` differing elements as 'inputs -> eager vs ours' in hex bits: what to fix."""
    idx = (_bits(ref) != _bits(got)).flatten().nonzero().flatten()[:k].tolist()
    hx = lambda t, i: f"{int(_bits(t).flatten()[i]) & (2 ** (8 * t.element_size()) - 1):x}"  # noqa: E731
    return [",".join(hx(a, i) for a in args if a.dtype != torch.bool) + f" -> {hx(ref, i)} vs {hx(got, i)}"
            for i in idx]


def values(dtype, seed, positive=False, n=1 << 16) -> torch.Tensor:
    """3 x n values: amplitudes 1e-4, 1, 100; specials in the first 16 of each row."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(3, n, device="cuda", generator=g) * torch.tensor([[1e-4], [1.0], [100.0]], device="cuda")
    big = torch.finfo(dtype).max
    specials = torch.tensor([0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), big, -big,
                             torch.finfo(dtype).tiny, 0.5, -0.5, 2.0, 3.0, 1e-3, -7.25], device="cuda")
    x[:, :16] = specials
    if positive:
        x = x.abs()
    return x.to(dtype)


# name: (fn, number of tensor inputs, positive inputs only)
OPS = {
    "add": (lambda a, b: a + b, 2, False),
    "sub": (lambda a, b: a - b, 2, False),
    "mul": (lambda a, b: a * b, 2, False),
    "div": (lambda a, b: a / b, 2, False),
    "add_scalar_1": (lambda a: a + 1, 1, False),
    "rsub_1": (lambda a: 1 - a, 1, False),
    "mul_scalar": (lambda a: a * 1000, 1, False),
    "mul_scalar_frac": (lambda a: a * -9.210340371976184, 1, False),
    "div_scalar_pow2": (lambda a: a / 128, 1, False),
    "div_scalar_3": (lambda a: a / 3.0, 1, False),
    "neg": (lambda a: -a, 1, False),
    "exp": (torch.exp, 1, False),
    "sin": (torch.sin, 1, False),
    "cos": (torch.cos, 1, False),
    "tanh": (torch.tanh, 1, False),
    "rsqrt": (torch.rsqrt, 1, True),
    "sqrt": (torch.sqrt, 1, True),
    "reciprocal": (torch.reciprocal, 1, False),
    "sigmoid": (torch.sigmoid, 1, False),
    "silu": (lambda a: F.silu(a), 1, False),  # F.silu's own signature has 2 parameters: fx traces both
    "gelu": (lambda a: F.gelu(a), 1, False),
    "gelu_tanh": (lambda a: F.gelu(a, approximate="tanh"), 1, False),
    "relu": (torch.relu, 1, False),
    "clamp_fp8": (lambda a: a.clamp(-448.0, 448.0), 1, False),
    "clamp_frac": (lambda a: a.clamp(0.1, 0.3), 1, False),
    "pow2": (lambda a: a.pow(2), 1, False),
    "where": (lambda m, a, b: torch.where(m, a, b), 3, False),  # m: a bool mask (made below)
    "addcmul": (torch.addcmul, 3, False),
}
CASTS = {"to_bf16": bf16, "to_fp16": f16, "to_fp32": f32}
# The candidates the source does not settle (kernels/pointwise_ops.py Variants), run beside the default.
ALTERNATIVES = {
    "gelu_tanh": [Variants(gelu_tanh_fma=False)],
    "addcmul": [Variants(addcmul_fma=False)],
    "neg": [Variants(neg="xor")],
    "silu": [Variants(neg="xor")],
    "sigmoid": [Variants(neg="xor")],
    "gelu": [Variants(fp_fusion=True)],
}
# libdevice built with its flush-to-zero reflect on (Triton's default; ours is off, as nvcc builds eager's
# kernels): recorded beside the default for every op that calls libdevice. On normal values both are eager's;
# on subnormal inputs only the default is (test_subnormal_inputs_per_variant). erf's gelu differs with the
# reflect off too (ERF_NOT_REPRODUCED).
FTZ_ON = Variants(reflect_ftz=True)
NO_LUT = Variants(lut16=False)  # the arithmetic recipe of a bf16 op that is looked up by default (kernels/lut16.py)
LIBDEVICE_OPS = ("exp", "sin", "cos", "tanh", "rsqrt", "sigmoid", "silu", "gelu_tanh", "gelu")
for _op in LIBDEVICE_OPS:
    ALTERNATIVES.setdefault(_op, []).append(FTZ_ON)
for _op in ("exp", "tanh", "sigmoid", "silu", "gelu_tanh"):  # LUT16_OPS
    ALTERNATIVES.setdefault(_op, []).append(NO_LUT)
# Ops whose recipe is not eager's (kernels/pointwise_ops.py says why; the pass takes only their bf16 lookup):
# the recipes are measured, not asserted exact; the test fails if one turns out exact (then it can be enabled).
NOT_FUSED = {"gelu": "ERF_NOT_REPRODUCED"}


def _record(**kw) -> dict:
    RESULTS.append(kw)
    return kw


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("op", list(OPS))
def test_each_op_is_bitwise_eager(op, dtype, monkeypatch):
    fn, n_in, positive = OPS[op]
    if op in NOT_FUSED:  # measured anyway: the recipe without the check that keeps the pass off it
        r = RECIPES[aten.gelu.default]
        monkeypatch.setitem(RECIPES, aten.gelu.default, dataclasses.replace(r, check=lambda n: ""))
    args = [values(dtype, seed=i, positive=positive) for i in range(n_in)]
    if op == "where":
        args[0] = args[0] > args[1]
    key = program_of(fn, *args)
    ref = fn(*args)
    variants = [DEFAULT_VARIANTS] + ALTERNATIVES.get(op, [])
    if op in NOT_FUSED:  # the recipes without the lookup, which stands for them in bf16 (lookup_only)
        variants += [dataclasses.replace(v, lut16=False) for v in variants if v.lut16]
    gots = {v: run_program(key, args, v)[0] for v in variants}
    res = {v: ndiff(ref, g) for v, g in gots.items()}
    _record(kind="op", op=op, dtype=str(dtype), ndiff={str(v): n for v, n in res.items()}, numel=ref.numel(),
            first_diffs={str(v): first_diffs(args, ref, g) for v, g in gots.items() if res[v]})
    if op in NOT_FUSED:
        exact = [v for v, n in res.items() if n == 0 and not (v.lut16 and dtype == bf16)]
        assert not exact, f"{op} {dtype}: {exact} reproduce eager: enable the recipe ({NOT_FUSED[op]})"
        if dtype == bf16:  # the lookup of eager's own outputs
            assert res[DEFAULT_VARIANTS] == 0, f"{op} {dtype}: {res} {RESULTS[-1]['first_diffs']}"
        return
    assert res[DEFAULT_VARIANTS] == 0, f"{op} {dtype}: {res} {RESULTS[-1]['first_diffs']}"
    # bf16 LUT16_OPS run as a table lookup by default: the recipe, which runs where no table fits or in a tiled
    # kernel, must be exact too
    assert res.get(NO_LUT, 0) == 0, f"{op} {dtype} recipe: {res} {RESULTS[-1]['first_diffs']}"


# fp32 subnormals: the patterns with a zero exponent field and a non-zero mantissa, of either sign
SUBNORMALS = 2 * ((1 << 23) - 1)


def _tanh_every_fp32_pattern() -> dict:
    """Generated ``tanh`` vs torch.tanh (eager's tanhf) on all 2**32 fp32 bit patterns, 16 slices of 2**28: per
    kind of input ("normal": zeros, normals, infinities, NaNs; "subnormal"), the differing count and the first
    differences (inputs -> eager vs ours, hex bits)."""
    n = 1 << 28
    key = program_of(torch.tanh, torch.empty(n, device="cuda"))
    res = {k: {"ndiff": 0, "first": []} for k in ("normal", "subnormal")}
    for start in range(-(1 << 31), 1 << 31, n):
        bits = torch.arange(start, start + n, dtype=torch.int32, device="cuda")
        x = bits.view(torch.float32)
        ref, got = torch.tanh(x), run_program(key, [x])[0]
        diff = ref.view(torch.int32) != got.view(torch.int32)
        sub = ((bits & 0x7F800000) == 0) & ((bits & 0x007FFFFF) != 0)
        for kind, where in (("normal", diff & ~sub), ("subnormal", diff & sub)):
            idx = where.nonzero().flatten()
            res[kind]["ndiff"] += idx.numel()
            take = idx[:6 - len(res[kind]["first"])]
            if take.numel():
                res[kind]["first"] += first_diffs([x[take]], ref[take], got[take], take.numel())
        del bits, x, ref, got, diff, sub
    # "default": what the module's summary counts (any differing pattern); then the two kinds apart
    _record(kind="exh", op="tanh (2**32 fp32)", dtype="float32",
            ndiff={"default": res["normal"]["ndiff"] + res["subnormal"]["ndiff"], "normal": res["normal"]["ndiff"],
                   "subnormal": res["subnormal"]["ndiff"]},
            numel=1 << 32, first_diffs={k: r["first"] for k, r in res.items() if r["first"]})
    return res


@pytest.fixture(scope="module")
def tanh_every_pattern():
    return _tanh_every_fp32_pattern()


def test_tanh_is_eager_on_every_normal_fp32_pattern(tanh_every_pattern):
    # zeros, normals, infinities and NaNs (payloads included): bitwise eager's
    r = tanh_every_pattern["normal"]
    assert r["ndiff"] == 0, r["first"]


def test_tanh_keeps_subnormal_inputs_as_eager(tanh_every_pattern):
    # eager's tanhf returns a subnormal x; libdevice built with Triton's default FTZ reflect returns ±0 for all
    # 16,777,214 of them (test_subnormal_inputs_per_variant records it), hence launch.EAGER_NUMERICS'
    # enable_reflect_ftz=False
    r = tanh_every_pattern["subnormal"]
    assert r["ndiff"] == 0, f"{r['ndiff']} of {SUBNORMALS} subnormal inputs differ: {r['first']}"


@pytest.mark.parametrize("op", [op for op in LIBDEVICE_OPS if op != "gelu"])
def test_subnormal_inputs_per_variant(op):
    # every fp32 subnormal input (both signs; rsqrt: positive) through the generated kernel, with libdevice's
    # FTZ reflect off (the default) and on (Triton's default, recorded: with it sin, tanh and rsqrt flush every
    # subnormal input). Asserts the default is eager's.
    fn, _, positive = OPS[op]
    mag = torch.arange(1, 1 << 23, dtype=torch.int32, device="cuda")
    x = (mag if positive else torch.cat([mag, mag | -(1 << 31)])).view(torch.float32)
    key = program_of(fn, x)
    ref = fn(x)
    gots = {v: run_program(key, [x], v)[0] for v in (DEFAULT_VARIANTS, FTZ_ON)}
    res = {v: ndiff(ref, g) for v, g in gots.items()}
    label = {DEFAULT_VARIANTS: "default", FTZ_ON: "reflect_ftz on"}  # "default": what the summary counts
    _record(kind="subn", op=op, dtype="float32", ndiff={label[v]: n for v, n in res.items()}, numel=x.numel(),
            first_diffs={label[v]: first_diffs([x], ref, g) for v, g in gots.items() if res[v]})
    assert res[DEFAULT_VARIANTS] == 0, RESULTS[-1]["first_diffs"]


@pytest.mark.parametrize("dtype", [bf16, f16], ids=["bf16", "fp16"])
def test_gelu_tanh_is_eager_on_every_16_bit_value(dtype):
    # gelu's tanh input is never subnormal where it matters: 1 + tanh(t) is 1 for any tiny t
    x = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int16, device="cuda").view(dtype)
    fn = lambda a: F.gelu(a, approximate="tanh")  # noqa: E731
    key = program_of(fn, x)
    n = ndiff(fn(x), run_program(key, [x])[0])
    n_recipe = ndiff(fn(x), run_program(key, [x], NO_LUT)[0])  # bf16: the default is the table lookup
    _record(kind="exh", op="gelu_tanh (all values)", dtype=str(dtype), ndiff={"default": n, str(NO_LUT): n_recipe},
            numel=x.numel())
    assert n == 0 and n_recipe == 0


@pytest.mark.parametrize("src", DTYPES, ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("cast", list(CASTS))
def test_casts_are_bitwise_eager(cast, src):
    x = values(src, seed=3)
    fn = lambda a: a.to(CASTS[cast])  # noqa: E731
    ref = fn(x)
    if ref.dtype == src:
        pytest.skip("no cast")
    n = ndiff(ref, run_program(program_of(fn, x), [x])[0])
    _record(kind="op", op=cast, dtype=str(src), ndiff={"default": n}, numel=ref.numel())
    assert n == 0


def test_mixed_dtype_operands_round_as_eager():
    # bf16 * fp32 [D] promotes to fp32; bf16 * fp32 0-dim stays bf16 (the scalar tensor rounded to bf16 first)
    x = values(bf16, seed=4)
    w = values(f32, seed=5)[1, :].clone()
    s = torch.tensor(1.2345678, device="cuda")
    for name, fn, args in [("bf16*fp32[D]", lambda a, b: (a * b).to(bf16), (x, w)),
                           ("bf16*fp32 0-dim", lambda a, t: a * t + t, (x, s))]:
        ref = fn(*args)
        n = ndiff(ref, run_program(program_of(fn, *args), list(args))[0])
        _record(kind="op", op=name, dtype="bf16", ndiff={"default": n}, numel=ref.numel())
        assert n == 0, name


# --- chains as the pass groups them ------------------------------------------------------------
@pytest.mark.parametrize("name", CHAINS)
def test_fused_chain_is_bitwise_eager(name):
    fn, args = chain(name)
    gm, sites = fuse(fn, *args)
    assert len(sites) == 1, [site_ops(s) for s in sites]
    counters.reset()
    ref = fn(*args)
    refs = list(ref) if isinstance(ref, tuple) else [ref]
    for rep in range(2):  # the second call launches the cached plan directly
        got = gm(*args)
        gots = list(got) if isinstance(got, tuple) else [got]
        nd = [ndiff(r, o) for r, o in zip(refs, gots)]
        assert not any(nd), f"{name} call {rep}: {nd}"
    hits = counters.snapshot()["kernel"].get("pointwise", 0)
    _record(kind="chain", op=name, site=",".join(site_ops(sites[0])), ndiff={"default": sum(nd)},
            numel=refs[0].numel(), hits=hits)
    assert hits == 2, counters.snapshot()


@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
def test_conv_bias_in_the_kernel_through_the_verifier(layout):
    import diffusion_fuse

    fn, (h, w, b) = chain("sana_conv_glu")
    if layout == "contiguous":
        h = h.contiguous()
    report = diffusion_fuse.Report()
    compiled = torch.compile(fn, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
    ref, got = fn(h, w, b), compiled(h, w, b)
    (site,) = report.sites()
    _record(kind="conv", op=f"conv_glu {layout}", site=site.status, ndiff={"default": ndiff(ref, got)},
            numel=ref.numel(), reason=site.reason)
    assert ndiff(ref, got) == 0 and site.status == "kept", site.reason
    # cuDNN: convolution, then output.add_(bias), as the kernel does; ATen's depthwise kernel: bias inside
    assert ("convolution" in site.before) is (layout == "channels_last")


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_a_very_large_lone_gelu_is_looked_up_through_the_verifier(approximate):
    # an MLP's activation alone (fxpasses/pointwise.py LONE_LOOKUP_MIN_NUMEL): a table lookup of eager's outputs
    import diffusion_fuse
    from diffusion_fuse.fxpasses.pointwise import LONE_LOOKUP_MIN_NUMEL

    x = torch.randn(1, LONE_LOOKUP_MIN_NUMEL // 4096, 4096, device="cuda", dtype=bf16) * 3
    x.view(-1)[:4] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0])
    fn = lambda x: F.gelu(x, approximate=approximate)  # noqa: E731
    report = diffusion_fuse.Report()
    compiled = torch.compile(fn, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
    ref, got = fn(x), compiled(x)
    (site,) = report.sites()
    _record(kind="lone", op=f"gelu {approximate}", site=site.status, ndiff={"default": ndiff(ref, got)},
            numel=ref.numel(), reason=site.reason)
    assert ndiff(ref, got) == 0
    assert site.status == "kept", site.reason
    assert ndiff(fn(x), compiled(x)) == 0  # the verified graph alone


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [32, 64, 128, 256, 512, 1024])
def test_a_norms_variance_in_its_tails_kernel_through_the_verifier(head_dim, dtype):
    """diffusers' RMSNorm on SD3's transposed [B, H, S, D] views, then the joint cat: the variance is summed in the
    tail's kernel (patterns/mean_square.py ``tail_reads_rows``) in the order the device's eager uses, so the one
    site is kept and its kernel's output is eager's bits; wide-range rows make other orders give other bits."""
    import diffusion_fuse
    from diffusion_fuse.testing.pointwise import joint_qk_norm

    heads = max(1, 1024 // head_dim)
    g = torch.Generator(device="cuda").manual_seed(head_dim)
    amp = torch.logspace(-2, 2, head_dim, device="cuda")  # wide rows, their magnitudes in no order
    amp = amp[torch.randperm(head_dim, device="cuda", generator=g)].repeat(heads)
    img = (torch.randn(2, 300, heads * head_dim, device="cuda", generator=g) * amp).to(dtype)
    txt = torch.randn(2, 77, heads * head_dim, device="cuda", generator=g).to(dtype)
    w = [torch.randn(head_dim, device="cuda", generator=g).to(dtype) for _ in range(2)]
    fn = functools.partial(joint_qk_norm, heads=heads)
    report = diffusion_fuse.Report()
    torch._dynamo.reset()
    counters.reset()
    compiled = torch.compile(fn, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
    ref, got = fn(img, txt, *w), compiled(img, txt, *w)
    sites = report.sites()
    _record(kind="norm", op=f"qk norm cat d{head_dim}", dtype=str(dtype), ndiff={"default": ndiff(ref, got)},
            numel=ref.numel(), site=",".join(f"{s.pattern}:{s.status}" for s in sites))
    assert ndiff(ref, got) == 0
    assert [(s.pattern, s.status) for s in sites] == [("pointwise", "kept")], report.table()
    assert sum("mean" in op for op in sites[0].before) == 2, sites[0].before
    assert counters.snapshot()["kernel"].get("pointwise", 0) >= 1, counters.snapshot()
    assert ndiff(fn(img, txt, *w), compiled(img, txt, *w)) == 0  # the verified graph alone


def test_cuda_graph_capture_and_replay_after_input_mutation():
    fn, args = chain("flux_gated_residual")
    gm, _ = fuse(fn, *args)
    gm(*args)  # warm-up: plan and compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gm(*args)
    for seed in range(3):
        _, new = chain("flux_gated_residual", seed=seed + 1)
        for a, b in zip(args, new):
            a.copy_(b * (seed + 1))
        graph.replay()
        torch.cuda.synchronize()
        assert ndiff(fn(*args), out) == 0


def teardown_module(module):
    print("\npointwise kernels vs eager on CUDA (kind, op, dtype, differing elements per variant):")
    for r in RESULTS:
        print(f"  {r['kind']:5s} {r['op']:24s} {r['dtype'] if 'dtype' in r else '':15s} {r['ndiff']}")
        for v, d in (r.get("first_diffs") or {}).items():
            print(f"        {v}: {d}")
    bad = [r for r in RESULTS if r["op"] not in NOT_FUSED
           and r["ndiff"].get(str(DEFAULT_VARIANTS), r["ndiff"].get("default", 0))]
    print(f"  {len(RESULTS)} cases, {len(bad)} with differences in the default variant")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "pointwise_gpu.json"), "w") as f:
            json.dump({"cases": RESULTS, "default_variants": str(DEFAULT_VARIANTS)}, f, indent=1)
