"""patterns/linear_gelu.py and lowering/linear_gelu.py on the CPU: the pattern, its default, the reference.

The kernel itself (kernels/linear_gelu.py, Gluon, sm_90 only) is built for sm_90 in
tests/kernels/test_compile_sm90.py and checked bitwise against eager in tests/gpu/test_linear_gelu_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import bitwise_equal, compile_and_run

from diffusion_fuse.kernels.linear_gelu import GLUON_ERROR
from diffusion_fuse.lowering import counters
from diffusion_fuse.lowering.linear_gelu import (can_use_linear_gelu, can_use_linear_gelu_cat,
                                                 linear_gelu_cat_reference, linear_gelu_reference)
from diffusion_fuse.testing.tiny_models import build

ON = {"patterns": {"linear_gelu": True}}


def _sites(report, status=None):
    return [v for g in report.graphs for k, v in g.sites.items()
            if k.startswith("linear_gelu") and (status is None or v.status == status)]


def _ops(report):
    return sorted(v.after for v in _sites(report, "kept"))


def test_off_by_default():
    model, kwargs = build("flux")
    ref, out, report = compile_and_run(model, kwargs)
    assert bitwise_equal(ref, out) and not _sites(report)


@pytest.mark.parametrize("name, n_sites", [("flux", 3), ("wan22_ti2v", 2), ("sd35", 3), ("qwen_image", 1)])
def test_feed_forward_up_projections_become_one_op_and_equal_eager(name, n_sites):
    # FLUX: the double block's image and text FF and the single block's proj_mlp + act_mlp
    torch._dynamo.reset()
    model, kwargs = build(name)
    ref, out, report = compile_and_run(model, kwargs, options=ON)
    assert bitwise_equal(ref, out)
    assert len(_sites(report, "kept")) == n_sites, [s.status for s in _sites(report)]
    if name == "flux":  # the single block's gelu goes straight into its cat with the attention output
        assert _ops(report) == ["diffusion_fuse::linear_gelu"] * 2 + ["diffusion_fuse::linear_gelu_cat"]


class _Linear(torch.nn.Module):
    def __init__(self, approximate="tanh", bias=True, extra_user=False, dtype=torch.bfloat16):
        super().__init__()
        self.fc = torch.nn.Linear(64, 96, bias=bias, dtype=dtype)
        self.approximate, self.extra_user = approximate, extra_user

    def forward(self, x):
        y = self.fc(x)
        g = F.gelu(y, approximate=self.approximate)
        return g + y if self.extra_user else g


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(2, 5, 64), (7, 64)])  # a 2-D input's linear has no view
def test_both_gelus_with_and_without_bias(approximate, bias, shape):
    torch._dynamo.reset()
    model = _Linear(approximate, bias)
    ref, out, report = compile_and_run(model, {"x": torch.randn(*shape, dtype=torch.bfloat16)}, options=ON)
    assert bitwise_equal(ref, out) and len(_sites(report, "kept")) == 1


def test_a_linear_read_by_more_than_the_gelu_is_a_near_miss():
    torch._dynamo.reset()
    ref, out, report = compile_and_run(_Linear(extra_user=True), {"x": torch.randn(2, 3, 64, dtype=torch.bfloat16)},
                                       options=ON)
    assert bitwise_equal(ref, out) and not _sites(report)
    reasons = [n.reason for g in report.graphs for n in g.near_misses if n.pattern == "linear_gelu"]
    assert reasons and "users (needs 1: the gelu)" in reasons[0]


def test_fp32_is_left_alone():
    torch._dynamo.reset()
    ref, out, report = compile_and_run(_Linear(dtype=torch.float32), {"x": torch.randn(3, 64)}, options=ON)
    assert bitwise_equal(ref, out) and not _sites(report)


def test_reference_is_eagers_chain():
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g).bfloat16() for s in ((4, 7, 64), (96, 64), (96,)))
    for approximate in ("tanh", "none"):
        assert torch.equal(linear_gelu_reference(x, w, b, approximate), F.gelu(F.linear(x, w, b), approximate=approximate))
    assert torch.equal(linear_gelu_reference(x, w, None), F.gelu(F.linear(x, w), approximate="tanh"))


def test_the_cpu_takes_the_reference_path_and_says_why():
    x, w, b = torch.randn(256, 64).bfloat16(), torch.randn(96, 64).bfloat16(), torch.randn(96).bfloat16()
    ok, why = can_use_linear_gelu(x, w, b, "tanh")
    assert not ok and why == (GLUON_ERROR or "device is cpu")
    counters.reset()
    out = torch.ops.diffusion_fuse.linear_gelu(x, w, b, "tanh")
    assert torch.equal(out, linear_gelu_reference(x, w, b, "tanh"))
    ((reason, n),) = counters.snapshot()["fallback"]["linear_gelu"].items()
    assert reason == why and n == 1


def test_the_plan_takes_the_call_the_dispatcher_makes(monkeypatch):
    # The dispatcher leaves out an argument equal to its schema default (approximate="tanh"): the guard, the
    # layout key, the plan and its launch are all called with 3 arguments then (the H200 run caught the plan).
    import inspect

    from diffusion_fuse.kernels.linear_gelu import plan_linear_gelu
    from diffusion_fuse.lowering import linear_gelu as lowering

    from diffusion_fuse.kernels.linear_gelu import plan_linear_gelu_cat

    for fn in (plan_linear_gelu, lowering.can_use_linear_gelu, lowering.layout_key, lowering.linear_gelu_reference,
               plan_linear_gelu_cat, lowering.can_use_linear_gelu_cat, lowering.cat_layout_key,
               lowering.linear_gelu_cat_reference):
        assert inspect.signature(fn).parameters["approximate"].default == "tanh", fn.__name__
    seen = []
    monkeypatch.setattr(lowering._dispatch, "guard", lambda *a: (seen.append(len(a)) or (False, "test")))
    x, w = torch.randn(4, 64).bfloat16(), torch.randn(8, 64).bfloat16()
    torch.ops.diffusion_fuse.linear_gelu(x, w, None, "tanh")
    torch.ops.diffusion_fuse.linear_gelu(x, w, None, "none")
    assert seen == [3, 4]
    seen.clear()
    monkeypatch.setattr(lowering._dispatch_cat, "guard", lambda *a: (seen.append(len(a)) or (False, "test")))
    a = torch.randn(4, 16).bfloat16()
    torch.ops.diffusion_fuse.linear_gelu_cat(x, w, None, [a], [], "tanh")
    torch.ops.diffusion_fuse.linear_gelu_cat(x, w, None, [a], [], "none")
    assert seen == [5, 6]


class _LinearGeluCat(torch.nn.Module):
    """``cat([*before, gelu(fc(x)), *after], dim)`` as FLUX's single block writes it (before = the attention)."""

    def __init__(self, n_before=1, n_after=0, dim=-1, twice=False, bias=True):
        super().__init__()
        self.fc = torch.nn.Linear(64, 96, bias=bias, dtype=torch.bfloat16)
        self.n_before, self.n_after, self.dim, self.twice = n_before, n_after, dim, twice

    def forward(self, x, a):
        g = F.gelu(self.fc(x), approximate="tanh")
        before = [a * (i + 1) for i in range(self.n_before)]
        after = [a.transpose(-1, -2).contiguous().transpose(-1, -2)[..., :8] - i for i in range(self.n_after)]
        return torch.cat([*before, g, *after] + ([g] if self.twice else []), dim=self.dim)


