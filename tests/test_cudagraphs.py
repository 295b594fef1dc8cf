"""CUDA graphs (``mode="reduce-overhead"`` / ``options={"cudagraphs": True}``) on the CPU.

CPU graphs are never captured (torch's skip, logged and reported; the graph runs plainly).
The wiring to cudagraph trees is checked with a stand-in for Inductor's ``cudagraphify``:
verification first, outside the tree, then every call of a verified signature goes to the
tree, with the parameters and buffers as static inputs. The real trees run in
tests/gpu/test_cudagraphs_gpu.py.
"""

import logging

import pytest
import torch
from helpers import bitwise_equal

import diffusion_fuse
from diffusion_fuse import parse_options
from diffusion_fuse.testing.tiny_models import build, wider


@pytest.mark.parametrize("mode, on", [(None, False), ("default", False), ("reduce-overhead", True),
                                      ("max-autotune", True), ("max-autotune-no-cudagraphs", False)])
def test_modes_set_cudagraphs_as_inductor_does(mode, on):
    assert parse_options(None, mode).cudagraphs is on


def test_the_option_overrides_the_mode_and_is_validated():
    assert parse_options({"cudagraphs": False}, "reduce-overhead").cudagraphs is False
    assert parse_options({"cudagraphs": True, "quality": "high"}).cudagraphs is True
    with pytest.raises(ValueError, match=r"option cudagraphs='yes' is not allowed; allowed: \[True, False\]"):
        parse_options({"cudagraphs": "yes"})


def test_reduce_overhead_on_cpu_runs_plainly_and_says_why(caplog):
    from torch._dynamo.utils import counters as torch_counters

    model, kwargs = build("flux", torch.bfloat16)
    n0, skips = len(diffusion_fuse.last_report().graphs), torch_counters["inductor"]["cudagraph_skips"]
    compiled = torch.compile(model, backend="diffusion_fuse", mode="reduce-overhead", fullgraph=True)
    with caplog.at_level(logging.INFO, logger="diffusion_fuse.backend"), torch.no_grad():
        ref = model(**kwargs)
        outs = [compiled(**kwargs) for _ in range(3)]
    assert all(bitwise_equal(ref, out) for out in outs)
    graphs = diffusion_fuse.last_report().graphs[n0:]
    assert [g.cudagraphs for g in graphs] == ["not applied: skipping cudagraphs due to cpu device (arg0_1)"]
    assert any("CUDA graphs not applied" in n for n in graphs[0].notes)
    assert "CUDA graphs not applied (skipping cudagraphs due to cpu device" in caplog.text
    assert torch_counters["inductor"]["cudagraph_skips"] == skips + 1
    assert all(s.status == "kept" for g in graphs for s in g.sites.values())


def test_a_graph_that_writes_its_inputs_is_not_captured():
    def f(x, emb):
        x.add_(1.0)  # a user input written in place: cudagraph trees would run it eagerly anyway
        return torch.nn.functional.layer_norm(x, [32], eps=1e-6) * (1 + emb[:, None])

    report = diffusion_fuse.Report()
    c = torch.compile(f, backend=diffusion_fuse.DiffusionFuseBackend({"cudagraphs": True}, report))
    x, emb = torch.randn(2, 8, 32), torch.randn(2, 32)
    x_eager = x.clone()
    with torch.no_grad():
        out = c(x, emb)
        ref = f(x_eager, emb)
    assert bitwise_equal(ref, out) and bitwise_equal(x_eager, x)
    assert report.graphs[0].cudagraphs.startswith("not applied: skipping cudagraphs due to mutated inputs")


class FakeTrees:
    """Stands in for ``torch._inductor.compile_fx.cudagraphify``: records what the backend hands over."""

    def __init__(self) -> None:
        self.made: list[tuple[list[int], dict]] = []
        self.calls = 0

    def cudagraphify(self, model, static_input_idxs, **kwargs):
        self.made.append((list(static_input_idxs), kwargs))

        def run(inputs):
            self.calls += 1
            out = model(inputs)
            assert inputs == []  # the boxed model took its inputs out of the list, as the trees check
            return out

        return run


@pytest.fixture
def fake_trees(monkeypatch):
    import torch._dynamo.backends.cudagraphs as dynamo_cudagraphs
    import torch._inductor.compile_fx as compile_fx

    import diffusion_fuse.cudagraphs as cg

    trees = FakeTrees()
    monkeypatch.setattr(compile_fx, "cudagraphify", trees.cudagraphify)
    monkeypatch.setattr(cg, "skip_reason", lambda gm, static: None)  # as on a CUDA graph
    monkeypatch.setattr(dynamo_cudagraphs, "get_device_index", lambda gm: 0)
    return trees


