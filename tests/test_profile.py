"""The profile view (diffusion_fuse/profile.py) on the CPU: tiny FLUX, eager vs diffusion_fuse vs Inductor.

One ``diffusion_fuse.profile`` run of tiny FLUX (fp32) is shared by the tests below; the CLI runs once with a tiny
model and once with a script. On the CPU our ops take their reference path, but their profiler scopes
(lowering/profiling.py) still name them. No timing is asserted: only how the time is accounted for.
"""

from __future__ import annotations

import collections
import itertools
import json
import re
import textwrap
import types

import pytest
import torch
from html_report import parse, select

import diffusion_fuse
from diffusion_fuse.__main__ import main
from diffusion_fuse.lowering import dispatch, profiling
from diffusion_fuse.patterns import REGISTRY
from diffusion_fuse.profile import COMPUTE, EAGER, HOST, OURS
from diffusion_fuse.testing.tiny_models import build

LOCATION = re.compile(r"^.+\.py:\d+ \(.+\)$")
INDUCTOR_KERNEL = re.compile(r"^(triton|cpp)_[a-z]+_\w+$")


@pytest.fixture(scope="module")
def flux():
    torch._dynamo.reset()
    model, kwargs = build("flux", torch.float32, seed=0)
    report = diffusion_fuse.profile(model, forwards=2, **kwargs)
    return report, set(report.sites)


def test_classes_sum_to_each_variants_total(flux):
    report, _ = flux
    assert report.variants == ["eager", "diffusion_fuse", "inductor"]  # no CUDA graphs without a GPU
    for v in report.variants:
        total = report.totals_ms[v]
        assert total > 0
        assert sum(r.ms.get(v, 0.0) for r in report.classes) == pytest.approx(total, rel=1e-3, abs=1e-3)
    assert not [n for n in report.notes if "classes sum" in n]


def test_our_families_are_named_on_the_cpu(flux):
    """Every family with a kept site (the compile's report) shows up under its own name (the profiler's scopes),
    only in the diffusion_fuse column."""
    report, kept = flux
    assert kept, "tiny FLUX keeps sites"
    assert set(report.families()) == kept
    assert set(report.families()) <= REGISTRY.names()
    assert "linear_cat" in kept  # the joint attention's value cat: a family whose op runs GEMMs
    for r in report.classes:
        if r.kind == "ours":
            assert r.ms.get("diffusion_fuse", 0) > 0 and "eager" not in r.ms and "inductor" not in r.ms
            if r.name == OURS + "linear_cat":  # its op runs GEMMs (OpSpec.compute_bound): no bytes floor
                assert r.floor_ms is None and r.above_floor("diffusion_fuse") is None
            else:
                assert r.floor_ms is not None and r.floor_ms > 0  # their calls' bytes, recorded by the scope
    eager = report.row(EAGER)  # fewer eager ops left (calls, not CPU times: those move with the machine's load)
    assert eager is not None and eager.calls["eager"] > eager.calls["diffusion_fuse"]


def test_eager_ops_left_are_listed_with_their_source_lines(flux):
    report, _ = flux
    eager = report.row(EAGER)
    assert report.eager_ops and report.lines
    assert sum(o.ms for o in report.eager_ops) == pytest.approx(eager.ms["diffusion_fuse"], rel=1e-6)
    assert sum(ln.ms for ln in report.lines) == pytest.approx(eager.ms["diffusion_fuse"], rel=1e-6)
    for ln in report.lines:
        assert LOCATION.match(ln.location), ln.location
        assert ln.code and ln.ops
        assert ln.floor_ms >= 0 and ln.above_floor_ms == pytest.approx(max(0.0, ln.ms - ln.floor_ms))
    assert {op for ln in report.lines for op in ln.ops} == {o.op for o in report.eager_ops}
    # sorted by what would pay
    above = [ln.above_floor_ms for ln in report.lines]
    assert above == sorted(above, reverse=True)


def test_inductor_column_is_filled(flux):
    report, _ = flux
    with_kernels = [ln for ln in report.lines if ln.inductor]
    assert with_kernels
    for ln in with_kernels:
        assert all(INDUCTOR_KERNEL.match(k) for k, _ in ln.inductor), ln.inductor
        assert ln.inductor_ms == pytest.approx(sum(t for _, t in ln.inductor))
    ind = report.row("Inductor kernels")
    assert ind is not None and ind.ms["inductor"] > 0 and set(ind.ms) == {"inductor"}