@pytest.mark.parametrize("n_before, n_after", [(1, 0), (0, 1), (2, 1), (0, 0)])
@pytest.mark.parametrize("shape", [(2, 5), (7,)])  # a 2-D input's linear has no view
def test_a_last_dim_cat_of_the_gelu_is_taken_too(n_before, n_after, shape):
    torch._dynamo.reset()
    x, a = torch.randn(*shape, 64, dtype=torch.bfloat16), torch.randn(*shape, 16, dtype=torch.bfloat16)
    ref, out, report = compile_and_run(_LinearGeluCat(n_before, n_after), {"x": x, "a": a}, options=ON)
    assert bitwise_equal(ref, out) and _ops(report) == ["diffusion_fuse::linear_gelu_cat"]


@pytest.mark.parametrize("kw", [dict(dim=0), dict(twice=True)])
def test_other_cats_leave_the_gelu_to_the_plain_op(kw):
    torch._dynamo.reset()
    x, a = torch.randn(3, 64, dtype=torch.bfloat16), torch.randn(3, 96, dtype=torch.bfloat16)
    if kw.get("dim") == 0:
        a = torch.randn(2, 96, dtype=torch.bfloat16)
    ref, out, report = compile_and_run(_LinearGeluCat(**kw), {"x": x, "a": a}, options=ON)
    assert bitwise_equal(ref, out)
    assert _ops(report) == ["diffusion_fuse::linear_gelu"]


