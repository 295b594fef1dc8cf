"""Reliability: the backend never gives a wrong answer and never breaks the forward (issue #8, CPU part)."""

from __future__ import annotations

import gc
import threading

import pytest
import torch
from helpers import AdaLN as _AdaLN
from helpers import bitwise_equal, full_only

import diffusion_fuse
from diffusion_fuse.lowering import counters, faults
from diffusion_fuse.testing.tiny_models import build


def AdaLN(dim: int = 64):  # noqa: N802 - reads like the model class it builds
    return _AdaLN(dim, out_proj=True)


def compiled(model, options=None, **kw):
    report = diffusion_fuse.Report()
    return torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(options, report), **kw), report


def test_nan_and_inf_in_eager_output_do_not_reject_sites():
    model = AdaLN()
    x, t = torch.randn(2, 8, 64), torch.randn(2, 64)
    x[0, 0, 0] = float("inf")  # that row's LayerNorm is NaN in eager too
    x[1, 3, 5] = float("nan")
    c, report = compiled(model)
    with torch.no_grad():
        ref, out = model(x, t), c(x, t)
    assert torch.isnan(ref).any() and bitwise_equal(ref, out)
    assert [s.status for s in report.sites()] == ["kept"]


def test_new_input_signature_is_verified_again_and_a_late_fault_is_caught():
    model = AdaLN()
    c, report = compiled(model, dynamic=True)
    with torch.no_grad():
        for S in (8, 8):
            x, t = torch.randn(2, S, 64), torch.randn(2, 64)
            assert bitwise_equal(model(x, t), c(x, t))
        # The kernel goes wrong only for a shape the graph has not seen yet.
        x, t = torch.randn(2, 16, 64), torch.randn(2, 64)
        with faults.inject("norm_modulate", "perturb", 5):
            out = c(x, t)
        assert bitwise_equal(model(x, t), out)
    (graph,) = report.graphs
    assert [len(v["rejected"]) for v in graph.verifications] == [0, 1]  # one check per signature
    assert report.sites()[0].status == "rejected" and "first at [0, 0, 5]" in report.sites()[0].reason


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_inference_contexts(mode):
    model = AdaLN()
    x, t = torch.randn(2, 8, 64), torch.randn(2, 64)
    c, report = compiled(model)
    ctx = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with ctx:
        assert bitwise_equal(model(x, t), c(x, t))
    assert report.count(status="kept") == 1


def test_grad_enabled_call_runs_unrewritten_and_gives_exact_grads():
    torch.manual_seed(0)
    model = AdaLN()
    x, t = torch.randn(2, 8, 64, requires_grad=True), torch.randn(2, 64)
    ref = model(x, t)
    ref.square().sum().backward()
    grads_ref = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    c, report = compiled(model)
    out = c(x, t)
    out.square().sum().backward()
    grads = [p.grad for p in model.parameters()] + [x.grad]
    assert bitwise_equal(ref, out) and all(bitwise_equal(a, b) for a, b in zip(grads_ref, grads))
    assert report.sites() == [] and any("grad-enabled" in n for g in report.graphs for n in g.notes)


def test_batch_resolution_and_dtype_changes_recompile_and_reverify():
    report = diffusion_fuse.Report()
    for dtype in (torch.bfloat16, torch.float32):
        model, kwargs = build("sana", dtype)
        c = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
        with torch.no_grad():
            for hw in (8, 4):  # a second resolution
                kw = dict(kwargs, hidden_states=torch.randn(1, 4, hw, hw, dtype=dtype))
                assert bitwise_equal(model(**kw), c(**kw))
    # Each (dtype, resolution) is verified once, in a recompiled graph or in the dynamic-shape
    # graph Dynamo switches to after the resolution change (a new input signature).
    checks = [v for g in report.graphs for v in g.verifications]
    assert len(checks) == 4 and all(v["end_to_end_equal"] for v in checks)
    assert all(s.status == "kept" for s in report.sites())


def test_one_hundred_calls_verify_once_and_hold_no_extra_objects():
    model = AdaLN()
    x, t = torch.randn(2, 8, 64), torch.randn(2, 64)
    c, report = compiled(model)
    with torch.no_grad():
        c(x, t)
        gc.collect()
        before = len(gc.get_objects())
        tensors_before = sum(isinstance(o, torch.Tensor) for o in gc.get_objects())
        for _ in range(100):
            c(x, t)
        gc.collect()
        tensors_after = sum(isinstance(o, torch.Tensor) for o in gc.get_objects())
        after = len(gc.get_objects())
    assert len(report.graphs[0].verifications) == 1
    assert tensors_after <= tensors_before and after - before < 200, (before, after)


def test_counters_are_thread_safe():
    counters.reset()

    def hammer():
        for _ in range(2000):
            counters.kernel_hit("op_x")
            counters.fallback("op_x", "device is cpu")

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    snap = counters.snapshot()
    assert snap["kernel"]["op_x"] == 16000 and snap["fallback"]["op_x"]["device is cpu"] == 16000
    counters.reset()


