"""What a user can rely on (issue 32): layouts judged, no forward failed by the report or a user's op, option errors
when ``torch.compile`` is called, one report per compile.

1. the verifier holds every site output to the reference's dtype, shape and strides, and the graph outputs to those
   and the alignment their storage offset gives them;
2. a report path is checked when the options are parsed; a report that cannot be written later is logged and noted;
3. ``register_pattern`` traces the replacement on fake tensors; a user op that raises takes the reference path; an
   unused user pattern and an unknown fault target are reported;
4. ``torch.compile(m, backend="diffusion_fuse", options=...)`` raises ``ValueError`` for a bad option itself;
5. each compile has its own report (``report_of``), ``last_report()`` is the last compile's, ``process_report()``
   holds every graph until ``reset_reports()``; a site id has one verdict; tier high states its tolerance verdict.
"""

from __future__ import annotations

import json
import logging
import re
import shutil

import pytest
import torch
from helpers import AdaLN, adaln_inputs, bitwise_equal
from torch import Tensor

import diffusion_fuse
from diffusion_fuse import parse_options
from diffusion_fuse.lowering import faults


def _compile(model, options=None, **kw):
    report = diffusion_fuse.Report()
    return torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(options, report), **kw), report


class MulAdd(torch.nn.Module):
    def forward(self, x, y):
        return x * y + 1


def mul_add(x, y):
    return x * y + 1


def _xy(rows: int = 8, cols: int = 3):
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, cols, generator=g), torch.randn(rows, cols, generator=g)


@pytest.fixture
def user_pattern():
    names = []

    def register(name, replacement, search=mul_add, **kw):
        fam = diffusion_fuse.register_pattern(name, search, replacement, list(_xy()), **kw)
        names.append(name)
        return fam

    yield register
    for name in names:
        diffusion_fuse.unregister_pattern(name)


# --- 1. layouts ---------------------------------------------------------------------------------------------------
@torch.library.custom_op("df_contracts::transposed_mul", mutates_args=())
def transposed_mul(x: Tensor, y: Tensor) -> Tensor:
    """x * y with eager's values, written column-major (its fake says row-major, as ``x * y`` is)."""
    out = torch.empty(x.shape[::-1], dtype=x.dtype, device=x.device).t()
    return out.copy_(x * y)


@transposed_mul.register_fake
def _(x, y):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("df_contracts::offset_mul", mutates_args=())
def offset_mul(x: Tensor, y: Tensor) -> Tensor:
    """x * y with eager's values and strides, one element into a larger buffer (storage offset 1)."""
    buf = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    return buf[1:].view(x.shape).copy_(x * y)


@offset_mul.register_fake
def _(x, y):
    return torch.empty_like(x)


def test_a_site_output_with_other_strides_is_rejected_and_the_output_keeps_eagers_strides(user_pattern):
    user_pattern("transposed", lambda x, y: torch.ops.df_contracts.transposed_mul(x, y) + 1)
    x, y = _xy()
    c, report = _compile(MulAdd())
    with torch.no_grad():
        out = c(x, y)
    ref = MulAdd()(x, y)
    assert bitwise_equal(ref, out) and out.stride() == ref.stride() == (3, 1)
    out.view(-1)  # eager's output is viewable; so is the compiled one
    (site,) = [s for s in report.sites() if s.pattern == "transposed"]
    assert site.status == "rejected" and "strides (1, 8)" in site.reason and "(3, 1)" in site.reason, site.reason


def test_a_graph_output_at_a_misaligned_storage_offset_is_rejected(user_pattern):
    user_pattern("offset", lambda x, y: torch.ops.df_contracts.offset_mul(x, y), search=lambda x, y: x * y)

    class Mul(torch.nn.Module):
        def forward(self, x, y):
            return x * y

    x, y = _xy()
    c, report = _compile(Mul())
    with torch.no_grad():
        out = c(x, y)
    assert bitwise_equal(x * y, out) and out.storage_offset() == 0
    (site,) = [s for s in report.sites() if s.pattern == "offset"]
    why = "storage offset 1 (data pointer not 16-byte aligned) where the reference has 0"
    assert site.status == "rejected" and why in site.reason, site.reason


def test_the_end_to_end_check_judges_strides_and_storage_offset():
    from diffusion_fuse.verify.verifier import VerifiedGraph

    ref = torch.randn(4, 3)
    base = torch.empty(13).copy_(torch.cat([torch.zeros(1), ref.flatten()]))
    _, v = VerifiedGraph._run_checked(lambda: base[1:].view(4, 3), [], ref)
    assert not v and "storage offset 1" in v.detail
    _, v = VerifiedGraph._run_checked(lambda: ref.t().contiguous().t(), [], ref)
    assert not v and "strides (1, 4)" in v.detail
    _, v = VerifiedGraph._run_checked(lambda: [ref.clone()], [], [ref])
    assert v


