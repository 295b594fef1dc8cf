"""fxpasses/direct_calls.py (and lowering/dispatch.impl, DIRECT): the lossless tier's runtime graph calls our
ops' kernels without the dispatcher."""

import torch
import torch.fx as fx
from helpers import bitwise_equal, lossless_tiny_model

from diffusion_fuse.fxpasses.direct_calls import direct_calls
from diffusion_fuse.lowering import dispatch
from diffusion_fuse.lowering.dispatch import DIRECT, GuardedKernel

ops = torch.ops.diffusion_fuse


def test_every_built_in_op_can_be_called_directly():
    for name in ("norm_modulate", "gated_residual_norm_modulate", "gated_residual", "pointwise", "rms_norm",
                 "static_quant", "cat_quant", "norm_modulate_quant", "gated_residual_norm_modulate_quant"):
        assert getattr(ops, name).default in DIRECT, name


def _graph_calling(target, args, kwargs=None) -> fx.GraphModule:
    g = fx.Graph()
    x = g.placeholder("x")
    s = g.placeholder("s")
    env = {"x": x, "s": s}
    node = g.call_function(target, tuple(env.get(a, a) if isinstance(a, str) else a for a in args), kwargs or {})
    g.output(node)
    return fx.GraphModule(torch.nn.Module(), g)


def test_defaults_are_filled_and_float_arguments_stay_floats():
    # norm_modulate(x, weight, bias, eps, scale, shift, ln_dtype, out_dtype, scale_temb=None, shift_temb=None)
    gm = _graph_calling(ops.norm_modulate.default, ("x", None, None, 0, "s", None, None, None))
    direct = direct_calls(gm)
    (node,) = [n for n in direct.graph.nodes if n.op == "call_function"]
    assert isinstance(node.target, GuardedKernel)
    assert len(node.args) == 10 and node.args[-2:] == (None, None)
    assert type(node.args[3]) is float  # the dispatcher would have passed eps=0 as 0.0
    x, s = torch.randn(3, 64), torch.randn(1, 64)
    assert bitwise_equal(gm(x, s), direct(x, s))  # the same object either way: the reference path on CPU


def test_ops_that_are_not_ours_keep_the_dispatcher():
    gm = _graph_calling(torch.ops.aten.add.Tensor, ("x", "s"))
    assert direct_calls(gm) is gm


def test_lossless_model_runs_the_direct_graph_and_equals_eager(monkeypatch):
    report, (run,) = lossless_tiny_model("flux", monkeypatch)
    targets = [n.target for n in run.graph.nodes if n.op == "call_function"]
    assert any(isinstance(t, GuardedKernel) for t in targets)
    assert not any(str(t).startswith("diffusion_fuse.") for t in targets)
    assert "torch.ops.diffusion_fuse" in report.graphs[0].final_code  # the report shows the ops by name
    assert report.count(status="kept") == len(report.sites()) > 0


def test_kernels_disabled_is_read_once(monkeypatch):
    monkeypatch.setenv(dispatch.DISABLE_KERNELS_ENV, "1")
    assert not dispatch.kernels_disabled()  # read at import: an op call pays no environment lookup
    assert dispatch.refresh_kernels_disabled() and dispatch.kernels_disabled()
    monkeypatch.delenv(dispatch.DISABLE_KERNELS_ENV)
    assert not dispatch.refresh_kernels_disabled()
