"""Family ``depthwise_conv``: a 2-D depthwise convolution as one op ``diffusion_fuse::depthwise_conv``.

Covered ATen form (``nn.Conv2d(C, C, k, padding=p, groups=C)``, as SANA's GLUMBConv runs its 3 x 3 ``conv_depth``)::

    convolution(x, w [C, 1, kh, kw], b?, stride=[1, 1], padding, dilation=[1, 1], transposed=False,
                output_padding=[0, 0], groups=C)

Eager runs it as cuDNN's depthwise kernel (channels-last or fp16 input) or ATen's own (contiguous bf16), neither near
the copy bandwidth at a DiT's channel counts; the op sums each output's taps in the order eager's kernel does
(kernels/depthwise_conv.py) and reads x about once. Depthwise convolutions with a stride, a dilation or a channel
multiplier are near misses with the reason; other convolutions (a patch embedding, a 1 x 1 projection) are not
this family's. The family is off by default (``on_by_default``): turn it on with
``options={"patterns": {"depthwise_conv": True}}``.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .match_utils import aten, val
from .registry import Example, NearMiss, PatternFamily, Site, example_tensor, register_family


def _conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, stride: int = 1) -> torch.Tensor:
    return torch.nn.functional.conv2d(x, w, b, stride=stride, padding=w.shape[-1] // 2, groups=x.shape[1])


@register_family
class DepthwiseConv(PatternFamily):
    name = "depthwise_conv"
    tier = "lossless"
    anchors = (aten.convolution.default,)
    description = "2-D depthwise convolution (stride 1), summed in eager's kernel's order"
    # opt-in (options={"patterns": {"depthwise_conv": True}}) until benchmarks/bench_depthwise_conv.py shows it
    # ahead of cuDNN's kernel on a GPU
    on_by_default = False
    variants = ("convolution(x, w [C, 1, kh, kw], b?, stride 1, padding, dilation 1, groups=C)   (nn.Conv2d, "
                "groups=C: GLUMBConv's conv_depth)",)

    def example(self) -> Example:
        return _conv, (example_tensor(2, 32, 8, 8), example_tensor(32, 1, 3, 3, seed=1), example_tensor(32, seed=2))

    def near_miss_example(self) -> Example:
        def strided(x, w, b):
            return _conv(x, w, b, stride=2)

        return strided, (example_tensor(2, 32, 8, 8), example_tensor(32, 1, 3, 3, seed=1),
                         example_tensor(32, seed=2))

    def match(self, node: fx.Node) -> Site | NearMiss | None:
        if len(node.args) != 9:
            return None
        x, w, b, stride, padding, dilation, transposed, _output_padding, groups = node.args
        vx, vw = val(x), val(w)
        if vx is None or vw is None or vx.dim() != 4 or vw.dim() != 4 or transposed:
            return None
        if not isinstance(groups, int) or groups == 1 or groups != vx.shape[1]:
            return None  # not depthwise: a dense or grouped convolution
        why = ""
        if vw.shape[0] != groups:  # groups == C_in: the weight's second dim is 1
            why = f"weight {tuple(vw.shape)}: a channel multiplier of {vw.shape[0] // groups} (the op takes 1)"
        elif list(stride) != [1, 1] or list(dilation) != [1, 1]:
            why = f"stride {list(stride)}, dilation {list(dilation)} (the op takes 1 and 1)"
        elif len(padding) != 2:
            why = f"padding {list(padding)}"
        if why:
            return NearMiss(self.name, node, why)
        has_b = isinstance(b, fx.Node)
        pad = [int(p) for p in padding]

        def emit(graph: fx.Graph, ins):
            return [graph.call_function(torch.ops.diffusion_fuse.depthwise_conv.default,
                                        (ins[0], ins[1], ins[2] if has_b else None, pad))]

        return Site(pattern=self.name, anchor=node, nodes=[node], inputs=[x, w] + ([b] if has_b else []),
                    outputs=[node], emit=emit, op="diffusion_fuse::depthwise_conv")
