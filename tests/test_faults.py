"""Fault injection (lowering/faults.py): a wrong kernel is rejected site by site, a failing one falls back."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from helpers import AdaLN, adaln_inputs, bitwise_equal, compile_and_run
from html_report import parse, select

import diffusion_fuse
from diffusion_fuse.lowering import counters, faults
from diffusion_fuse.lowering.dispatch import GuardedKernel
from diffusion_fuse.testing.tiny_models import build

LN_OP = "diffusion_fuse::norm_modulate"


# --- the spec -------------------------------------------------------------------------------
def test_parse_spec():
    assert faults.parse("norm_modulate") == {"norm_modulate": faults.Fault("norm_modulate", "perturb", 0)}
    assert faults.parse("diffusion_fuse::norm_modulate:raise, other:perturb:7") == {
        "norm_modulate": faults.Fault("norm_modulate", "raise", 0), "other": faults.Fault("other", "perturb", 7)}
    for bad in ("norm_modulate:explode", "norm_modulate:perturb:-1", "norm_modulate:perturb:x", ":raise", "a:raise:1:2"):
        with pytest.raises(ValueError, match="op:kind"):
            faults.parse(bad)
    with pytest.raises(ValueError, match="kind"):
        with faults.inject("norm_modulate", kind="explode"):
            pass


@pytest.fixture
def fault_env(monkeypatch):
    """Set DIFFUSION_FUSE_FAULT for one test (re-read now, and again when the test is done)."""

    def set_env(value: str) -> None:
        monkeypatch.setenv(faults.ENV_VAR, value)
        faults.refresh()

    yield set_env
    monkeypatch.delenv(faults.ENV_VAR, raising=False)
    faults.refresh()


def test_context_manager_nests_and_wins_over_env(fault_env):
    fault_env("norm_modulate:raise")
    assert faults.active("norm_modulate").kind == "raise"
    with faults.inject("norm_modulate", "perturb", 3):
        assert faults.active("norm_modulate") == faults.Fault("norm_modulate", "perturb", 3)
        with faults.inject("diffusion_fuse::norm_modulate", "perturb", 4):
            assert faults.active("norm_modulate").index == 4
        assert faults.active("norm_modulate").index == 3
    assert faults.active("norm_modulate").kind == "raise"
    fault_env("")
    assert faults.active("norm_modulate") is None


# --- GuardedKernel, with a stand-in kernel ----------------------------------------------------
def make_op(name: str, kernel_ok: bool) -> GuardedKernel:
    def reference(x):
        return x * 2

    def guard(a):
        return (True, "") if kernel_ok else (False, "guard says no")

    # the arguments bound as the tuple itself: a[0] is x
    return GuardedKernel(name, lambda args: (args[0].shape, args[0].dtype), guard, lambda a: (lambda a: a[0] + a[0]),
                         reference, tuple)


def calls(op: str, since: dict) -> dict:
    d = counters.diff(counters.snapshot(), since)
    return {"kernel": d["kernel"].get(op, 0), **d["fallback"].get(op, {})}


def test_perturb_alters_kernel_and_reference_outputs():
    x = torch.arange(6.0).reshape(2, 3)
    for ok in (True, False):
        name = f"df_test_perturb_{ok}"
        op, since = make_op(name, ok), counters.snapshot()
        with faults.inject(name, "perturb", 4):
            out = op(x)
        assert torch.equal(out - x * 2, torch.tensor([[0.0, 0, 0], [0, 1, 0]]))
        assert torch.equal(op(x), x * 2)  # gone with the context
        assert calls(name, since) == ({"kernel": 2} if ok else {"kernel": 0, "guard says no": 2})


def test_raise_on_kernel_path_is_a_kernel_error(caplog):
    name = "df_test_raise_kernel"
    op, since = make_op(name, True), counters.snapshot()
    x = torch.ones(3)
    msg = f"RuntimeError: injected fault ({name}:raise)"
    with caplog.at_level(logging.WARNING, logger="diffusion_fuse"), faults.inject(name, "raise"):
        assert torch.equal(op(x), x * 2)  # the reference result
        assert torch.equal(op(x), x * 2)
    assert any("kernel failed, using the reference path" in r.message and msg in r.getMessage()
               for r in caplog.records)
    # As after a real failure, the kernel stays disabled for that layout.
    assert torch.equal(op(x), x * 2)
    assert calls(name, since) == {"kernel": 0, f"kernel error: {msg}": 1, f"kernel disabled after error: {msg}": 2}


def test_raise_where_no_kernel_runs_stands_in_for_one(caplog):
    name = "df_test_raise_ref"
    op, since = make_op(name, False), counters.snapshot()
    x = torch.ones(3)
    msg = f"RuntimeError: injected fault ({name}:raise)"
    with caplog.at_level(logging.WARNING, logger="diffusion_fuse"), faults.inject(name, "raise"):
        op(x), op(x)
        op(torch.ones(4))  # another layout fails once too
    assert torch.equal(op(x), x * 2)
    assert calls(name, since) == {"kernel": 0, f"kernel error: {msg}": 2, f"kernel disabled after error: {msg}": 1,
                           "guard says no": 1}
    assert sum("kernel failed" in r.message for r in caplog.records) == 2


def test_a_plan_that_raises_is_a_kernel_error_not_the_forwards(caplog):
    # Planning may compile and launch (grouped_gemv probes cuBLAS's order there): its failure must not reach
    # the caller, and the layout must not plan again on every call.
    name, planned = "df_test_plan_raises", []

    def plan(a):
        planned.append(1)
        raise RuntimeError("probe launch failed")

    op = GuardedKernel(name, lambda args: (args[0].shape, args[0].dtype), lambda a: (True, ""), plan, lambda x: x * 2,
                       tuple)
    since, x = counters.snapshot(), torch.ones(3)
    with caplog.at_level(logging.WARNING, logger="diffusion_fuse"):
        assert torch.equal(op(x), x * 2) and torch.equal(op(x), x * 2)
    msg = "RuntimeError: probe launch failed"
    assert planned == [1] and calls(name, since) == {"kernel": 0, f"kernel disabled after error: {msg}": 2}
    assert sum("planning the kernel failed" in r.message and msg in r.getMessage() for r in caplog.records) == 1


def test_tensors_off_the_current_cuda_device_take_the_reference_path():
    # Triton launches on the current device: a tensor elsewhere would be read through the wrong context.
    from torch._subclasses.fake_tensor import FakeTensorMode

    from diffusion_fuse.lowering.dispatch import off_device_reason

    with FakeTensorMode(allow_non_fake_inputs=True):
        on1 = torch.empty(2, device="cuda:1")
        on0 = torch.empty(2, device="cuda:0")
    assert off_device_reason((on0, [on0, None], 3), 0) == ""
    assert "torch.cuda.set_device(1)" in off_device_reason((on0, [on0, on1]), 0)
    assert off_device_reason((torch.ones(2),), 0) == ""  # CPU tensors (the interpreter) are not CUDA's business


# --- whole models -----------------------------------------------------------------------------
def adaln_kwargs():
    return dict(zip(("x", "emb"), adaln_inputs()))


def test_perturbed_kernel_rejects_every_site_of_the_op_on_tiny_flux(tmp_path):
    model, kwargs = build("flux", torch.bfloat16)
    with faults.inject("norm_modulate", "perturb", 37):
        ref, out, report = compile_and_run(model, kwargs)
    assert bitwise_equal(ref, out)  # the verifier put every bad site back
    sites = report.sites()
    # the AdaLN sites (families pointwise, linear_cat and grouped_gemv add their own)
    assert sum(s.pattern not in ("pointwise", "linear_cat", "grouped_gemv") for s in sites) == 6
    ln_sites = [s for s in sites if s.after == LN_OP]
    assert ln_sites and all(s.status == "rejected" for s in ln_sites)
    assert all(s.status == "kept" for s in sites if s.after != LN_OP)  # other ops are untouched
    for s in ln_sites:
        assert s.first_diff["index"] == [0, 1, 5] and s.first_diff["count"] == 1  # element 37 of [1, S, 32]
        assert s.first_diff["got"] != s.first_diff["expected"]
        assert "1/" in s.reason and "first at [0, 1, 5]" in s.reason
    report.save_html(str(tmp_path / "r.html"))
    els = parse((tmp_path / "r.html").read_text(encoding="utf-8"))
    rows = {r.data("site-id"): r for r in select(els, "tr", "site")}
    assert len(rows) == len(sites)
    for s in ln_sites:
        row = rows[s.id]
        assert row.data("status") == "rejected" and json.loads(row.data("first-diff-index")) == [0, 1, 5]
        assert float(row.data("expected")) == s.first_diff["expected"] and float(row.data("got")) == s.first_diff["got"]
        assert f"expected {s.first_diff['expected']!r}, got {s.first_diff['got']!r}" in row.text
    rejected = [d for d in select(els, "section", "site-detail") if d.data("status") == "rejected"]
    assert sorted(d.data("site-id") for d in rejected) == sorted(s.id for s in ln_sites)
    fam = {f.data("family"): f for f in select(els, "tr", "family")}
    assert int(fam["norm_modulate"].data("rejected")) == sum(s.pattern == "norm_modulate" for s in ln_sites)


def test_raise_keeps_the_sites_and_counts_kernel_errors(caplog):
    kwargs = adaln_kwargs()
    with caplog.at_level(logging.WARNING, logger="diffusion_fuse"), faults.inject("norm_modulate", "raise"):
        ref, out, report = compile_and_run(AdaLN().eval(), kwargs)
    assert bitwise_equal(ref, out)
    (site,) = report.sites()
    assert site.status == "kept"  # the reference result is what a failing kernel returns
    # One call in the verifier's check, one in the fused run: the first fails, the second finds
    # the stand-in kernel disabled for that layout (or fails too if its layout differs).
    errors = report.counters()["fallback"]["norm_modulate"]
    msg = "RuntimeError: injected fault (norm_modulate:raise)"
    assert set(errors) <= {f"kernel error: {msg}", f"kernel disabled after error: {msg}"}
    assert errors[f"kernel error: {msg}"] >= 1 and sum(errors.values()) == 2
    (row,) = [r for r in report.summary() if r["family"] == "norm_modulate"]
    assert row["kernel errors"] == 2 and row["guard fallbacks"] == 0 and row["kernel hits"] == 0
    assert any("kernel failed" in r.message for r in caplog.records)


def test_env_var_injects_too(fault_env):
    fault_env("norm_modulate:perturb:0")
    ref, out, report = compile_and_run(AdaLN().eval(), adaln_kwargs())
    assert bitwise_equal(ref, out)
    (site,) = report.sites()
    assert site.status == "rejected" and site.first_diff["index"] == [0, 0, 0]
    assert "rejected" in report.table() and "first at [0, 0, 0]" in report.table()


def test_explain_under_fault_lists_the_rejection():
    with faults.inject("norm_modulate", "perturb", 5):
        report = diffusion_fuse.explain(AdaLN().eval(), **adaln_kwargs())
    (row,) = [r for r in report.summary() if r["family"] == "norm_modulate"]
    assert row["matched"] == 1 and row["rejected"] == 1 and row["kept"] == 0
