"""The verifier: wrong replacements are rejected, named and put back; inputs mutated once."""

import dataclasses

import pytest
import torch
from helpers import bitwise_equal
from torch import Tensor

import diffusion_fuse
from diffusion_fuse.patterns.user import TracedPattern
from diffusion_fuse.verify.compare import compare_bitwise, compare_close


@torch.library.custom_op("df_test::sigmoid_modulate", mutates_args=())
def sigmoid_modulate(x: Tensor, s: Tensor, b: Tensor, poison_index: int) -> Tensor:
    """sigmoid(x) * (s + 1) + b, computed as eager does; poison_index >= 0 perturbs that element."""
    out = torch.sigmoid(x) * (s + 1) + b
    if poison_index >= 0:
        out.view(-1)[poison_index] += 1
    return out


@sigmoid_modulate.register_fake
def _(x, s, b, poison_index):
    return torch.empty_like(x)


class SigmoidModulate(torch.nn.Module):
    def forward(self, x, s, b, buf=None):
        if buf is not None:
            buf.add_(1)  # an input the graph mutates
        return torch.sigmoid(x) * (s + 1) + b


def search(x, s, b):
    return torch.sigmoid(x) * (s + 1) + b


def inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 8, 16, generator=g), torch.randn(2, 1, 16, generator=g), torch.randn(2, 1, 16, generator=g)]


@pytest.fixture
def pattern():
    registered = []

    def register(name, poison_index):
        fam = diffusion_fuse.register_pattern(
            name, search, lambda x, s, b: torch.ops.df_test.sigmoid_modulate(x, s, b, poison_index), inputs())
        registered.append(name)
        return fam

    yield register
    for name in registered:
        diffusion_fuse.unregister_pattern(name)


def run(model, args, options=None):
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(options, report), fullgraph=True)
    with torch.no_grad():
        return compiled(*args), report


def test_exact_user_pattern_is_kept(pattern):
    pattern("sigmoid_modulate_ok", -1)
    args = inputs()
    out, report = run(SigmoidModulate(), args)
    assert bitwise_equal(SigmoidModulate()(*args), out)
    (site,) = report.sites()
    assert site.status == "kept" and site.pattern == "sigmoid_modulate_ok"
    assert site.before == ["sigmoid", "add.Tensor", "mul.Tensor", "add.Tensor"]


def test_wrong_replacement_is_rejected_named_and_put_back(pattern):
    pattern("sigmoid_modulate_bad", 37)
    args = inputs()
    out, report = run(SigmoidModulate(), args)
    assert bitwise_equal(SigmoidModulate()(*args), out)
    (site,) = report.sites()
    assert site.status == "rejected"
    assert site.id.startswith("sigmoid_modulate_bad@")
    assert site.location.endswith(".py:" + site.location.rsplit(":", 1)[1]) and "test_verifier.py" in site.location
    # element 37 of a [2, 8, 16] tensor is [0, 2, 5]
    assert "1/256 elements differ; first at [0, 2, 5]" in site.reason, site.reason
    assert "rejected" in report.table() and "[0, 2, 5]" in report.table()


def test_rejection_is_remembered_and_logged(pattern, caplog):
    pattern("sigmoid_modulate_bad", 0)
    args = inputs()
    model = SigmoidModulate()
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
    with torch.no_grad(), caplog.at_level("WARNING", logger="diffusion_fuse"):
        for _ in range(3):
            assert bitwise_equal(model(*args), compiled(*args))
    assert len(report.graphs[0].verifications) == 1  # judged once per input signature
    assert any("rejected by the verifier" in r.message for r in caplog.records)


def test_mutated_input_is_mutated_exactly_once(pattern):
    pattern("sigmoid_modulate_bad", 5)
    args = inputs()
    buf = torch.zeros(4)
    out, report = run(SigmoidModulate(), args + [buf])
    assert torch.equal(buf, torch.ones(4))
    assert report.sites()[0].status == "rejected"
    with torch.no_grad():
        assert bitwise_equal(SigmoidModulate()(*args), out)


class _Flaky:
    """Right when the verifier checks the site alone, wrong in the fused graph that follows."""

    calls = 0


@torch.library.custom_op("df_test::flaky_modulate", mutates_args=())
def flaky_modulate(x: Tensor, s: Tensor, b: Tensor) -> Tensor:
    _Flaky.calls += 1
    out = torch.sigmoid(x) * (s + 1) + b
    if _Flaky.calls > 1:
        out.view(-1)[0] = float("nan")
    return out


@flaky_modulate.register_fake
def _(x, s, b):
    return torch.empty_like(x)


@torch.library.custom_op("df_test::raising_modulate", mutates_args=())
def raising_modulate(x: Tensor, s: Tensor, b: Tensor) -> Tensor:
    """Right when the verifier checks the site alone; raises in the fused graph that follows."""
    _Flaky.calls += 1
    if _Flaky.calls > 1:
        raise RuntimeError("a rewrite that cannot run")
    return torch.sigmoid(x) * (s + 1) + b