def test_layout_difference_sees_what_can_be_observed():
    from diffusion_fuse.verify.compare import layout_difference

    a = torch.randn(4, 3)
    assert layout_difference(a, a.clone()) == ""
    assert "strides (1, 4)" in layout_difference(a, a.t().contiguous().t())
    assert "dtype" in layout_difference(a, a.double()) and "shape" in layout_difference(a, a[:2])
    # a size-1 dimension's stride addresses nothing; an empty tensor has no layout to see
    assert layout_difference(torch.empty(4, 1), torch.empty_strided((4, 1), (1, 7))) == ""
    assert layout_difference(torch.empty(0, 3), torch.empty_strided((0, 3), (1, 5))) == ""
    base = torch.randn(13)
    assert layout_difference(a, base[1:].view(4, 3)) == ""  # offsets only where asked (graph outputs)
    assert "storage offset 1" in layout_difference(a, base[1:].view(4, 3), offset=True)
    # an offset that keeps the data pointer 16-byte aligned (an output in a shared buffer) is no difference
    assert layout_difference(a, torch.randn(16)[4:].view(4, 3), offset=True) == ""


# --- 2. the report path -------------------------------------------------------------------------------------------
def test_an_unwritable_report_path_is_a_value_error_when_the_options_are_parsed(tmp_path):
    with pytest.raises(ValueError, match=r"option report='/nonexistent/dir/r.json' is not allowed; .*"
                                         r"/nonexistent/dir does not exist"):
        parse_options({"report": "/nonexistent/dir/r.json"})
    with pytest.raises(ValueError, match="is a directory"):
        parse_options({"report": str(tmp_path)})
    assert parse_options({"report": str(tmp_path / "r.json")}).report == str(tmp_path / "r.json")


def test_a_report_that_cannot_be_written_later_never_fails_the_forward(tmp_path, caplog):
    d = tmp_path / "gone"
    d.mkdir()
    path = str(d / "r.json")
    c, report = _compile(AdaLN(), {"report": path})
    shutil.rmtree(d)  # valid when parsed, gone when the verifier writes
    x, emb = adaln_inputs()
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="diffusion_fuse"):
        out = c(x, emb)
    assert bitwise_equal(AdaLN_ref(c)(x, emb), out)
    assert any(f"report not written to {path}" in n for n in report.graphs[0].notes), report.graphs[0].notes
    assert f"report not written to {path}" in caplog.text


def AdaLN_ref(compiled):  # noqa: N802 - the eager module behind a compiled one
    return compiled._orig_mod


# --- 3. user patterns and faults ----------------------------------------------------------------------------------
class _Calls:
    n = 0


@torch.library.custom_op("df_contracts::cuda_only_mul", mutates_args=())
def cuda_only_mul(x: Tensor, y: Tensor) -> Tensor:
    """A CUDA-only kernel: raises on any other device."""
    if x.device.type != "cuda":
        raise RuntimeError("cuda_only_mul runs on CUDA only")
    return x * y


@cuda_only_mul.register_fake
def _(x, y):
    return torch.empty_like(x)


@torch.library.custom_op("df_contracts::late_failing_mul", mutates_args=())
def late_failing_mul(x: Tensor, y: Tensor) -> Tensor:
    """Right for its first two calls (the verifier's site check and end-to-end run), raises from the third on."""
    _Calls.n += 1
    if _Calls.n > 2:
        raise RuntimeError("late_failing_mul failed")
    return x * y


@late_failing_mul.register_fake
def _(x, y):
    return torch.empty_like(x)


def test_register_pattern_traces_the_replacement_on_fake_tensors(user_pattern):
    # the README's CPU example inputs, a CUDA-only kernel with a fake impl: registering runs no kernel
    fam = user_pattern("cuda_only", lambda x, y: torch.ops.df_contracts.cuda_only_mul(x, y) + 1)
    assert fam.name == "cuda_only"


def _errors(report, pattern):
    (row,) = [r for r in report.summary() if r["family"] == pattern]
    return row["kernel errors"]


