"""Graph rewrites, one pass per module, ordered by ``PassManager``."""

from .base import GraphPass, PassContext  # noqa: F401
from .pass_manager import PassManager  # noqa: F401