@raising_modulate.register_fake
def _(x, s, b):
    return torch.empty_like(x)


def _unguarded(match):
    def inline(node):
        site = match(node)
        return dataclasses.replace(site, user=None) if site is not None else None

    return inline


@pytest.mark.parametrize("op, why", [
    ("flaky_modulate", "end-to-end output differs from the reference"),
    # e.g. a pass that printed a symbolic size the graph's code does not define: not a failed forward
    ("raising_modulate", "end-to-end failed (the rewritten graph raised RuntimeError: a rewrite that cannot run)"),
])
def test_end_to_end_mismatch_puts_every_site_back_and_restores_inputs(op, why):
    fam = TracedPattern("e2e", search, lambda x, s, b: getattr(torch.ops.df_test, op)(x, s, b), inputs())
    if op == "raising_modulate":
        # the graph itself raising (a pass's bad code), not a user function's op: that one is guarded at run time
        fam.match = _unguarded(fam.match)
    diffusion_fuse.register_pattern(fam)
    try:
        _Flaky.calls = 0
        args = inputs()
        buf = torch.zeros(4)
        out, report = run(SigmoidModulate(), args + [buf])
        with torch.no_grad():
            assert bitwise_equal(SigmoidModulate()(*args), out)
        assert torch.equal(buf, torch.ones(4))  # restored, then mutated once by the reference graph
        (site,) = report.sites()
        assert (site.status, site.reason) == ("rejected", "end-to-end mismatch")
        assert why in report.table() and "every site put back" in report.table()
    finally:
        diffusion_fuse.unregister_pattern("e2e")


def test_verify_false_runs_the_fused_graph_unchecked(pattern):
    pattern("sigmoid_modulate_bad", 3)
    args = inputs()
    out, report = run(SigmoidModulate(), args, {"verify": False})
    assert report.sites()[0].status == "unverified"
    assert not bitwise_equal(SigmoidModulate()(*args), out)  # the user turned the safety net off


