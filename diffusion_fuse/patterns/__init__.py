"""What to look for: the pattern registry and one module per family."""

from . import gated_residual, gated_residual_only, grouped_gemv, linear_cat, linear_gelu, mean_square, norm_modulate, pointwise, rms_norm, static_quant  # noqa: F401,E501
from .registry import REGISTRY, NearMiss, PatternFamily, Site, register_family  # noqa: F401
