"""patterns/merged_linear.py: linears of the same rows as one GEMM over their stacked weights."""

from __future__ import annotations

import pytest
import torch
from helpers import bitwise_equal, compile_and_run

from diffusion_fuse.config import Options
from diffusion_fuse.fxpasses.base import PassContext
from diffusion_fuse.fxpasses.fuse_patterns import FusePatternsPass
from diffusion_fuse.patterns.merged_linear import merge_saves_time
from diffusion_fuse.testing.pointwise import trace

aten = torch.ops.aten


# (rows, K, widths): the H200 probe (benchmarks/probe_merged_linear.py, results/h200-2026-11-30f/run1) measured
# FLUX's text q/k/v 1.84x faster merged and SANA's 1.14x, Wan2.1's cross-attention k/v 1.03x (less than the
# weights' copy), FLUX.2's image q/k/v and Wan2.2's slower; the wave model must take the first two only.
@pytest.mark.parametrize("rows, k, ns, want", [
    (512, 3072, [3072] * 3, True),  # FLUX double block, text q/k/v
    (2048, 2240, [2240] * 3, True),  # SANA, batch 2
    (512, 5120, [5120] * 2, False),  # Wan2.1-14B cross-attention k/v: two full waves either way
    (4096, 3072, [3072] * 3, False),  # FLUX image q/k/v
    (4608, 3072, [3072] * 3 + [12288], False),  # FLUX single block q/k/v + mlp
    (27280, 3072, [3072] * 3, False),  # Wan2.2-5B self-attention
    (512, 6144, [6144] * 3, False),  # FLUX.2 text q/k/v
    (512, 3072, [3072], False),  # one linear
])
def test_wave_model_takes_what_the_probe_measured_faster(rows, k, ns, want):
    assert merge_saves_time(rows, k, ns, 2, 132) is want


class Projections(torch.nn.Module):
    """Three projections of one input (a text stream's q/k/v), one of another input, one without bias."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(dim, dim) for _ in range(3))
        self.other = torch.nn.Linear(dim, 2 * dim)
        self.nobias = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x, y):
        q, k, v = self.q(x), self.k(x), self.v(x)
        return q * k + v.sum(-1, keepdim=True), self.other(y), self.nobias(x)


def _inputs(seed: int = 0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return dict(x=torch.randn(2, 8, 32, generator=g).to(dtype), y=torch.randn(2, 8, 32, generator=g).to(dtype))


def _merged(report):
    return [s for s in report.sites() if s.pattern == "merged_linear"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_three_projections_of_one_input_become_one_kept_site(dtype):
    torch.manual_seed(0)
    model = Projections().to(dtype).eval()
    ref, out, report = compile_and_run(model, _inputs(dtype=dtype))
    assert bitwise_equal(ref, out)
    sites = _merged(report)
    assert len(sites) == 1 and sites[0].status == "kept", report.table()
    assert sites[0].before.count("addmm") == 3  # q, k, v; not `other` (another input) nor the bias-free mm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fp32_and_fp64_linears_are_left_alone(dtype):
    # tensor-core dtypes only: an fp64 CPU GEMM of another width sums differently (the verifier caught it)
    torch.manual_seed(0)
    model = Projections().to(dtype).eval()
    ref, out, report = compile_and_run(model, _inputs(dtype=dtype))
    assert bitwise_equal(ref, out) and not _merged(report)


def test_the_option_turns_the_family_off():
    torch.manual_seed(0)
    model = Projections().to(torch.bfloat16).eval()
    ref, out, report = compile_and_run(model, _inputs(), options={"patterns": {"merged_linear": False}})
    assert bitwise_equal(ref, out) and not _merged(report)


def _rewrite(fn, *args):
    gm = trace(fn, *args)
    ctx = PassContext(options=Options())
    FusePatternsPass()(gm.graph, ctx)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm, [s for s in ctx.sites if s.pattern == "merged_linear"]


def test_the_rewrite_is_one_addmm_over_concatenated_weights_sliced_per_linear():
    x = torch.randn(16, 32, dtype=torch.bfloat16)
    ws = [torch.randn(n, 32, dtype=torch.bfloat16) for n in (32, 16, 48)]
    bs = [torch.randn(n, dtype=torch.bfloat16) for n in (32, 16, 48)]

    def three(x, w0, w1, w2, b0, b1, b2):
        return tuple(torch.nn.functional.linear(x, w, b) for w, b in ((w0, b0), (w1, b1), (w2, b2)))

    gm, sites = _rewrite(three, x, *ws, *bs)
    assert len(sites) == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(aten.addmm.default) == 1 and targets.count(aten.cat.default) == 2
    assert targets.count(aten.slice.Tensor) == 3
    got = gm(x, *ws, *bs)
    assert all(torch.equal(g, torch.nn.functional.linear(x, w, b)) for g, w, b in zip(got, ws, bs))


@pytest.mark.parametrize("case", ["different K", "different input", "different dtype", "one linear"])
def test_linears_that_do_not_share_rows_are_left_alone(case):
    x, x2 = torch.randn(16, 32, dtype=torch.bfloat16), torch.randn(16, 32, dtype=torch.bfloat16)
    w, b = torch.randn(32, 32, dtype=torch.bfloat16), torch.randn(32, dtype=torch.bfloat16)
    fns = {
        "different K": (lambda x, w, b: (torch.nn.functional.linear(x, w, b),
                                         torch.nn.functional.linear(x[:, :16], w[:, :16], b)), (x, w, b)),
        "different input": (lambda x, x2, w, b: (torch.nn.functional.linear(x, w, b),
                                                 torch.nn.functional.linear(x2, w, b)), (x, x2, w, b)),
        "different dtype": (lambda x, w, b: (torch.nn.functional.linear(x, w, b),
                                             torch.nn.functional.linear(x.half(), w.half(), b.half())),
                            (x, w, b)),
        "one linear": (lambda x, w, b: torch.nn.functional.linear(x, w, b) * 2, (x, w, b)),
    }
    fn, args = fns[case]
    assert not _rewrite(fn, *args)[1]


def test_flux_text_projections_merge_in_the_tiny_model():
    # tiny FLUX: each double block's text q/k/v (and, at its few tokens, the image q/k/v and the single
    # blocks' q/k/v + mlp) become one GEMM each, every site kept, the output equal to eager's
    from helpers import lossless_tiny_model

    report, _ = lossless_tiny_model("flux")
    sites = _merged(report)
    assert sites and all(s.status == "kept" for s in sites)
    assert any("transformer_flux.py:53" in s.id for s in sites)  # add_q_proj/add_k_proj/add_v_proj