def test_each_signature_is_verified_eagerly_then_run_by_the_tree(fake_trees):
    model, kwargs = build("flux", torch.bfloat16)
    n_weights = len(list(model.parameters())) + len(list(model.buffers()))
    report = diffusion_fuse.Report()
    c = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend({"cudagraphs": True}, report))

    def verifications():
        return sum(len(g.verifications) for g in report.graphs)

    with torch.no_grad():
        assert bitwise_equal(model(**kwargs), c(**kwargs))
        assert (verifications(), fake_trees.calls) == (1, 0)  # the first call is verified, outside the tree
        for _ in range(3):
            assert bitwise_equal(model(**kwargs), c(**kwargs))
        assert (verifications(), fake_trees.calls) == (1, 3)
        kwargs["hidden_states"].mul_(-0.5)  # inputs changed in place: a new value, not a new signature
        assert bitwise_equal(model(**kwargs), c(**kwargs))
        assert (verifications(), fake_trees.calls) == (1, 4)

        # A second resolution: Dynamo compiles a dynamic-shape graph; verified first, then the tree.
        kw2 = wider("flux", kwargs)
        for _ in range(3):
            assert bitwise_equal(model(**kw2), c(**kw2))
        assert (verifications(), fake_trees.calls) == (2, 6)
        # A third resolution of that dynamic graph: a new signature, verified again before the tree.
        ids = torch.zeros(8, 8, 3)
        ids[..., 1], ids[..., 2] = torch.arange(8.0)[:, None], torch.arange(8.0)[None, :]
        kw3 = dict(kwargs, hidden_states=torch.randn(1, 64, 16).bfloat16(), img_ids=ids.reshape(64, 3))
        for _ in range(2):
            assert bitwise_equal(model(**kw3), c(**kw3))
        assert (verifications(), fake_trees.calls) == (3, 7)

    assert [g.cudagraphs for g in report.graphs] == ["on", "on"]
    assert len(fake_trees.made) == 2
    for static, kw in fake_trees.made:
        assert len(static) == n_weights  # parameters and buffers: never copied before a replay
        assert kw["is_inference"] and not kw["is_backward"] and kw["mutated_input_idxs"] == ()
    assert all(s.status == "kept" for s in report.sites())


def test_verify_false_goes_to_the_tree_from_the_first_call(fake_trees):
    model, kwargs = build("wan22_ti2v", torch.bfloat16)
    report = diffusion_fuse.Report()
    c = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend({"cudagraphs": True, "verify": False},
                                                                         report))
    with torch.no_grad():
        for _ in range(2):
            assert bitwise_equal(model(**kwargs), c(**kwargs))
    assert fake_trees.calls == 2 and not report.graphs[0].verifications


def test_tier_high_hands_cudagraphs_to_inductor(monkeypatch):
    import torch._inductor.compile_fx as compile_fx
    from helpers import AdaLN, adaln_inputs

    patches = []

    def fake_compile_fx(gm, example_inputs, config_patches=None, decompositions=None):
        patches.append(config_patches)
        return gm.forward

    monkeypatch.setattr(compile_fx, "compile_fx", fake_compile_fx)
    model = AdaLN()
    x, emb = adaln_inputs()
    for options, expected in (({"quality": "high", "cudagraphs": True}, True), ({"quality": "high"}, False)):
        torch._dynamo.reset()
        report = diffusion_fuse.Report()
        c = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(options, report))
        with torch.no_grad():
            assert bitwise_equal(model(x, emb), c(x, emb))
        assert patches[-1]["triton.cudagraphs"] is expected
        assert report.graphs[0].cudagraphs.startswith("on (Inductor") if expected else not report.graphs[0].cudagraphs


def test_a_layout_first_seen_during_a_capture_takes_the_reference_path(monkeypatch):
    """Planning may compile or sync with the device: never inside a capture. Outside it, the layout is planned."""
    from diffusion_fuse.lowering import counters, dispatch

    planned = []

    def plan(a):
        planned.append(a[0].shape)
        return lambda a: a[0] * 2

    op = dispatch.GuardedKernel("capture_test_op", lambda args: (args[0].shape,), lambda a: (True, ""), plan,
                                lambda x: x + x, tuple)
    x = torch.ones(3)
    before = counters.snapshot()
    monkeypatch.setattr(dispatch, "capturing", lambda: True)
    assert torch.equal(op(x), x + x) and planned == []
    monkeypatch.setattr(dispatch, "capturing", lambda: False)
    assert torch.equal(op(x), x * 2) and planned == [(3,)]
    monkeypatch.setattr(dispatch, "capturing", lambda: True)
    assert torch.equal(op(x), x * 2) and planned == [(3,)]  # planned layouts launch inside a capture
    ctr = counters.diff(counters.snapshot(), before)
    assert ctr["fallback"]["capture_test_op"] == {dispatch.CAPTURE_FALLBACK: 1}
    assert ctr["kernel"]["capture_test_op"] == 2
