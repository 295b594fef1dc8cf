"""fxpasses/recompose_linear.py: AOTAutograd's view → t → addmm → view back to one aten.linear, exactly."""

import pytest
import torch
import torch.nn.functional as F
from helpers import bitwise_equal, lossless_tiny_model
from torch._functorch.aot_autograd import aot_export_module

from diffusion_fuse.fxpasses.recompose_linear import recompose_linear

aten = torch.ops.aten


class Lin(torch.nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.lin = torch.nn.Linear(16, 24, bias=bias)

    def forward(self, x):
        return (self.lin(x) * 2,)


def _linear_plus_one(x, w, b):
    return aten.linear.default(x, w, b) + 1


def aten_graph(module, x):
    with torch.no_grad():
        gm, _ = aot_export_module(module, [x], trace_joint=False)
    return gm


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("shape", [(5, 16), (2, 5, 16), (2, 3, 5, 16)], ids=["2d", "3d", "4d"])
def test_linear_groups_become_one_call_and_stay_exact(shape):
    m = Lin().eval()
    x = torch.randn(*shape)
    gm = aten_graph(m, x)
    assert aten.addmm.default in targets(gm)
    out, n = recompose_linear(gm)
    assert n == 1
    assert aten.linear.default in targets(out) and aten.addmm.default not in targets(out)
    assert aten.t.default not in targets(out) and aten.view.default not in targets(out)
    params = [p.detach() for p in m.parameters()]
    assert bitwise_equal(gm(*params, x)[0], out(*params, x)[0])


def test_left_alone_without_bias_or_with_a_non_contiguous_input():
    gm = aten_graph(Lin(bias=False).eval(), torch.randn(2, 5, 16))
    assert recompose_linear(gm)[1] == 0  # mm, not addmm: left as traced

    class T(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 24)

        def forward(self, x):
            return (F.linear(x.transpose(0, 1), self.lin.weight, self.lin.bias),)  # a non-contiguous 3-D input

    gm = aten_graph(T().eval(), torch.randn(5, 2, 16))
    assert recompose_linear(gm)[1] == 0


def test_a_linear_output_read_elsewhere_stays_exact():
    class Shared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 24)

        def forward(self, x):
            y = self.lin(x)
            return y, y.view(-1, 24) + 0  # an output of the group's views is read elsewhere too

    m = Shared().eval()
    x = torch.randn(2, 5, 16)
    gm = aten_graph(m, x)
    out, n = recompose_linear(gm)
    assert n == 1  # the group's last view is what the other reader reads: the linear replaces it
    params = [p.detach() for p in m.parameters()]
    assert all(bitwise_equal(a, b) for a, b in zip(gm(*params, x), out(*params, x)))


def test_the_lossless_runtime_graph_recomposes_and_the_verifier_records_it(monkeypatch):
    report, (run,) = lossless_tiny_model("flux", monkeypatch)
    # linear, then through its binding (fxpasses/python_bindings.py)
    assert torch._C._nn.linear in targets(run) and aten.addmm.default not in targets(run)
    (entry,) = report.graphs[0].verifications
    assert entry["linears_recomposed"] > 0 and entry["end_to_end_equal"]


def test_a_recomposition_that_changes_the_output_is_put_back(monkeypatch):
    import diffusion_fuse.fxpasses.recompose_linear as rl

    real = rl.recompose_linear

    def wrong(gm):  # stands in for an at::linear that takes another path than the traced one
        out, n = real(gm)
        for node in out.graph.nodes:
            if node.target is aten.linear.default:
                node.target = _linear_plus_one
        out.recompile()
        return out, n

    monkeypatch.setattr(rl, "recompose_linear", wrong)
    report, _ = lossless_tiny_model("flux")
    g = report.graphs[0]
    assert any("runtime rewrites" in n and "put back" in n for n in g.notes), g.notes
    assert report.count(status="kept") == len(report.sites()) > 0  # the sites themselves stay
