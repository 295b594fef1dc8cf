"""fxpasses/python_bindings.py: ATen overloads called through torch's bindings give eager's results, exactly."""

import pytest
import torch
import torch.fx as fx

import diffusion_fuse
from diffusion_fuse.fxpasses.python_bindings import BINDINGS, python_bindings
from diffusion_fuse.testing.tiny_models import build
from helpers import bitwise_equal

aten = torch.ops.aten


def _rn(*shape, seed=0, dtype=torch.bfloat16):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


x, y = _rn(2, 3, 8), _rn(2, 3, 8, seed=1)
m, w, b = _rn(6, 8), _rn(5, 8, seed=2), _rn(5, seed=3)
CALLS = {  # overload -> positional arguments as a traced graph passes them
    aten.view.default: (x, [6, 8]),
    aten.unsqueeze.default: (x, 1),
    aten.squeeze.dim: (x.unsqueeze(2), 2),
    aten.permute.default: (x, [2, 0, 1]),
    aten.t.default: (m,),
    aten.transpose.int: (x, 0, 2),
    aten.expand.default: (x[:, :1], [2, 3, 8]),
    aten.select.int: (x, 1, 2),
    aten.addmm.default: (b, m, w.t()),
    aten.mm.default: (m, w.t()),
    aten.bmm.default: (x, y.transpose(1, 2)),
    aten.linear.default: (x, w, b),
    aten.add.Tensor: (x, y),
    aten.sub.Tensor: (x, 2.5),
    aten.mul.Tensor: (x, y[:, :1]),
    aten.div.Tensor: (x, y),
    aten.cat.default: ([x, y], 1),
    aten.clone.default: (x.transpose(0, 1),),
    aten.split.Tensor: (x, 3, 2),
    aten.split_with_sizes.default: (x, [2, 6], 2),
    aten.native_layer_norm.default: (x.float(), [8], None, None, 1e-5),
    aten.mean.dim: (x.float(), [2], True),
    aten.silu.default: (x,),
}


def _flat(v):
    return list(v) if isinstance(v, (list, tuple)) else [v]


@pytest.mark.parametrize("op", list(BINDINGS), ids=str)
def test_each_binding_reaches_the_same_overload_result(op):
    args = CALLS[op]
    ref, got = _flat(op(*args)), _flat(BINDINGS[op][0](*args))
    assert len(ref) == len(got)
    for r, g in zip(ref, got):
        assert r.dtype == g.dtype and r.shape == g.shape and r.stride() == g.stride()
        assert bitwise_equal(r, g)


def test_every_binding_is_tested():
    assert set(CALLS) == set(BINDINGS)


def test_calls_with_keyword_arguments_keep_the_op():
    g = fx.Graph()
    a = g.placeholder("a")
    g.output(g.call_function(aten.add.Tensor, (a, a), {"alpha": 2}))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert python_bindings(gm) == (gm, 0)


def test_lossless_runtime_graph_uses_bindings_and_equals_eager():
    model, kwargs = build("wan21")
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
    with torch.no_grad():
        ref = model(**kwargs)[0]
        assert all(bitwise_equal(ref, compiled(**kwargs)[0]) for _ in range(2))
    entry = report.graphs[0].verifications[0]
    assert entry["python_bindings"] > 0 and entry["end_to_end_equal"], entry
