"""GPU check of kernels/depthwise_conv.py against eager's convolution (bitwise, with eager's output strides).

For each layout (channels-last, as SANA's GLUMBConv hands its ``conv_depth`` the output of a 1 x 1 convolution,
and contiguous; bf16 and fp16; with and without a bias; 3 x 3 and 5 x 5 filters, sizes that are no multiple of
the kernel's blocks) ``eager_order`` must find an order and the op (guard, plan, launch) must give eager's bits and
strides, and so must the GLU tail (``value * silu(gate)``, either half the gate) against eager's ops. The order found
per layout goes to $OUT/depthwise_conv_gpu_*.json. A GLUMBConv-like block compiled with the backend keeps its site,
the GLU in it.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# (batch, channels, height, width, filter, padding)
SHAPES = [(2, 11200, 32, 32, 3, 1), (1, 200, 17, 45, 3, 1), (2, 96, 16, 16, 5, 2)]


def _inputs(shape, dtype, layout, bias, seed):
    from diffusion_fuse.kernels.depthwise_conv import _draw

    n, c, h, w, k, _ = shape
    x = torch.empty(n, c, h, w, device="cuda", dtype=dtype)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    weight = torch.empty(c, 1, k, k, device="cuda", dtype=dtype)
    return _draw(x, weight, bias, seed=100 + seed)  # not eager_order's own draw (seed 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
def test_kernel_is_eagers_convolution(dtype, layout):
    from diffusion_fuse.kernels.depthwise_conv import can_use_depthwise_conv, eager_order
    from diffusion_fuse.lowering.depthwise_conv import SPEC

    found = {}
    for seed, shape in enumerate(SHAPES):
        for bias in (True, False):
            x, w, b = _inputs(shape, dtype, layout, bias, seed)
            pad = (shape[-1], shape[-1])
            want = torch.ops.aten.convolution(x, w, b, [1, 1], list(pad), [1, 1], False, [0, 0], x.shape[1])
            name = f"{str(dtype)[6:]}:{layout}:{'x'.join(map(str, shape))}:{'bias' if bias else 'nobias'}"
            found[name] = eager_order(x, w, bias, pad)
            ok, why = can_use_depthwise_conv(x, w, b, pad)
            assert ok, f"{name}: {why}"
            got = SPEC.run_kernel(x, w, b, list(pad))
            assert got.stride() == want.stride(), name
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), name
            for gate in (0, 1):  # the GLU tail: value * silu(gate), eager's ops one by one
                halves = torch.chunk(want, 2, dim=1)
                want_glu = halves[1 - gate] * torch.nn.functional.silu(halves[gate])
                assert can_use_depthwise_conv(x, w, b, pad, gate) == (True, ""), name
                got = SPEC.run_kernel(x, w, b, list(pad), gate)
                assert got.stride() == want_glu.stride(), f"{name}: glu gate {gate}"
                assert torch.equal(got.view(torch.int16), want_glu.view(torch.int16)), f"{name}: glu gate {gate}"
    with open(os.path.join(os.environ.get("OUT", "."), f"depthwise_conv_gpu_{str(dtype)[6:]}_{layout}.json"),
              "w") as f:
        json.dump(found, f, indent=1)


class GLUConv(torch.nn.Module):
    """SANA's GLUMBConv: 1 x 1 up, SiLU, depthwise 3 x 3, GLU, 1 x 1 down, on [B, H * W, C] tokens."""

    def __init__(self, c: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.up = torch.nn.Conv2d(c, 2 * hidden, 1)
        self.depth = torch.nn.Conv2d(2 * hidden, 2 * hidden, 3, padding=1, groups=2 * hidden)
        self.down = torch.nn.Conv2d(hidden, c, 1, bias=False)

    def forward(self, x, height: int, width: int):
        b, s, c = x.shape
        x = x.unflatten(1, (height, width)).permute(0, 3, 1, 2)
        x = self.depth(torch.nn.functional.silu(self.up(x)))
        x, gate = torch.chunk(x, 2, dim=1)
        x = self.down(x * torch.nn.functional.silu(gate))
        return x.flatten(2, 3).permute(0, 2, 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_glumbconv_keeps_its_depthwise_site(dtype):
    import diffusion_fuse

    torch.manual_seed(0)
    model = GLUConv().to("cuda", dtype).eval()
    x = torch.randn(2, 16 * 24, 64, device="cuda", dtype=dtype)
    with torch.no_grad():
        want = model(x, 16, 24)
        compiled = torch.compile(model, backend="diffusion_fuse", fullgraph=True,
                                 options={"patterns": {"depthwise_conv": True}})
        got = compiled(x, 16, 24)
        got = compiled(x, 16, 24)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    report = diffusion_fuse.report_of(compiled)
    sites = [s for s in report.sites() if s.pattern == "depthwise_conv"]
    assert len(sites) == 1 and sites[0].status == "kept", [(s.pattern, s.status) for s in report.sites()]
    assert sites[0].before[-1] == "mul.Tensor", sites[0].before  # the GLU joined the convolution's site
    assert report.counters()["kernel"].get("depthwise_conv", 0) >= 1, report.counters()