def test_floors_and_order(flux):
    report, _ = flux
    assert report.copy_bandwidth > 0
    for r in report.classes:
        if r.name in COMPUTE or r.name == OURS + "linear_cat":  # compute-bound: sorted by time, after the rest
            assert r.floor_ms is None and r.above_floor(report.primary) is None
        elif r.kind in ("ours", "eager"):
            assert r.floor_ms is not None and r.floor_ms >= 0
    assert report.row(HOST).floor_ms == 0.0
    keys = [r.above_floor(report.primary) for r in report.classes]
    paying = [k for k in keys if k is not None]
    assert keys[:len(paying)] == paying and paying == sorted(paying, reverse=True)
    assert 0 <= report.eager_share() < 1
    assert "target ≤ 5%" in report.headline()


def test_table_dict_and_html(flux, tmp_path):
    report, _ = flux
    text = report.table()
    for r in report.classes:
        assert r.name in text
    d = json.loads(json.dumps(report.to_dict()))
    assert [c["name"] for c in d["classes"]] == [r.name for r in report.classes]
    assert d["eager_share"] == pytest.approx(report.eager_share())
    path = tmp_path / "profile.html"
    report.save_html(str(path))
    els = parse(path.read_text(encoding="utf-8"))
    groups = select(els, "div", "class-bars")
    assert [g.data("class") for g in groups] == [r.name for r in report.classes]  # a bar group per class
    bars = select(els, "div", "bar")
    assert len(bars) == len(report.classes) * len(report.variants)
    ms = {(b.data("variant")): 0.0 for b in bars}
    for b in bars:
        ms[b.data("variant")] += float(b.data("ms"))
    for v in report.variants:
        assert ms[v] == pytest.approx(report.totals_ms[v], rel=1e-3, abs=1e-3)
    assert len(select(els, "tr", "class-row")) == len(report.classes) + 1
    assert len(select(els, "tr", "line-row")) == len(report.lines)


def test_scope_names_our_op_only_while_a_profiler_records():
    """A GuardedKernel called directly: a diffusion_fuse::<op> event under the profiler, the bytes it moved when
    records are collected, nothing otherwise."""
    one_tensor = [k for op, k in dispatch.DIRECT.items()
                  if [str(a.type) for a in op._schema.arguments] == ["Tensor"] and len(op._schema.returns) == 1]
    assert one_tensor
    kernel = one_tensor[0]
    x = torch.randn(4, 16)
    assert not torch.autograd.profiler._is_profiler_enabled and profiling.records is None
    kernel(x)
    profiling.records = []
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = kernel(x)
        records = profiling.records
    finally:
        profiling.records = None
    names = [e.name for e in prof.events()]
    assert names.count(f"diffusion_fuse::{kernel.op}") == 1
    assert records == [(kernel.op, x.numel() * 4, out.numel() * out.element_size())]
    kernel(x)  # profiler off again: no scope, no record
    assert profiling.unnamed()


