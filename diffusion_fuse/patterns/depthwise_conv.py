"""Family ``depthwise_conv``: a 2-D depthwise convolution as one op ``diffusion_fuse::depthwise_conv``.

Covered ATen form (``nn.Conv2d(C, C, k, padding=p, groups=C)``, as SANA's GLUMBConv runs its 3 x 3 ``conv_depth``)::

    convolution(x, w [C, 1, kh, kw], b?, stride=[1, 1], padding, dilation=[1, 1], transposed=False,
                output_padding=[0, 0], groups=C)

Where the convolution's output is only the input of a gated linear unit, SANA's GLUMBConv tail::

    value, gate = split(y, C / 2, dim=1)          # torch.chunk(y, 2, dim=1); the gate either half
    out = mul(value, silu(gate))                  # or mul(silu(gate), value)

the site takes the tail too (``glu_gate``): the op writes ``out`` alone and the convolution's output is never
stored (SANA-1.6B at 1024², per block: 69 MB moved where the convolution and the GLU apart move 161 MB).

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

from .match_utils import aten, getitem_users, is_op, single_user, val
from .registry import Example, NearMiss, PatternFamily, Site, example_tensor, register_family

NO_GLU = -1  # the op's glu_gate for a convolution alone (kernels/depthwise_conv.py states it too)


def _conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, stride: int = 1) -> torch.Tensor:
    return torch.nn.functional.conv2d(x, w, b, stride=stride, padding=w.shape[-1] // 2, groups=x.shape[1])


def glu_tail(conv: fx.Node) -> tuple[list[fx.Node], fx.Node, int] | None:
    """(the tail's nodes, its ``mul``, the gate's half) when the convolution's output is only a GLU's input."""
    v = val(conv)
    split = single_user(conv)
    if v is None or v.shape[1] % 2 or split is None or len(split.args) < 2:
        return None
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    half = v.shape[1] // 2
    if not (is_op(split, aten.split.Tensor) and split.args[1] == half
            or is_op(split, aten.split_with_sizes.default) and list(split.args[1]) == [half, half]):
        return None
    if dim not in (1, 1 - v.dim()):
        return None
    try:
        items = getitem_users(split)
    except LookupError:
        return None
    if sorted(items) != [0, 1] or any(len(items[i].users) != 1 for i in (0, 1)):
        return None
    for gate in (0, 1):
        act, mul = single_user(items[gate]), single_user(items[1 - gate])
        if (is_op(act, aten.silu.default) and len(act.args) == 1 and single_user(act) is mul
                and is_op(mul, aten.mul.Tensor) and set(mul.args) == {act, items[1 - gate]}
                and val(mul) is not None and val(mul).dtype == v.dtype):
            return [split, items[0], items[1], act, mul], mul, gate
    return None


@register_family
class DepthwiseConv(PatternFamily):
    name = "depthwise_conv"
    tier = "lossless"
    anchors = (aten.convolution.default,)
    description = "2-D depthwise convolution (stride 1), summed in eager's kernel's order"
    # opt-in (options={"patterns": {"depthwise_conv": True}}): faster than cuDNN alone, level in a whole SANA
    # (docs/numerics.md)
    on_by_default = False
    variants = ("convolution(x, w [C, 1, kh, kw], b?, stride 1, padding, dilation 1, groups=C)   (nn.Conv2d, "
                "groups=C)",
                "value, gate = split(convolution(...), C/2, 1); mul(value, silu(gate))   (GLUMBConv's conv_depth "
                "and GLU)")

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
        tail = glu_tail(node)
        nodes, out, gate = ([node] + tail[0], tail[1], tail[2]) if tail else ([node], node, NO_GLU)

        def emit(graph: fx.Graph, ins):
            return [graph.call_function(torch.ops.diffusion_fuse.depthwise_conv.default,
                                        (ins[0], ins[1], ins[2] if has_b else None, pad, gate))]

        return Site(pattern=self.name, anchor=node, nodes=nodes, inputs=[x, w] + ([b] if has_b else []),
                    outputs=[out], emit=emit, op="diffusion_fuse::depthwise_conv")
