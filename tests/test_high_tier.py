"""Tier high: Inductor with the pattern pass inside, sites verified on the first call."""

import pytest
import torch
from helpers import compile_and_run, full_only
from test_models_lossless import EXPECTED_SITES, LINEAR_CAT_SITES
from test_rms_norm_pattern import CHAIN_SITES
from test_verifier import SigmoidModulate, inputs, search

import diffusion_fuse
from diffusion_fuse.fxpasses.inductor_pass import InductorFusePass
from diffusion_fuse.testing.tiny_models import build


@pytest.mark.parametrize("name", ["flux", pytest.param("wan22_ti2v", marks=full_only(
    "FLUX.1's: the same pass inside Inductor, Wan's lossless sites in test_models_lossless.py")),
    pytest.param("sd35", marks=full_only("FLUX.1's: the same pass inside Inductor, RMSNorm chains included"))])
def test_high_tier_compiles_through_inductor_with_the_pattern_applied(name):
    model, kwargs = build(name, torch.float32)
    ref, out, report = compile_and_run(model, kwargs, {"quality": "high"})
    g = report.graphs[0]
    assert g.quality == "high"
    # The pass ran inside Inductor and took the same sites the verifier judged: the lossless
    # families' (the AdaLN ones and linear_cat's) and, tier high only, every RMSNorm chain (not exact, judged
    # within tolerance).
    n_sites = EXPECTED_SITES[name] + LINEAR_CAT_SITES.get(name, 0) + CHAIN_SITES[name]
    assert sorted(g.inductor_sites) == sorted(g.sites) and len(g.sites) == n_sites
    assert not any(s.pattern == "pointwise" for s in g.sites.values())  # Inductor fuses pointwise ops here
    assert all(s.status == "kept" for s in g.sites.values())
    assert sorted(s.exact for s in g.sites.values() if s.pattern == "rms_norm_chain") == [False] * CHAIN_SITES[name]
    assert g.verifications[-1]["inductor_within_tolerance"], g.verifications
    torch.testing.assert_close(out[0], ref[0], rtol=1e-4, atol=1e-4)


def test_pass_has_a_real_uuid():
    opts = diffusion_fuse.parse_options({"quality": "high"})
    a, b = InductorFusePass(opts), InductorFusePass(opts)
    assert a.uuid() == b.uuid() and len(a.uuid()) > 32
    assert InductorFusePass(opts, exclude=frozenset({"x"})).uuid() != a.uuid()
    other = diffusion_fuse.parse_options({"quality": "high", "patterns": {"norm_modulate": False}})
    assert InductorFusePass(other).uuid() != a.uuid()


def test_high_tier_recompiles_without_a_site_the_verifier_rejected():
    diffusion_fuse.register_pattern(
        "bad_high", search, lambda x, s, b: torch.ops.df_test.sigmoid_modulate(x, s, b, 2), inputs(), tier="high",
        exact=False)
    try:
        args = inputs()
        report = diffusion_fuse.Report()
        c = torch.compile(SigmoidModulate(), backend=diffusion_fuse.DiffusionFuseBackend({"quality": "high"}, report))
        with torch.no_grad():
            out = c(*args)
        (site,) = report.sites()
        assert site.status == "rejected" and "rel L2 err" in site.reason
        assert report.graphs[0].inductor_sites == []  # recompiled without it
        torch.testing.assert_close(out, SigmoidModulate()(*args))
    finally:
        diffusion_fuse.unregister_pattern("bad_high")


def test_high_only_pattern_is_off_in_lossless():
    diffusion_fuse.register_pattern(
        "high_only", search, lambda x, s, b: torch.ops.df_test.sigmoid_modulate(x, s, b, -1), inputs(), tier="high")
    try:
        report = diffusion_fuse.Report()
        c = torch.compile(SigmoidModulate(), backend=diffusion_fuse.DiffusionFuseBackend(None, report))
        with torch.no_grad():
            c(*inputs())
        assert report.count("high_only") == 0
    finally:
        diffusion_fuse.unregister_pattern("high_only")


def test_unmatched_anchor_lowers_even_when_the_environment_says_ci(monkeypatch):
    # Inductor refuses implicit fallbacks for ops with a decomposition when CI is set; a plain
    # LayerNorm no pattern takes stays undecomposed in tier high and must still lower.
    monkeypatch.setenv("CI", "true")
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 16))
    x = torch.randn(4, 16)
    report = diffusion_fuse.Report()
    c = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend({"quality": "high"}, report))
    with torch.no_grad():
        torch.testing.assert_close(c(x), model(x))
    assert report.sites() == []


def _inductor_replaced_by(monkeypatch, replacement) -> list[str]:
    """Notes of tier high's graph with ``DiffusionFuseBackend._inductor`` replaced; two calls, each eager's output."""
    from diffusion_fuse.backend import DiffusionFuseBackend

    monkeypatch.setattr(DiffusionFuseBackend, "_inductor", replacement)
    torch._dynamo.reset()
    args = inputs()
    report = diffusion_fuse.Report()
    c = torch.compile(SigmoidModulate(), backend=DiffusionFuseBackend({"quality": "high"}, report))
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(c(*args), SigmoidModulate()(*args))
    (graph,) = report.graphs
    return graph.notes


def test_an_inductor_graph_that_raises_runs_the_verified_graph(monkeypatch):
    # never a failed forward: the verified ATen graph's output is returned and runs from then on, and the report
    # says why
    def raising(self, *a, **k):
        def run(*args):
            raise RuntimeError("inductor could not run this")
        return run

    notes = _inductor_replaced_by(monkeypatch, raising)
    assert any("Inductor's graph raised RuntimeError: inductor could not run this" in n for n in notes), notes


def test_inductor_failing_to_compile_runs_the_verified_graph(monkeypatch):
    def failing(self, *a, **k):
        raise RuntimeError("inductor cannot compile this")

    notes = _inductor_replaced_by(monkeypatch, failing)
    assert any(n.startswith("tier high: Inductor failed to compile (RuntimeError: inductor cannot compile this)")
               for n in notes), notes
