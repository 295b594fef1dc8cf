"""What to look for: the pattern registry and one module per family."""

from . import (gated_residual, gated_residual_only, merged_linear, norm_modulate, pointwise, rms_norm,  # noqa: F401
               static_quant)
from .registry import REGISTRY, NearMiss, PatternFamily, Site, register_family  # noqa: F401
