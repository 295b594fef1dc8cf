"""Which Welford/FMA variant of layer_norm_stats is bit-identical to eager CUDA LayerNorm?

Runs every WelfordVariant (24 FMA-contraction hypotheses, see the kernel module's doc)
against ``torch.native_layer_norm`` on CUDA and compares bits: mean/rstd as int32, y as
int16 (bf16/fp16) or int32 (fp32). Prints a table per stage and, when $OUT is set, writes
``$OUT/layer_norm_stats_variants.json`` plus the PTX of the winning kernel.

Stages (each a module-scoped fixture, so the sweep runs once):
  1. stats sweep: all variants, bf16 + fp32 inputs, no affine, D in DIMS, rows 1/7/4096,
     amplitudes 1e-4/1/100, eps 1e-6/1e-5. One N_ITERS for every D (masked trips change
     nothing), so each variant compiles once per dtype.
  2. affine: the exact variants (or the best one) x {w&b, w, b} x AFFINE_FMA {on, off},
     bf16/fp16/fp32, weights/biases with -1, 0, 1 and signed zeros.
  3. production shape: the chosen variant with the tight N_ITERS for each D.

Run: ``python -m pytest -q -s tests/gpu/test_layer_norm_stats_gpu.py`` or run this file.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

try:
    from diffusion_fuse.kernels import layer_norm_stats as lns
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from diffusion_fuse.kernels import layer_norm_stats as lns
from diffusion_fuse.kernels.launch import EAGER_NUMERICS  # noqa: E402

DIMS = (64, 1000, 1536, 2240, 3072, 5120, 6144)
ROWS = 4096
ROW_SLICES = (1, 7, ROWS)
AMPS = (1e-4, 1.0, 100.0)
EPSS = (1e-6, 1e-5)
SWEEP_ITERS = lns.n_iters_for(max(DIMS))
STATS_DTYPES = (torch.bfloat16, torch.float32)
# The full sweep of FMA hypotheses (24 variants) finds the default exact on the H200
# (torch 2.11); by default only the default and its nearest alternatives run, which still
# shows the test tells them apart. DIFFUSION_FUSE_LN_SWEEP=1 runs all of them again.
SWEEP_VARIANTS = lns.ALL_VARIANTS if os.environ.get("DIFFUSION_FUSE_LN_SWEEP") == "1" else (
    lns.DEFAULT_VARIANT,
    lns.WelfordVariant(comb_m2_fma=False),
    lns.WelfordVariant(comb_mean=lns.COMB_MEAN_FMA_B),
)
AFFINE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
AFFINES = ("wb", "w", "b")

_DT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def _ndiff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (_bits(a.reshape(-1)) != _bits(b.reshape(-1))).sum()


def make_input(rows: int, d: int, amp: float, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows with varied means and scales, plus a few adversarial rows."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, d, device="cuda", generator=g)
    x = x * torch.exp(torch.randn(rows, 1, device="cuda", generator=g)) + 4 * torch.randn(
        rows, 1, device="cuda", generator=g
    )
    x[0] = 1.0  # constant row: m2 exactly 0
    if rows > 4:
        x[1, :] = 0.0
        x[1, d // 3] = 200.0 if dtype == torch.float16 else 1000.0  # one outlier (finite in fp16 at amp 100)
        x[2] = torch.arange(d, device="cuda", dtype=torch.float32) % 7 - 3  # small integers
        x[3] = 50.0 + 1e-3 * torch.randn(d, device="cuda", generator=g)  # large mean, tiny spread
        x[4, ::2] = -x[4, 1::2]  # zero-mean pairs
    x = (amp * x).to(dtype).contiguous()
    assert torch.isfinite(x).all()  # NaN payloads would make bit comparisons meaningless
    return x


def make_affine(d: int, dtype: torch.dtype, which: str, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = b = None
    if "w" in which:
        w = 1 + 0.3 * torch.randn(d, device="cuda", generator=g)
        w[:5] = torch.tensor([-1.0, 0.0, 1.0, -0.0, 2.0])
        w = w.to(dtype)
    if "b" in which:
        b = 0.3 * torch.randn(d, device="cuda", generator=g)
        b[5:8] = torch.tensor([0.0, -0.0, 1.0])
        b = b.to(dtype)
    return w, b


class Tally:
    """Mismatch counts per key, plus the first failing case."""

    def __init__(self):
        self.cases = defaultdict(int)
        self.bad = defaultdict(lambda: [0, 0, 0])  # mean, rstd, y element mismatches
        self.bad_cases = defaultdict(int)
        self.first = {}

    def add(self, key, case: str, pending):
        self.cases[key] += 1
        counts = [int(c) for c in pending]
        for i, c in enumerate(counts):
            self.bad[key][i] += c
        if any(counts):
            self.bad_cases[key] += 1
            self.first.setdefault(key, f"{case}: mean/rstd/y mismatches {counts}")

    def exact(self, key) -> bool:
        return self.cases[key] > 0 and self.bad_cases[key] == 0

    def rows(self, keys, label):
        out = []
        for k in keys:
            m, r, y = self.bad[k]
            out.append(
                {
                    label: k if isinstance(k, str) else repr(k),
                    "cases": self.cases[k],
                    "bad_cases": self.bad_cases[k],
                    "mean_bits": m,
                    "rstd_bits": r,
                    "y_bits": y,
                    "exact": self.exact(k),
                    "first_failure": self.first.get(k, ""),
                }
            )
        return out


def _print_table(title: str, rows: list[dict], label: str) -> None:
    print(f"\n== {title}")
    print(f"{'exact':5} {'bad/cases':>11} {'mean':>9} {'rstd':>9} {'y':>11}  {label}")
    for r in rows:
        print(
            f"{'YES' if r['exact'] else 'no':5} {r['bad_cases']:>5}/{r['cases']:<5} {r['mean_bits']:>9} "
            f"{r['rstd_bits']:>9} {r['y_bits']:>11}  {r[label]}"
        )
        if r["first_failure"]:
            print(f"{'':30}first: {r['first_failure']}")


def _report(name: str, payload) -> None:
    out = os.environ.get("OUT")
    if not out:
        return
    path = Path(out) / "layer_norm_stats_variants.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = payload
    path.write_text(json.dumps(data, indent=1))


def _check_path(x, w=None, b=None):
    assert lns.eager_uses_vectorized_kernel(x, x.shape[1], w, b), "eager would not take the vectorized kernel"


@pytest.fixture(scope="module")
def stats_sweep():
    tally = Tally()
    for dtype in STATS_DTYPES:
        for d in DIMS:
            for ai, amp in enumerate(AMPS):
                x_all = make_input(ROWS, d, amp, dtype, seed=1000 * d + 10 * ai + (dtype == torch.float32))
                for eps in EPSS:
                    for rows in ROW_SLICES:
                        x = x_all[:rows]
                        _check_path(x)
                        y_ref, m_ref, r_ref = torch.native_layer_norm(x, [d], None, None, eps)
                        case = f"{_DT[dtype]} D={d} rows={rows} amp={amp:g} eps={eps:g}"
                        for v in SWEEP_VARIANTS:
                            y, m, r = lns.layer_norm_exact(x, None, None, eps, variant=v, n_iters=SWEEP_ITERS)
                            tally.add(v, case, (_ndiff(m, m_ref), _ndiff(r, r_ref), _ndiff(y, y_ref)))
        torch.cuda.synchronize()
    rows = tally.rows(SWEEP_VARIANTS, "variant")
    for r, v in zip(rows, SWEEP_VARIANTS):
        r["variant"] = v.name
    _print_table("stage 1: Welford variants vs eager (no affine)", rows, "variant")
    _report("stats", rows)
    exact = [v for v in SWEEP_VARIANTS if tally.exact(v)]
    best = min(SWEEP_VARIANTS, key=lambda v: (not tally.cases[v], tally.bad_cases[v], sum(tally.bad[v])))
    chosen = lns.DEFAULT_VARIANT if lns.DEFAULT_VARIANT in exact else (exact[0] if exact else best)
    return {"tally": tally, "exact": exact, "chosen": chosen}


@pytest.fixture(scope="module")
def affine_sweep(stats_sweep):
    variants = stats_sweep["exact"] or [stats_sweep["chosen"]]
    tally = Tally()
    for dtype in AFFINE_DTYPES:
        for d in DIMS:
            for ai, amp in enumerate(AMPS):
                x = make_input(1024, d, amp, dtype, seed=7 + 1000 * d + ai)
                for which in AFFINES:
                    w, b = make_affine(d, dtype, which, seed=d + ai)
                    _check_path(x, w, b)
                    y_ref, m_ref, r_ref = torch.native_layer_norm(x, [d], w, b, 1e-6)
                    case = f"{_DT[dtype]} D={d} amp={amp:g}"
                    for v in variants:
                        for fma in (True, False):
                            y, m, r = lns.layer_norm_exact(
                                x, w, b, 1e-6, variant=v, affine_fma=fma, n_iters=SWEEP_ITERS
                            )
                            key = (v.name, which, fma)
                            tally.add(key, case, (_ndiff(m, m_ref), _ndiff(r, r_ref), _ndiff(y, y_ref)))
    keys = sorted(tally.cases)
    rows = tally.rows(keys, "key")
    for r, k in zip(rows, keys):
        r["key"] = f"affine={k[1]:2} affine_fma={k[2]!s:5} | {k[0]}"
    _print_table("stage 2: affine output expressions vs eager", rows, "key")
    _report("affine", rows)
    return {"tally": tally, "variants": variants}


@pytest.fixture(scope="module")
def tight_sweep(stats_sweep):
    v = stats_sweep["chosen"]
    tally = Tally()
    for dtype in STATS_DTYPES:
        for d in DIMS:
            x = make_input(ROWS, d, 1.0, dtype, seed=99 + d)
            w, b = make_affine(d, dtype, "wb", seed=5 + d)
            for aff in (False, True):
                ww, bb = (w, b) if aff else (None, None)
                y_ref, m_ref, r_ref = torch.native_layer_norm(x, [d], ww, bb, 1e-6)
                y, m, r = lns.layer_norm_exact(x, ww, bb, 1e-6, variant=v)  # N_ITERS = n_iters_for(d)
                tally.add(_DT[dtype], f"D={d} affine={aff}", (_ndiff(m, m_ref), _ndiff(r, r_ref), _ndiff(y, y_ref)))
    keys = sorted(tally.cases)
    rows = tally.rows(keys, "dtype")
    _print_table(f"stage 3: tight N_ITERS, {v.name}", rows, "dtype")
    _report("tight", rows)
    _dump_ptx(v)
    return tally


def _dump_ptx(v) -> None:
    out = os.environ.get("OUT")
    if not out:
        return
    x = torch.randn(2, 3072, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    mean = torch.empty(2, device="cuda")
    rstd = torch.empty(2, device="cuda")
    k = lns._layer_norm_exact_kernel[(2,)](
        x, None, None, y, mean, rstd, 3072, 1e-6,
        N_ITERS=lns.n_iters_for(3072), LANES=lns.LANES, VEC=lns.VEC, HAS_W=False, HAS_B=False,
        AFFINE_FMA=True, **v.constexprs(), UNIFORM=lns.is_uniform(3072, lns.n_iters_for(3072)),
        num_warps=4, **EAGER_NUMERICS,
    )  # fmt: skip
    asm = getattr(k, "asm", None)  # the launch returns the CompiledKernel
    if asm:
        Path(out, "triton_layer_norm_exact_bf16_3072.ptx").write_text(asm["ptx"])


def test_some_welford_variant_is_bit_exact(stats_sweep):
    t = stats_sweep["tally"]
    assert stats_sweep["exact"], "no variant matched eager everywhere; best: " + t.first.get(stats_sweep["chosen"], "")
    print("\nexact Welford variants:", *(v.name for v in stats_sweep["exact"]), sep="\n  ")


def test_default_variant_is_exact(stats_sweep):
    # the documented hypothesis; failing this alone means DEFAULT_VARIANT must change
    assert lns.DEFAULT_VARIANT in stats_sweep["exact"], stats_sweep["tally"].first.get(lns.DEFAULT_VARIANT)


@pytest.mark.parametrize("which", [
    "wb", "w",
    # Neither fma(rstd, x - mean, b) nor the unfused form matches eager's bias-only output on
    # the H200 (a few elements differ); the norm_modulate guard sends that case to the reference.
    pytest.param("b", marks=pytest.mark.xfail(strict=True, reason="bias-only output expression not reproduced")),
])
def test_affine_output_is_bit_exact(affine_sweep, which):
    t = affine_sweep["tally"]
    ok = [k for k in t.cases if k[1] == which and t.exact(k)]
    assert ok, f"no (variant, AFFINE_FMA) matched eager for affine={which}: " + "; ".join(
        t.first.get(k, "") for k in t.cases if k[1] == which
    )


def test_tight_n_iters_is_bit_exact(tight_sweep):
    bad = {k: tight_sweep.first[k] for k in tight_sweep.cases if not tight_sweep.exact(k)}
    assert not bad, bad


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
