"""The built-in pattern families: the one list a new family is added to.

A family ``<name>`` lives in files of its name in every stage: ``patterns/<name>.py`` (the forms it matches,
registered with ``@register_family``), ``lowering/<name>.py`` (its op's ``OpSpec``), ``kernels/<name>.py`` (its Triton
kernel, unless the family says it runs another family's: ``PatternFamily.kernel``) and, for a family whose sites a
pass of its own finds, ``fxpasses/<name>.py`` (registered with ``@register_pass``). ``load()`` imports them in this
order, which is the registry's: families sharing an anchor are tried by priority, then in this order.
docs/adding_a_family.md walks through adding one.
"""

from __future__ import annotations

import importlib
import importlib.util

FAMILIES: tuple[str, ...] = (
    "norm_modulate",
    "gated_residual",
    "gated_residual_norm_modulate",
    "grouped_gemv",
    "linear_cat",
    "mean_square",
    "pointwise",
    "rms_norm",
    "rms_norm_rope",
    "rms_norm_cat_rope",
    "rms_norm_chain",
    "static_quant",
    "cat_quant",
    "layer_norm",
    "depthwise_conv",
)

STAGES = ("patterns", "lowering", "fxpasses")


def load() -> None:
    """Import every family's modules (patterns and lowering always; fxpasses where the family has one)."""
    for name in FAMILIES:
        for stage in STAGES:
            module = f"{__package__}.{stage}.{name}"
            if stage != "fxpasses" or importlib.util.find_spec(module) is not None:
                importlib.import_module(module)
