"""What to look for: the pattern registry and one module per family."""

from . import norm_modulate  # noqa: F401  (registers the family)
from .registry import REGISTRY, NearMiss, PatternFamily, Site, register_family  # noqa: F401