def test_a_user_op_that_raises_takes_the_reference_path(user_pattern, caplog):
    user_pattern("cuda_only", lambda x, y: torch.ops.df_contracts.cuda_only_mul(x, y) + 1)
    x, y = _xy()
    c, report = _compile(MulAdd())
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="diffusion_fuse"):
        outs = [c(x, y) for _ in range(2)]
    assert all(bitwise_equal(mul_add(x, y), o) for o in outs)
    (site,) = [s for s in report.sites() if s.pattern == "cuda_only"]
    assert site.status == "kept"  # the reference path is what a failing kernel returns, as for built-in ops
    assert _errors(report, "cuda_only") >= 1
    assert "cuda_only_mul runs on CUDA only" in report.table() and "kernel failed" in caplog.text


def test_a_user_op_that_raises_after_verification_never_fails_the_forward(user_pattern, caplog):
    user_pattern("late_failing", lambda x, y: torch.ops.df_contracts.late_failing_mul(x, y) + 1)
    _Calls.n = 0
    x, y = _xy()
    c, report = _compile(MulAdd())
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="diffusion_fuse"):
        outs = [c(x, y) for _ in range(3)]  # the first call verifies; the op fails from the second on
    assert all(bitwise_equal(mul_add(x, y), o) for o in outs)
    assert _errors(report, "late_failing") >= 1
    assert "late_failing_mul failed" in caplog.text


def test_a_tier_high_user_pattern_under_lossless_is_reported(user_pattern, caplog):
    user_pattern("high_only", lambda x, y: x * y + 1, tier="high", exact=False)
    x, y = _xy()
    c, report = _compile(MulAdd())
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="diffusion_fuse"):
        c(x, y)
    assert report.count("high_only") == 0
    why = "user pattern 'high_only' (tier high) is not searched in tier lossless"
    assert any(why in n for n in report.graphs[0].notes), report.graphs[0].notes
    assert why in report.table() and why in caplog.text


def test_a_user_pattern_that_matched_nothing_is_noted(user_pattern):
    user_pattern("never", lambda x, y: x * y + 1, search=lambda x, y: x * y - 7)
    c, report = _compile(MulAdd())
    with torch.no_grad():
        c(*_xy())
    assert "user pattern 'never': no site in this graph" in report.graphs[0].notes, report.graphs[0].notes


def test_a_fault_for_an_unknown_op_is_an_error_naming_the_known_ones(monkeypatch, caplog, capsys):
    with pytest.raises(ValueError, match=r"unknown op 'nosuchop'; known ops: \[.*'norm_modulate'"):
        with faults.inject("nosuchop", "perturb"):
            pass
    from diffusion_fuse.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["inspect", "--model", "flux", "--fault", "nosuchop:perturb"])
    assert e.value.code == 2 and "unknown op 'nosuchop'" in capsys.readouterr().err
    # the variable is read at import, before any user op exists: a warning, not an error
    monkeypatch.setenv(faults.ENV_VAR, "nosuchop:perturb")
    try:
        with caplog.at_level(logging.WARNING, logger="diffusion_fuse"):
            faults.refresh()
        assert "DIFFUSION_FUSE_FAULT names unknown op 'nosuchop'" in caplog.text and "norm_modulate" in caplog.text
    finally:
        monkeypatch.delenv(faults.ENV_VAR)
        faults.refresh()


# --- 4. options at torch.compile ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    ({"options": {"qualty": "high"}}, r"unknown option\(s\) \['qualty'\]; allowed options: \['atol'"),
    ({"options": {"quality": "exact"}}, r"option quality='exact' is not allowed; allowed: \['lossless', 'high'\]"),
    ({"options": {"report": "/nonexistent/dir/r.json"}}, "option report='/nonexistent/dir/r.json' is not allowed"),
    ({"mode": "fastest"}, r"option mode='fastest' is not allowed; allowed: \[None, 'default'"),
])
def test_bad_options_raise_value_error_when_torch_compile_is_called(kwargs, message):
    with pytest.raises(ValueError, match=message):
        torch.compile(torch.nn.Linear(4, 4), backend="diffusion_fuse", **kwargs)


def test_a_backend_object_takes_its_options_itself():
    with pytest.raises(ValueError, match=r"DiffusionFuseBackend\(options\)"):
        torch.compile(torch.nn.Linear(4, 4), backend=diffusion_fuse.DiffusionFuseBackend(), options={"verify": True})


def test_without_the_torch_compile_check_a_bad_option_is_a_plain_value_error_on_the_first_call(monkeypatch):
    # another torch without ``_TorchCompileWrapper``: the options reach the backend on the first compile, and the
    # error is a ValueError there too, not Dynamo's BackendCompilerFailed
    monkeypatch.setattr(torch._TorchCompileWrapper, "__init__", torch._TorchCompileWrapper.__init__.__wrapped__)
    compiled = torch.compile(torch.nn.Linear(4, 4), backend="diffusion_fuse", options={"qualty": "high"})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['qualty'\]") as e:
        compiled(torch.randn(2, 4))
    assert not isinstance(e.value, torch._dynamo.exc.BackendCompilerFailed)