def test_lossless_pattern_cannot_claim_to_be_inexact():
    with pytest.raises(ValueError, match="exact=False needs tier='high'"):
        diffusion_fuse.register_pattern("x", search, search, inputs(), exact=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bitwise_compare_is_right_for_floats(dtype):
    a = torch.tensor([0.0, float("nan"), float("inf"), 1.0], dtype=dtype)
    assert compare_bitwise(a, a.clone())  # same NaN bits are equal
    b = a.clone()
    b[0] = -0.0
    v = compare_bitwise(a, b)
    assert not v and "first at [0]" in v.detail  # -0.0 is not +0.0
    assert not compare_bitwise(a, a.double())


def test_close_compare():
    r = torch.randn(1000)
    assert compare_close(r, r + 1e-4, rtol=1e-2, atol=0)
    assert not compare_close(r, r + 1.0, rtol=1e-2, atol=1e-3)
    n = r.clone()
    n[3] = float("nan")
    assert not compare_close(r, n, rtol=1.0, atol=1.0)


def test_a_site_with_no_reference_value_is_rejected_not_a_crash():
    """A rewrite that made a node the reference graph has no counterpart for (a site reading it): the site is
    put back with the reason, and the others are judged as usual."""
    import torch.fx as fx

    from diffusion_fuse.verify.compare import Verdict
    from diffusion_fuse.verify.verifier import SiteCheck, run_with_site_checks

    gm = fx.symbolic_trace(lambda x: (x * 2) + 1)
    names = [n.name for n in gm.graph.nodes]
    rep = fx.symbolic_trace(lambda x: (x * 2,))
    checks = [SiteCheck("ghost", ["no_such_node"], [names[1]], rep, True),
              SiteCheck("real", [names[0]], [names[1]], rep, True)]
    out, verdicts = run_with_site_checks(gm, [torch.ones(3)], checks,
                                         lambda c, refs, got: Verdict(bitwise_equal(refs[0], got[0]), "ok"))
    assert torch.equal(out, torch.full((3,), 3.0))
    assert not verdicts["ghost"] and "no reference value for no_such_node" in verdicts["ghost"].detail
    assert verdicts["real"]


def test_a_site_whose_rewrite_raises_stays_as_traced_not_a_failed_compile():
    # a family whose emit (or its fake-value propagation) raises: that site is a near miss that says why, the
    # graph keeps its ATen ops, and the other sites go on
    from diffusion_fuse.patterns.registry import PatternFamily, Site

    class EmitRaises(PatternFamily):
        name = "emit_raises"
        anchors = (torch.ops.aten.sigmoid.default,)
        description = "test: a sigmoid site that cannot be emitted"

        def match(self, node):
            def emit(graph, ins):
                graph.call_function(torch.ops.aten.relu.default, (ins[0],))  # made, then undone
                raise RuntimeError("cannot emit this")
            return Site(pattern=self.name, anchor=node, nodes=[node], inputs=[node.args[0]], outputs=[node], emit=emit,
                        op="none")

    diffusion_fuse.register_pattern(EmitRaises())
    try:
        args = inputs()
        out, report = run(SigmoidModulate(), args)
        with torch.no_grad():
            assert bitwise_equal(SigmoidModulate()(*args), out)
        assert not [s for s in report.sites() if s.pattern == "emit_raises"]
        (miss,) = [m for g in report.graphs for m in g.near_misses if m.pattern == "emit_raises"]
        assert miss.reason == "rewrite failed (RuntimeError: cannot emit this); left as traced"
        assert "relu" not in report.graphs[0].fused_code  # the half-made rewrite is undone
    finally:
        diffusion_fuse.unregister_pattern("emit_raises")


def test_the_dry_runs_stand_ins_are_laid_out_as_the_values_they_stand_for():
    # a kernel is specialized on dtype, shape, strides and the storage offset's alignment: the stand-ins keep them
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from diffusion_fuse.verify.verifier import stand_in

    with FakeTensorMode():
        fakes = [torch.empty(4, 10, dtype=torch.bfloat16)[:, 2:8:2], torch.empty(0, 5)[:, 1:], torch.empty(3, 1)]
    for v in fakes:
        s = stand_in(v)
        assert not isinstance(s, FakeTensor) and (s.dtype, s.shape, s.stride()) == (v.dtype, v.shape, v.stride())
        assert s.storage_offset() == v.storage_offset() and not s.any()
    assert stand_in(3) == 3 and stand_in(None) is None


@pytest.fixture
def ahead_events(monkeypatch, pattern):
    """The verifier's dry run and its compile ahead (lowering/precompile.py) on the CPU, the CUDA check let through:
    the events in order, and a function compiling and calling a model with one site."""
    from diffusion_fuse.lowering import precompile
    from diffusion_fuse.verify import verifier

    events = []
    real_dry_run, real_ahead = verifier.dry_run, precompile.compile_ahead
    real_call = verifier.VerifiedGraph._verify_and_run

    def dry_run(gm, checks):
        events.append(("dry run", len(checks)))
        real_dry_run(gm, checks)

    def compile_ahead(fn, device):
        events.append(("started", device))
        return real_ahead(fn, None)

    def verify_and_run(self, *a, **k):
        events.append(("verified",))
        return real_call(self, *a, **k)

    monkeypatch.setenv(precompile.WORKERS_ENV, "0")
    monkeypatch.setattr(precompile, "available", lambda: True)
    monkeypatch.setattr(precompile, "compile_ahead", compile_ahead)
    monkeypatch.setattr(verifier, "compile_device", lambda gm: torch.device("cuda", 0))
    monkeypatch.setattr(verifier, "dry_run", dry_run)
    monkeypatch.setattr(verifier.VerifiedGraph, "_verify_and_run", verify_and_run)
    pattern("sigmoid_modulate_ahead", -1)

    def compile_and_call(options=None):
        torch._dynamo.reset()
        model = SigmoidModulate()
        out, report = run(model, inputs(), options)
        assert bitwise_equal(out, model(*inputs()))
        return report

    return events, compile_and_call


def test_the_dry_run_starts_at_compile_time_and_the_first_call_waits_for_it(ahead_events):
    """On CUDA the verifier's dry run runs when the graph is compiled, and the first verification waits for the
    pool before anything runs."""
    events, compile_and_call = ahead_events
    report = compile_and_call()
    assert events[0] == ("started", torch.device("cuda", 0))
    assert events[1][0] == "dry run" and events[1][1] > 0 and events[2] == ("verified",), events
    (entry,) = [v for g in report.graphs for v in g.verifications]
    assert entry["compiled_ahead"]["jobs"] == 0 and "waited" in entry["compiled_ahead"], entry


def test_with_stored_verdicts_the_dry_run_waits_for_the_first_call_to_miss_them(ahead_events, monkeypatch,
                                                                                 tmp_path):
    """Warm start: where this graph has stored verdicts, the first call most likely takes them and launches what is
    in Triton's cache already, so no dry run; where the call's own entry is missing after all, it dry-runs then."""
    events, compile_and_call = ahead_events
    monkeypatch.setenv("DIFFUSION_FUSE_CACHE_DIR", str(tmp_path))
    options = {"warm_start": True}
    compile_and_call(options)  # nothing stored: the dry run at compile time, then verdicts stored
    assert [e[0] for e in events] == ["started", "dry run", "verified"]
    events.clear()
    report = compile_and_call(options)
    assert [e[0] for e in events] == ["verified"], events  # stored verdicts taken: no dry run
    assert [v.get("warm_start") for g in report.graphs for v in g.verifications] == ["hit"]
    for entry in (tmp_path / "verdicts").glob("*.json"):
        entry.unlink()  # the graph's mark stays: a call whose own entry is missing
    events.clear()
    report = compile_and_call(options)
    assert [e[0] for e in events] == ["verified", "started", "dry run"], events
    (entry,) = [v for g in report.graphs for v in g.verifications]
    assert entry["warm_start"] == "stored" and "compiled_ahead" in entry