def test_cli_tiny_model(tmp_path, capsys):
    html_path, json_path = tmp_path / "p.html", tmp_path / "p.json"
    code = main(["profile", "--model", "flux", "--dtype", "fp32", "--forwards", "1", "--warmup", "1",
                 "--html", str(html_path), "--json", str(json_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "diffusion_fuse profile: tiny flux (fp32" in out and "left unfused" in out and "(target ≤ 5%)" in out
    assert "above floor ms" in out and "Inductor kernels (ms)" in out
    d = json.loads(json_path.read_text())
    assert d["variants"] == ["eager", "diffusion_fuse", "inductor"] and d["classes"]
    assert select(parse(html_path.read_text(encoding="utf-8")), "div", "class-bars")


def test_cli_script(tmp_path, capsys):
    script = tmp_path / "prof_script.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        import diffusion_fuse
        from helpers import AdaLN, adaln_inputs

        x, emb = adaln_inputs(dim=32, seq=8)
        diffusion_fuse.profile(AdaLN(32).eval(), x, emb, forwards=int(sys.argv[1]), warmup=1)
    """))
    json_path = tmp_path / "s.json"
    code = main(["profile", "--json", str(json_path), "--script", str(script), "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"diffusion_fuse profile: script {script}" in out
    d = json.loads(json_path.read_text())
    assert d["forwards"] == 1
    assert any(c["kind"] == "ours" for c in d["classes"])
    empty = tmp_path / "nothing.py"
    empty.write_text("pass\n")
    assert main(["profile", "--script", str(empty)]) == 2
    assert "made no diffusion_fuse.profile report" in capsys.readouterr().out


def test_cli_module_callable(tmp_path, monkeypatch, capsys):
    """``profile MODULE:CALLABLE`` takes the user's own model as ``inspect`` does: CALLABLE() returns (model, args,
    kwargs)."""
    (tmp_path / "prof_user.py").write_text(textwrap.dedent("""
        from helpers import AdaLN, adaln_inputs

        def build():
            return AdaLN(32).eval(), adaln_inputs(dim=32, seq=8), {}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["profile", "--forwards", "1", "--warmup", "1", f"{tmp_path / 'prof_user.py'}:build"])
    out = capsys.readouterr().out
    assert code == 0
    assert "prof_user.py:build" in out and "ours: norm_modulate" in out and "left unfused" in out
    with pytest.raises(SystemExit, match="has no missing"):
        main(["profile", f"{tmp_path / 'prof_user.py'}:missing"])


# ------------------------------------------------------------------------------------------------------------------
# the GPU path on a synthetic trace (no GPU here): the profiler's event tree and kineto events, faked
# ------------------------------------------------------------------------------------------------------------------
class _Ev:
    """A ``torch._C._profiler._ProfilerEvent`` stand-in: what profile.py reads of one."""

    _ids = itertools.count(1)

    def __init__(self, name, start, end, corr=0, children=(), inputs=(), tag=None, alloc=None):
        from diffusion_fuse.profile import _ALLOCATION, _TORCH_OP

        self.id, self.name, self.correlation_id = next(self._ids), name, corr
        self.start_time_ns, self.end_time_ns, self.duration_time_ns = start, end, end - start
        self.tag = tag if tag is not None else (_ALLOCATION if alloc else _TORCH_OP)
        self.children, self.parent = list(children), None
        for c in self.children:
            c.parent = self
        if alloc:
            self.extra_fields = types.SimpleNamespace(allocation_id=alloc[0], alloc_size=alloc[1])
        else:
            self.extra_fields = types.SimpleNamespace(inputs=list(inputs))


class _K:
    """A ``_KinetoEvent`` stand-in (device activities and CUDA runtime calls)."""

    def __init__(self, name, device, corr, linked, start, end):
        self._n, self._d, self._c, self._l, self._s, self._e = name, device, corr, linked, start, end

    def name(self):
        return self._n

    def device_type(self):
        return self._d

    def correlation_id(self):
        return self._c

    def linked_correlation_id(self):
        return self._l

    def start_ns(self):
        return self._s

    def end_ns(self):
        return self._e


def _t(alloc_id, *shape):
    strides, n = [], 1
    for s in reversed(shape):
        strides.insert(0, n)
        n *= s
    return types.SimpleNamespace(sizes=list(shape), strides=strides, dtype=torch.float32, allocation_id=alloc_id,
                                 storage_data_ptr=0)


def _gpu_trace(graph_launch: bool):
    """One forward: our op (a user scope under node 0), an eager mul (node 1), a GEMM (node 2), a copy (node 3);
    or, with ``graph_launch``, the same kernels launched by one cudaGraphLaunch."""
    from torch.autograd import DeviceType

    from diffusion_fuse.profile import FORWARD_SCOPE

    cpu, cuda = DeviceType.CPU, DeviceType.CUDA
    kernels = [("ours_kernel", 1000, 1100), ("elementwise_kernel", 1100, 1150), ("gemm_kernel", 1150, 1400),
               ("Memcpy DtoD (Device -> Device)", 1380, 1450), ("elementwise_kernel", 1500, 1520)]
    if graph_launch:
        fwd = _Ev(FORWARD_SCOPE, 0, 900, children=[_Ev("Torch-Compiled Region: 0/0", 10, 800, corr=1)])
        events = [_K("cudaGraphLaunch", cpu, 500, 1, 50, 60)]
        events += [_K(n, cuda, 500, 1, s, e) for n, s, e in kernels]
        return fwd, events
    ours = _Ev("diffusion_fuse::some_op", 25, 95)
    mul = _Ev("aten::mul", 115, 190, corr=7, inputs=[_t(1, 4, 256), _t(2, 4, 256)],
              children=[_Ev("[memory]", 120, 120, alloc=(3, 4096))])
    addmm = _Ev("aten::addmm", 215, 290, corr=9, inputs=[_t(4, 256), _t(1, 4, 256), _t(5, 256, 256)])
    copy = _Ev("aten::copy_", 315, 390, corr=11, inputs=[_t(6, 4, 256), _t(3, 4, 256)])
    mul2 = _Ev("aten::mul", 415, 490, corr=13, inputs=[_t(3, 4, 256), _t(2, 4, 256)],
               children=[_Ev("[memory]", 420, 420, alloc=(7, 4096))])
    nodes = [_Ev(f"## {i} ##", 20 + 100 * i, 100 + 100 * i, corr=3 if i == 0 else 20 + i, children=[c])
             for i, c in enumerate([ours, mul, addmm, copy, mul2])]
    graph = _Ev("## fx_generated_x.py ##", 10, 800, corr=2, children=nodes)
    fwd = _Ev(FORWARD_SCOPE, 0, 900, children=[graph])
    links = [(3, 50), (7, 150), (9, 250), (11, 350), (13, 450)]  # our op's kernel links to its node's scope
    events = [_K("cuLaunchKernelEx" if i == 0 else "cudaLaunchKernel", cpu, 100 + i, link, t, t + 5)
              for i, (link, t) in enumerate(links)]
    events += [_K(n, cuda, 100 + i, links[i][0], s, e) for i, (n, s, e) in enumerate(kernels)]
    return fwd, events


def test_gpu_attribution_on_a_synthetic_trace():
    from diffusion_fuse.profile import MEMCPY, OTHER, _align_cudagraph, _analyze

    fwd, events = _gpu_trace(graph_launch=False)
    kr = types.SimpleNamespace(experimental_event_tree=lambda: [fwd], events=lambda: events)
    registry = {"fx_generated_x.py": {"node_metadata": {
        1: {"stack_trace": '  File "/m/model.py", line 12, in forward\n    y = x * 2\n'},
        4: {"stack_trace": '  File "/m/model.py", line 13, in forward\n    z = y * s\n'}}}}
    trace = _analyze(kr, True, lambda op: "fam", [("some_op", 100, 50)], registry)
    by = {(i.cls, i.name): i for i in trace.insts}
    assert by[(OURS + "fam", "some_op")].ns == 100 and by[(OURS + "fam", "some_op")].nbytes == 150
    muls = sorted((i for i in trace.insts if i.cls == EAGER), key=lambda i: i.start)
    assert [(i.name, i.ns, i.location, i.code) for i in muls] == [
        ("mul", 50, "/m/model.py:12 (forward)", "y = x * 2"), ("mul", 20, "/m/model.py:13 (forward)", "z = y * s")]
    assert by[("GEMM", "addmm")].ns == 250
    assert by[(MEMCPY, "copy_")].ns == 50  # 1400..1450: the part not under the GEMM
    assert trace.totals_ns == [520] and trace.host_ns == 50  # 1000..1520, idle 1450..1500
    assert sum(i.ns for i in trace.insts) + trace.host_ns == 520
    assert OTHER not in {i.cls for i in trace.insts}
    # bytes: mul reads two [4, 256] fp32 tensors and writes 4096 B that the next op reads
    assert trace.ctxs[0].group_bytes(muls[:1]) == 3 * 4096
    # both lines fused: the first mul's output stays inside (freed before the forward ends? never freed here: kept)
    assert trace.ctxs[0].group_bytes(muls) == 4 * 4096

    gfwd, gevents = _gpu_trace(graph_launch=True)
    graphed = _analyze(types.SimpleNamespace(experimental_event_tree=lambda: [gfwd], events=lambda: gevents), True,
                       lambda op: "fam", None, {})
    assert {i.cls for i in graphed.insts} == {OTHER, MEMCPY}  # a replay's kernels have no op around them
    _align_cudagraph(graphed, trace)
    got = collections.Counter()
    for i in graphed.insts:
        got[i.cls] += i.ns
    assert got == {OURS + "fam": 100, EAGER: 70, "GEMM": 250, MEMCPY: 50}
    assert any("5 of 5 kernels matched" in n for n in graphed.notes)


def test_a_variant_that_fails_is_left_out_and_said(monkeypatch):
    from helpers import AdaLN, adaln_inputs
    from torch._inductor import compile_fx

    def broken(*args, **kwargs):
        raise RuntimeError("Inductor stand-in failure")

    monkeypatch.setattr(compile_fx, "compile_fx", broken)
    x, emb = adaln_inputs()
    report = diffusion_fuse.profile(AdaLN().eval(), x, emb, forwards=1, warmup=1)
    assert report.variants == ["eager", "diffusion_fuse"]
    assert any(n.startswith("inductor: failed and left out: BackendCompilerFailed") for n in report.notes)
    assert report.families() and not any(ln.inductor for ln in report.lines)
