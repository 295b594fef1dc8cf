"""fxpasses/python_bindings.py: ATen overloads called through torch's bindings give eager's results, exactly."""

import pytest
import torch
import torch.fx as fx
from helpers import bitwise_equal, lossless_tiny_model

from diffusion_fuse.fxpasses.python_bindings import BINDINGS, python_bindings

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
    aten.pow.Tensor_Scalar: (x, 2),
    aten.neg.default: (x,),
    aten.exp.default: (x,),
    aten.sin.default: (x.float(),),
    aten.cos.default: (x.float(),),
    aten.rsqrt.default: (x.abs(),),
    aten.tanh.default: (x,),
    aten.sigmoid.default: (x,),
    aten.stack.default: ([x, y], 2),
    aten.sum.dim_IntList: (x, [1], False),
    aten.gelu.default: (x,),
    aten.arange.start: (0, 7),
    aten.arange.start_step: (0, 7, 2),
}
KWARGS = {  # keyword arguments traced graphs pass, per overload
    aten.add.Tensor: {"alpha": 2},
    aten.sub.Tensor: {"alpha": 3},
    aten.clone.default: {"memory_format": torch.contiguous_format},
    aten.mean.dim: {"dtype": torch.float32},
    aten.sum.dim_IntList: {"dtype": torch.float32},
    aten.gelu.default: {"approximate": "tanh"},
    aten.arange.start: {"dtype": torch.float32, "layout": torch.strided, "device": "cpu", "pin_memory": False},
    aten.arange.start_step: {"dtype": torch.int64, "device": "cpu", "pin_memory": False},
}


def _flat(v):
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _same(ref, got):
    ref, got = _flat(ref), _flat(got)
    assert len(ref) == len(got)
    for r, g in zip(ref, got):
        assert r.dtype == g.dtype and r.shape == g.shape and r.stride() == g.stride()
        assert bitwise_equal(r, g)


@pytest.mark.parametrize("op", list(BINDINGS), ids=str)
def test_each_binding_reaches_the_same_overload_result(op):
    args = CALLS[op]
    _same(op(*args), BINDINGS[op][0](*args))
    if op in KWARGS:
        assert set(KWARGS[op]) <= BINDINGS[op][2]
        _same(op(*args, **KWARGS[op]), BINDINGS[op][0](*args, **KWARGS[op]))


@pytest.mark.parametrize("src, dst", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_to_copy_to_another_dtype_is_tensor_to(src, dst, layout):
    a = _rn(3, 4, 8, dtype=src)
    a = a.transpose(1, 2) if layout == "transposed" else a
    g = fx.Graph()
    p = g.placeholder("a")
    p.meta["val"] = a
    g.output(g.call_function(aten._to_copy.default, (p,), {"dtype": dst}))
    gm = fx.GraphModule(torch.nn.Module(), g)
    fast, n = python_bindings(gm)
    assert n == 1 and torch.Tensor.to in [m.target for m in fast.graph.nodes]
    _same(gm(a), fast(a))
    g2 = fx.Graph()
    p2 = g2.placeholder("a")
    p2.meta["val"] = a
    g2.output(g2.call_function(aten._to_copy.default, (p2,), {"dtype": src}))  # same dtype: .to would alias
    assert python_bindings(fx.GraphModule(torch.nn.Module(), g2))[1] == 0


def test_every_binding_is_tested():
    assert set(CALLS) == set(BINDINGS)


def test_calls_with_other_keyword_arguments_keep_the_op():
    g = fx.Graph()
    a = g.placeholder("a")
    g.output(g.call_function(aten.mul.Tensor, (a, a), {"out_of_schema": 2}))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert python_bindings(gm) == (gm, 0)


def test_lossless_runtime_graph_uses_bindings_and_equals_eager():
    report, _ = lossless_tiny_model("wan21")
    entry = report.graphs[0].verifications[0]
    assert entry["python_bindings"] > 0 and entry["end_to_end_equal"], entry
