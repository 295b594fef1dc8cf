"""Family depthwise_conv: a 2-D depthwise convolution (stride 1) is one site with eager's bits; strided, dilated
or multiplied depthwise convolutions are near misses with the reason; dense and grouped convolutions are not the
family's. On the CPU the op runs its reference (the kernel's order is the GPU test's: tests/gpu/)."""

import pytest
import torch
from helpers import bitwise_equal, compile_and_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diffusion_fuse.patterns.registry import example_tensor

F = "depthwise_conv"
ON = {"patterns": {F: True}}  # the family is off by default (patterns/depthwise_conv.py)


def _conv(c_out: int = 32, k: int = 3, groups: int = 32, **kw) -> torch.nn.Conv2d:
    torch.manual_seed(0)
    return torch.nn.Conv2d(32, c_out, k, groups=groups, **kw).bfloat16()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("k,padding", [(3, 1), (5, 2), (3, 0)])
def test_a_depthwise_conv_is_one_site(bias, k, padding):
    conv = _conv(k=k, padding=padding, bias=bias)
    ref, out, report = compile_and_run(conv, dict(input=example_tensor(2, 32, 8, 8)), ON)
    assert bitwise_equal(ref, out) and out.stride() == ref.stride()
    (site,) = report.sites()
    assert site.pattern == F and site.status == "kept" and site.before == ["convolution"]


def test_a_channels_last_input_keeps_its_layout():
    conv = _conv(padding=1)
    x = example_tensor(2, 32, 8, 8).to(memory_format=torch.channels_last)
    ref, out, report = compile_and_run(conv, dict(input=x), ON)
    assert bitwise_equal(ref, out) and out.stride() == ref.stride() and report.count(F) == 1


@pytest.mark.parametrize("kw,why", [(dict(stride=2, padding=1), "stride [2, 2]"),
                                    (dict(dilation=2, padding=2), "dilation [2, 2]"),
                                    (dict(c_out=64, padding=1), "a channel multiplier of 2")])
def test_other_depthwise_convs_are_near_misses(kw, why):
    ref, out, report = compile_and_run(_conv(**kw), dict(input=example_tensor(2, 32, 8, 8)), ON)
    assert bitwise_equal(ref, out) and report.count(F) == 0
    (miss,) = [m for g in report.graphs for m in g.near_misses if m.pattern == F]
    assert why in miss.reason


@pytest.mark.parametrize("groups", [1, 4])
def test_dense_and_grouped_convs_are_not_the_familys(groups):
    ref, out, report = compile_and_run(_conv(groups=groups, padding=1), dict(input=example_tensor(2, 32, 8, 8)), ON)
    assert bitwise_equal(ref, out) and report.count(F) == 0
    assert not [m for g in report.graphs for m in g.near_misses if m.pattern == F]


def test_an_fp32_conv_is_a_near_miss():
    conv = _conv(padding=1).float()
    ref, out, report = compile_and_run(conv, dict(input=example_tensor(2, 32, 8, 8, dtype=torch.float32)), ON)
    assert bitwise_equal(ref, out) and report.count(F) == 0
    (miss,) = [m for g in report.graphs for m in g.near_misses if m.pattern == F]
    assert "exact in fp32" in miss.reason


def test_the_family_is_off_by_default():
    """Without the option the convolution stays eager's (on CUDA the pointwise pass then adds its bias in the
    kernel that reads it: tests/test_pointwise_pass.py)."""
    ref, out, report = compile_and_run(_conv(padding=1), dict(input=example_tensor(2, 32, 8, 8)))
    assert bitwise_equal(ref, out) and report.count(F) == 0
    assert not [m for g in report.graphs for m in g.near_misses if m.pattern == F]


class ConvGLU(torch.nn.Module):
    """SANA's GLUMBConv tail: depthwise convolution, chunk in two along the channels, value * silu(gate)."""

    def __init__(self, gate: int = 1, other_use: bool = False) -> None:
        super().__init__()
        self.conv, self.gate, self.other_use = _conv(padding=1), gate, other_use

    def forward(self, x):
        y = self.conv(x)
        halves = torch.chunk(y, 2, dim=1)
        out = halves[1 - self.gate] * torch.nn.functional.silu(halves[self.gate])
        return (out, y.sum()) if self.other_use else out


@pytest.mark.parametrize("gate", [0, 1])
@pytest.mark.parametrize("channels_last", [True, False])
def test_a_glu_after_the_conv_joins_its_site(gate, channels_last):
    x = example_tensor(2, 32, 8, 8)
    x = x.to(memory_format=torch.channels_last) if channels_last else x
    ref, out, report = compile_and_run(ConvGLU(gate), dict(x=x), ON)
    assert bitwise_equal(ref, out) and out.stride() == ref.stride()
    (site,) = report.sites()
    assert site.pattern == F and site.status == "kept"
    assert site.before == ["convolution", "split.Tensor", "getitem", "getitem", "silu", "mul.Tensor"]


def test_a_glu_whose_conv_output_is_read_elsewhere_leaves_the_conv_alone():
    ref, out, report = compile_and_run(ConvGLU(other_use=True), dict(x=example_tensor(2, 32, 8, 8)), ON)
    assert bitwise_equal(ref, out)
    sites = [s for s in report.sites() if s.pattern == F]
    assert len(sites) == 1 and sites[0].before == ["convolution"]


def test_a_plan_is_cached_per_cudnn_flags():
    """eager's kernel (so its order) depends on cuDNN's flags: a plan made under others is not reused."""
    from diffusion_fuse.lowering.depthwise_conv import SPEC

    args = (example_tensor(2, 32, 8, 8), example_tensor(32, 1, 3, 3), None, [1, 1])
    key = SPEC.layout_key(args)
    with torch.backends.cudnn.flags(enabled=False):
        assert SPEC.layout_key(args) != key
    assert SPEC.layout_key(args) == key


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(channels=st.sampled_from([8, 24]), groups_div=st.sampled_from([1, 2, 8]), multiplier=st.sampled_from([1, 2]),
       k=st.sampled_from([1, 3, 5]), stride=st.sampled_from([1, 2]), dilation=st.sampled_from([1, 2]),
       padding=st.integers(0, 2), bias=st.booleans(), channels_last=st.booleans(),
       dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
def test_any_convolution_stays_eagers_and_only_depthwise_stride_one_is_a_site(channels, groups_div, multiplier, k,
                                                                              stride, dilation, padding, bias,
                                                                              channels_last, dtype):
    groups = channels // groups_div
    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(channels, channels * multiplier, k, stride=stride, padding=padding, dilation=dilation,
                           groups=groups, bias=bias).to(dtype)
    x = example_tensor(2, channels, 11, 9, dtype=dtype)  # at least the widest dilated filter (9)
    x = x.to(memory_format=torch.channels_last) if channels_last else x
    ref, out, report = compile_and_run(conv, dict(input=x), ON)
    assert bitwise_equal(ref, out) and out.stride() == ref.stride()
    depthwise = groups == channels > 1
    taken = depthwise and multiplier == 1 and stride == 1 and dilation == 1 and dtype != torch.float32
    assert report.count(F) == int(taken)
    misses = [m for g in report.graphs for m in g.near_misses if m.pattern == F]
    assert len(misses) == int(depthwise and not taken), (misses, report.table())
