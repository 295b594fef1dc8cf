"""Family ``pointwise``: connected pointwise ATen ops fused into one exact kernel.

Unlike the other families it has no anchor: ``fxpasses/pointwise.py`` groups whatever
connected pointwise ops, views, copies and ``cat``/``stack`` the other families left
(it runs after them), and each group becomes ``diffusion_fuse::pointwise``
(lowering/pointwise.py) with a kernel generated for it that rounds as eager rounds
(kernels/pointwise_ops.py). Disable with ``options={"patterns": {"pointwise": False}}``.
Lossless tier only: in tier "high" Inductor fuses pointwise ops itself.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .registry import Example, NearMiss, PatternFamily, Site, example_tensor, register_family


@register_family
class Pointwise(PatternFamily):
    name = "pointwise"
    tier = "lossless"
    found_by_pass = True
    description = "connected pointwise ops (+ views, copies, cat/stack) → one generated kernel, eager's rounding"
    variants = (
        "gated residual adds and multiplies not absorbed by the norm families (x + gate * y)",
        "activations: gelu (tanh and erf), silu, sigmoid, exp, rsqrt, clamp, relu, where",
        "dtype casts between bf16/fp16/fp32 (_to_copy), clone/contiguous copies",
        "RoPE in fp32: x.float() * cos + rotate(x).float() * sin → bf16 (unbind/neg/stack/view)",
        "cat/stack fed by or feeding the group (written directly, no separate copy)",
    )


    def example(self) -> Example:
        def gated(x, gate, y):  # ops no family takes: x + sigmoid(gate) * gelu(y)
            return x + torch.sigmoid(gate) * torch.nn.functional.gelu(y, approximate="tanh")

        return gated, (example_tensor(2, 8, 64), example_tensor(2, 8, 64, seed=1), example_tensor(2, 8, 64, seed=2))

    def match(self, node: fx.Node) -> Site | NearMiss | None:  # pragma: no cover - found by the pass
        return None