# --- 5. reports -----------------------------------------------------------------------------------------------------
def test_each_compile_has_its_own_report(tmp_path):
    diffusion_fuse.reset_reports()
    x, emb = adaln_inputs()
    a = torch.compile(AdaLN(), backend="diffusion_fuse")
    b = torch.compile(AdaLN(dim=32, out_proj=True), backend="diffusion_fuse")
    with torch.no_grad():
        a(x, emb)
        assert diffusion_fuse.last_report() is diffusion_fuse.report_of(a)
        b(x, emb)
    ra, rb = diffusion_fuse.report_of(a), diffusion_fuse.report_of(b)
    assert ra is not rb and len(ra.graphs) == len(rb.graphs) == 1
    assert diffusion_fuse.last_report() is rb
    # explain() and a compile with a report path are compiles too
    explained = diffusion_fuse.explain(AdaLN(), x, emb)
    assert diffusion_fuse.last_report() is explained
    c = torch.compile(AdaLN(), backend="diffusion_fuse", options={"report": str(tmp_path / "r.json")})
    with torch.no_grad():
        c(x, emb)
    assert diffusion_fuse.last_report() is diffusion_fuse.report_of(c)
    every = diffusion_fuse.process_report()
    assert [g.graph_id for g in every.graphs] == [g.graph_id for r in (ra, rb, explained, diffusion_fuse.report_of(c))
                                                  for g in r.graphs]
    diffusion_fuse.reset_reports()
    assert diffusion_fuse.process_report().graphs == [] and diffusion_fuse.last_report().graphs == []
    assert len(ra.graphs) == 1  # a compile's own report stays


def test_report_of_a_module_whose_blocks_were_compiled_in_place():
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([AdaLN(), AdaLN()])

        def forward(self, x, emb):
            for b in self.blocks:
                x = b(x, emb)
            return x

    model = Two()
    for block in model.blocks:  # what diffusers' compile_repeated_blocks does
        block.compile(backend="diffusion_fuse")
    x, emb = adaln_inputs()
    with torch.no_grad():
        model(x, emb)
    report = diffusion_fuse.report_of(model)
    assert len(report.graphs) == 1 and [s.status for s in report.sites()] == ["kept"]
    with pytest.raises(ValueError, match="not compiled with diffusion_fuse"):
        diffusion_fuse.report_of(torch.nn.Linear(2, 2))


def test_a_site_id_has_one_verdict():
    # a static graph (kept), then the dynamic graph of a second resolution under a fault (rejected): one site id,
    # one row per graph it is in, each with its graph
    c, report = _compile(AdaLN())
    with torch.no_grad():
        c(*adaln_inputs(seq=8))
        with faults.inject("norm_modulate", "perturb", 3):
            c(*adaln_inputs(seq=16))
    statuses = [(s.id, s.status) for s in report.sites()]
    assert len(statuses) == 2 and statuses[0][0] == statuses[1][0] and {st for _, st in statuses} == {"kept",
                                                                                                       "rejected"}
    table = report.table()
    for g, status in ((0, "kept"), (1, "rejected")):  # each row labelled with its graph
        assert re.search(rf"norm_modulate@\S+#0 \(graph {g}\)\s+{status}", table), table
    data = json.dumps(report.to_dict())
    assert data.count('"status": "rejected"') == 1


def test_a_site_put_back_end_to_end_has_one_verdict(user_pattern):
    user_pattern("offset", lambda x, y: torch.ops.df_contracts.offset_mul(x, y), search=lambda x, y: x * y)

    class Mul(torch.nn.Module):
        def forward(self, x, y):
            return x * y

    c, report = _compile(Mul())
    with torch.no_grad():
        c(*_xy())
    (site,) = report.sites()
    assert site.status == "rejected" and site.verdict != "bitwise equal", site.verdict


def test_tier_high_sites_keep_their_source_lines_and_the_text_states_the_tolerance_verdict():
    c, report = _compile(AdaLN(), {"quality": "high"})
    with torch.no_grad():
        c(*adaln_inputs())
    (g,) = report.graphs
    assert g.sites and all("helpers.py:" in sid for sid in g.sites) and g.inductor_sites == sorted(g.sites)
    assert all(s.location.startswith("tests/helpers.py:") or "helpers.py:" in s.location for s in g.sites.values())
    assert f"graph {g.graph_id}: Inductor's output is within tolerance of the verified graph" in report.table()