def test_verifier_frees_reference_values_as_it_goes():
    """The reference run keeps a value only while a later node or a site check needs it."""
    import operator
    import weakref

    from diffusion_fuse.verify.verifier import run_with_site_checks

    class Chain(torch.nn.Module):
        def forward(self, x):
            for _ in range(20):
                x = torch.sin(x) + 1
            return x

    gm = torch.fx.symbolic_trace(Chain())
    made: list[weakref.ref] = []  # every value the run computes
    alive: list[int] = []  # how many of them are still referenced when each op runs

    def tracked(fn):
        def run(*args):
            alive.append(sum(r() is not None for r in made))
            out = fn(*args)
            made.append(weakref.ref(out))
            return out

        return run

    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in (torch.sin, operator.add):
            n.target = tracked(n.target)
    gm.recompile()
    x = torch.randn(1000)
    out, verdicts = run_with_site_checks(gm, [x], [], lambda *a: None)
    assert torch.equal(out, Chain()(x)) and verdicts == {}
    assert len(made) == 40 and max(alive) <= 1, alive  # only the value the next op reads is alive


def test_outputs_that_alias_inputs_and_each_other():
    class Aliasing(_AdaLN):
        def forward(self, x, t):
            y = super().forward(x, t)
            return x[:, :1], y, y.view(-1)  # a view of an input, an output and a view of it

    model = Aliasing(64, out_proj=True)
    x, t = torch.randn(2, 8, 64), torch.randn(2, 64)
    c, report = compiled(model)
    with torch.no_grad():
        ref, out = model(x, t), c(x, t)
    assert bitwise_equal(ref, out)
    assert out[0].data_ptr() == x.data_ptr()  # still a view of the input, as in eager
    assert out[2].data_ptr() == out[1].data_ptr()
    assert report.count(status="kept") == 1


@pytest.mark.parametrize("dynamic", [None, pytest.param(True, marks=full_only(
    "dynamic=None, whose second graph is FLUX.1's with dynamic sizes"))])
def test_a_three_resolution_service_compiles_at_most_two_graphs(dynamic):
    """Dynamo specializes the first resolution, then makes one dynamic graph; the verifier checks each
    input signature once per graph (the dynamic graph may see the first resolution again once), and a
    service cycling through its resolutions stops verifying after that."""
    model, kwargs = build("flux", torch.bfloat16)
    report = diffusion_fuse.Report()
    c = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report), dynamic=dynamic)
    seen = []
    with torch.no_grad():
        for side in (4, 6, 8) * 3:  # 16, 36, 64 image tokens, three rounds
            ids = torch.zeros(side, side, 3)
            ids[..., 1] = torch.arange(side)[:, None]
            ids[..., 2] = torch.arange(side)[None, :]
            kw = dict(kwargs, hidden_states=torch.randn(1, side * side, 16).bfloat16(), img_ids=ids.reshape(-1, 3))
            assert bitwise_equal(model(**kw), c(**kw))
            seen.append(sum(len(g.verifications) for g in report.graphs))
    assert len(report.graphs) <= 2
    assert seen[6:] == [seen[5]] * 3 and seen[-1] <= 2 * 3  # the third round verifies nothing new
    assert_no_rewrite_raised(report)


def assert_no_rewrite_raised(report: diffusion_fuse.Report) -> None:
    notes = [n for g in report.graphs for n in g.notes]
    assert not any("raised" in n for n in notes), notes
    assert report.sites() and all(s.status == "kept" for s in report.sites()), \
        [(s.id, s.status, s.reason) for s in report.sites() if s.status != "kept"]


# flux: the three-resolution test above (its second graph has dynamic sizes; dynamic=True in the full run);
# wan21 (and wan22_ti2v in the full run):
# tests/test_interleave_scatter.py runs them so, at two resolutions, with these checks
@pytest.mark.parametrize("name", [pytest.param("flux2", marks=full_only(
    "FLUX.1's graph with dynamic sizes (the three-resolution test), whose blocks FLUX.2's resemble")),
    "sana", "qwen_image", "sd35"])
def test_every_tiny_model_compiles_with_dynamic_shapes_and_no_rewrite_raises(name):
    """``dynamic=True``: every size symbolic from the first call. Each pass must leave what it cannot express
    with symbolic sizes as traced (a pass that prints a size symbol into the graph's code breaks the graph);
    the verifier would put such a graph's sites back, which this test calls a failure too."""
    model, kwargs = build(name, torch.bfloat16)
    c, report = compiled(model, dynamic=True)
    with torch.no_grad():
        assert bitwise_equal(model(**kwargs), c(**kwargs))
    assert_no_rewrite_raised(report)


def test_a_pass_that_raises_leaves_the_graph_as_traced(monkeypatch):
    """A graph pass that fails part way (it may have rewritten part of the graph) costs that graph's rewrites:
    the graph runs as traced, the report and the log say which pass, and the forward equals eager."""
    from diffusion_fuse.fxpasses.drop_clones import DropClonesPass

    def broken(self, graph, ctx):
        raise RuntimeError("a broken pass")

    monkeypatch.setattr(DropClonesPass, "__call__", broken)
    torch._dynamo.reset()
    model = AdaLN()
    x, t = torch.randn(2, 8, 64), torch.randn(2, 64)
    c, report = compiled(model)
    with torch.no_grad():
        assert bitwise_equal(model(x, t), c(x, t))
    (graph,) = report.graphs
    assert not report.sites()
    assert "pass drop_clones raised RuntimeError: a broken pass; the graph runs as traced" in graph.notes
