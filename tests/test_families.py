"""Conformance: every registered family, none listed here, against the contract of a family.

For each family's ``example()`` (patterns/<family>.py), compiled by the backend on the CPU:

- it holds at least one site of the family, the verifier keeps every site, and the output is eager's bits: the
  op's reference equals the ATen chain it replaced (tier-high families within tolerance);
- each op call's fake impl gives the reference's dtype, shape and strides (``torch.library.opcheck``);
- a rejected guard takes the reference path, and the call is counted with the guard's reason;
- site ids are the same when the model is traced again;
- every near miss has a reason, and ``near_miss_example()`` (where the family has one) gives the family one.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from helpers import bitwise_equal

import diffusion_fuse
from diffusion_fuse.lowering import counters
from diffusion_fuse.lowering.spec import BY_OVERLOAD
from diffusion_fuse.patterns.registry import REGISTRY

FAMILIES = [f.name for f in REGISTRY.families()]


def family_options(family) -> dict:
    """Options under which ``family`` is searched: its tier, and the family turned on if it is off by default."""
    options = {"quality": family.tier} if family.tier == "high" else {}
    return options if family.on_by_default else {**options, "patterns": {family.name: True}}


def compile_example(family, example, calls: int = 1):
    """(eager output, compiled output, report, the runtime graphs' op calls with their argument values)."""
    fn, args = example
    report = diffusion_fuse.Report()
    options = family_options(family)
    compiled = torch.compile(fn, backend=diffusion_fuse.DiffusionFuseBackend(options, report), fullgraph=True)
    with torch.no_grad():
        ref = fn(*args)
        for _ in range(calls):
            out = compiled(*args)
    return ref, out, report


def op_calls(fn, args, options=None) -> list[tuple[object, tuple]]:
    """Every call of one of our ops in the rewritten graph of ``fn``, with the values it was called with."""
    from torch._dynamo.backends.common import aot_autograd

    from diffusion_fuse.backend import parse_options
    from diffusion_fuse.fxpasses import PassManager

    calls = []

    class Recorder(fx.Interpreter):
        def call_function(self, target, a, kw):
            if target in BY_OVERLOAD:
                calls.append((target, a))
            return super().call_function(target, a, kw)

    def compiler(gm, _):
        fused, _ctx = PassManager(parse_options(options)).rewrite(gm)
        return lambda *a: Recorder(fused).run(*a)

    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=compiler, inference_compiler=compiler),
                      fullgraph=True)(*args)
    return calls


@pytest.fixture(autouse=True)
def _cpu_graphs_hold_fused_rms_norm(fused_rms_norm_kernel_on_cpu):
    yield


@pytest.mark.parametrize("name", FAMILIES)
def test_the_example_is_a_kept_site_with_eagers_output(name):
    family = REGISTRY.get(name)
    example = family.example()
    assert example is not None, f"family {name} has no example()"
    ref, out, report = compile_example(family, example)
    sites = [s for s in report.sites() if s.pattern == name]
    assert sites, report.table()
    assert all(s.status == "kept" for s in report.sites()), report.table()
    if family.tier == "lossless":
        assert bitwise_equal(ref, out)
    else:
        assert all(torch.allclose(r.float(), o.float(), rtol=2e-2, atol=1e-3)
                   for r, o in zip(*(x if isinstance(x, tuple) else (x,) for x in (ref, out))))


@pytest.mark.parametrize("name", FAMILIES)
def test_the_fake_impl_is_the_references_layout(name):
    family = REGISTRY.get(name)
    fn, args = family.example()
    calls = op_calls(fn, args, family_options(family))
    assert calls
    for target, a in calls:
        torch.library.opcheck(target, a, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("name", FAMILIES)
def test_a_rejected_guard_takes_the_reference_path(name):
    family = REGISTRY.get(name)
    fn, args = family.example()
    calls = op_calls(fn, args, family_options(family))
    for target, a in calls:
        spec = BY_OVERLOAD[target]
        a = tuple(a)
        dispatch = spec.dispatch
        reason = f"rejected by {__name__}"
        guard = dispatch.guard
        dispatch.guard = lambda _a, reason=reason: (False, reason)
        dispatch._plans.clear()
        try:
            before = counters.snapshot()
            got = target(*a)
            ctr = counters.diff(counters.snapshot(), before)
        finally:
            dispatch.guard = guard
            dispatch._plans.clear()
        assert ctr["fallback"].get(spec.name) == {reason: 1} and not ctr["kernel"].get(spec.name), ctr
        assert bitwise_equal(list(got) if isinstance(got, (list, tuple)) else got,
                             list(r) if isinstance(r := spec.reference(*a), (list, tuple)) else r)


@pytest.mark.parametrize("name", FAMILIES)
def test_site_ids_are_stable_across_retraces(name):
    family = REGISTRY.get(name)
    ids = []
    for _ in range(2):
        torch._dynamo.reset()
        _, _, report = compile_example(family, family.example())
        ids.append(sorted(s.id for s in report.sites()))
    assert ids[0] == ids[1] and ids[0]


@pytest.mark.parametrize("name", FAMILIES)
def test_near_misses_carry_a_reason(name):
    family = REGISTRY.get(name)
    for example, must_miss in ((family.example(), False), (family.near_miss_example(), True)):
        if example is None:
            continue
        _, _, report = compile_example(family, example)
        misses = [m for g in report.graphs for m in g.near_misses]
        assert all(m.reason.strip() for m in misses), misses
        if must_miss:
            assert any(m.pattern == name for m in misses), report.table()