class _ReshapedGeluCat(torch.nn.Module):
    """The linear's [M, N] output viewed to other rows and columns before its gelu and the cat (review finding:
    the cat form's op would have had the wrong shapes)."""

    def __init__(self, view):
        super().__init__()
        self.fc = torch.nn.Linear(64, 96, dtype=torch.bfloat16)
        self.view = view

    def forward(self, x, a):
        return torch.cat([a, F.gelu(self.fc(x).view(*self.view), approximate="tanh")], dim=-1)


@pytest.mark.parametrize("view, a_shape", [((8, 48), (8, 16)), ((4, 2, 48), (4, 2, 16))])
def test_a_gelu_of_a_reshaped_linear_leaves_the_cat_to_aten(view, a_shape):
    torch._dynamo.reset()
    x, a = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(*a_shape, dtype=torch.bfloat16)
    ref, out, report = compile_and_run(_ReshapedGeluCat(view), {"x": x, "a": a}, options=ON)
    assert bitwise_equal(ref, out) and _ops(report) == ["diffusion_fuse::linear_gelu"]


def test_cat_reference_and_guard():
    g = torch.Generator().manual_seed(1)
    x, w, b = (torch.randn(*s, generator=g).bfloat16() for s in ((4, 7, 64), (96, 64), (96,)))
    a, c = torch.randn(4, 7, 16).bfloat16(), torch.randn(4, 7, 8).bfloat16()
    want = torch.cat([a, F.gelu(F.linear(x, w, b), approximate="tanh"), c], -1)
    assert torch.equal(linear_gelu_cat_reference(x, w, b, [a], [c]), want)
    ok, why = can_use_linear_gelu_cat(x, w, b, [a], [c])
    assert not ok and why == (GLUON_ERROR or "device is cpu")
    counters.reset()
    assert torch.equal(torch.ops.diffusion_fuse.linear_gelu_cat(x, w, b, [a], [c]), want)
    assert counters.snapshot()["fallback"]["linear_gelu_cat"] == {why: 1}


def test_a_dynamic_shape_graph_is_a_near_miss_and_equals_eager():
    # the site's output view would need the sizes as graph values: the linear and its gelu stay ATen there
    torch._dynamo.reset()
    model = _Linear("tanh", True)
    import diffusion_fuse

    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(ON, report), dynamic=True)
    with torch.no_grad():
        for n in (5, 9):
            x = torch.randn(2, n, 64, dtype=torch.bfloat16)
            assert bitwise_equal(model(x), compiled(x))
    assert not _sites(report)
    reasons = [m.reason for g in report.graphs for m in g.near_misses if m.pattern == "linear_gelu"]
    assert reasons and reasons[0].startswith("symbolic shape"), reasons
