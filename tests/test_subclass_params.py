"""diffusion_fuse/subclass_params.py: tensor-subclass weights flattened once at compile time.

torch's ``TwoTensor`` (a traceable wrapper subclass of two plain tensors) stands in for torchao's Float8 weights
here; tests/test_torchao.py runs torchao's own recipe on the tiny models, tests/gpu/test_torchao_gpu.py on CUDA.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

import diffusion_fuse
from diffusion_fuse.subclass_params import SubclassParams, SubclassSpec


class TwoWeights(torch.nn.Module):
    """A linear whose weight is a subclass parameter, then ops a family takes (LayerNorm + modulate)."""

    def __init__(self, D=16, nested=False):
        super().__init__()
        self.lin = torch.nn.Linear(D, D, bias=False)
        w = self.lin.weight.detach()
        inner = TwoTensor(w.clone(), w * 2) if nested else w.clone()
        self.lin.weight = torch.nn.Parameter(TwoTensor(inner, inner * 3), requires_grad=False)
        self.scale = torch.nn.Parameter(torch.randn(D), requires_grad=False)

    def forward(self, x):
        y = self.lin(x)
        return torch.nn.functional.layer_norm(y, y.shape[-1:]) * (1 + self.scale) + 1


def _leaves(t):
    if isinstance(t, TwoTensor):
        return _leaves(t.a) + _leaves(t.b)
    return [t]


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_leaves(a), _leaves(b), strict=True))


def _compile(model):
    report = diffusion_fuse.Report()
    return torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report)), report


@pytest.mark.parametrize("nested", [False, True])
def test_subclass_weight_is_flattened_and_the_output_is_eager(caplog, nested):
    torch._dynamo.reset()
    model, x = TwoWeights(nested=nested), torch.randn(3, 5, 16)
    compiled, report = _compile(model)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="diffusion_fuse"):
        ref, out = model(x), compiled(x)
    assert _equal(ref, out)
    inner = 4 if nested else 2
    assert f"subclass parameters flattened at compile time: 1 ({inner} inner tensors)" in caplog.text
    assert report.count(status="kept") >= 1, report.table()  # the LayerNorm + modulate after the subclass linear


def test_weights_changed_in_place_or_replaced_are_used_as_they_are_now():
    torch._dynamo.reset()
    model, x = TwoWeights(), torch.randn(3, 5, 16)
    compiled, _ = _compile(model)
    with torch.no_grad():
        compiled(x)
        model.lin.weight.b.mul_(-2)  # an inner tensor updated in place
        assert _equal(model(x), compiled(x))
        w = model.lin.weight
        model.lin.weight = torch.nn.Parameter(TwoTensor(w.a * 5, w.b + 1), requires_grad=False)  # a new weight
        assert _equal(model(x), compiled(x))
        model.lin.weight = torch.nn.Parameter(w.a.clone(), requires_grad=False)  # another type: Dynamo recompiles
        assert _equal(model(x), compiled(x))


def test_models_without_subclass_weights_and_grad_enabled_graphs_are_left_alone(caplog):
    torch._dynamo.reset()
    x = torch.randn(3, 5, 16)
    with caplog.at_level(logging.INFO, logger="diffusion_fuse"):
        plain = torch.nn.Linear(16, 16)
        with torch.no_grad():
            assert torch.equal(_compile(plain)[0](x), plain(x))
        model = TwoWeights()
        assert _equal(_compile(model)[0](x), model(x))  # grad enabled: AOTAutograd's own path
    assert "flattened at compile time" not in caplog.text


def test_spec_round_trip_and_type_check():
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    t = TwoTensor(TwoTensor(a, b), TwoTensor(b, a))
    spec = SubclassSpec.of(t)
    leaves = spec.leaves(t)
    assert [x.data_ptr() for x in leaves] == [a.data_ptr(), b.data_ptr(), b.data_ptr(), a.data_ptr()]
    assert _equal(spec.rebuild(iter(leaves)), t)
    params = SubclassParams([None, spec])
    flat = params.unwrap([a, t])
    assert len(flat) == 5 and flat[0] is a
    with pytest.raises(TypeError, match="compiled as TwoTensor is now Tensor"):
        params.unwrap([a, a])
