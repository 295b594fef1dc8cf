"""diffusion_fuse: a torch.compile backend for diffusion transformers.

    pipe.transformer = torch.compile(pipe.transformer, backend="diffusion_fuse")

Public API: the backend (``diffusion_fuse``, ``DiffusionFuseBackend``), ``Options``,
``register_pattern`` / ``unregister_pattern``, ``explain``, ``Report``.
"""

from __future__ import annotations

from typing import Any

import torch

from .log import configure_from_env, register_with_torch

register_with_torch()
configure_from_env()

from .backend import DiffusionFuseBackend, diffusion_fuse, parse_options  # noqa: E402  (loads the families)
from .config import Options  # noqa: E402
from .patterns.user import register_pattern, unregister_pattern  # noqa: E402
from .profile import profile  # noqa: E402
from .verify.report import Report, default_report  # noqa: E402

__version__ = "0.1.0"


def explain(model: torch.nn.Module, *args: Any, options: dict[str, Any] | None = None, **kwargs: Any) -> Report:
    """Compile ``model`` with diffusion_fuse, run it once on ``args``/``kwargs``, return the report.

    The report (``print`` it, ``save_html``, ``to_dict``) has, per pattern family, the sites
    matched, kept and rejected and the kernel hits, guard fallbacks and kernel errors of that
    run; per site its source line, the ATen nodes it replaced, the op it became, input and
    output shapes and dtypes, and the verifier's verdict (with the first differing element
    of a rejected site); the near misses (anchors no pattern took, and why); and per graph
    the data of the before/after diff (``diffusion_fuse.verify.graph_diff``).
    ``python -m diffusion_fuse inspect`` prints the same for a tiny model or a script.
    """
    report = Report()
    base = getattr(model, "_orig_mod", model)
    compiled = torch.compile(base, backend=DiffusionFuseBackend(options, report))
    with torch.no_grad():
        compiled(*args, **kwargs)
    return report


def last_report() -> Report:
    """The process-wide report that ``backend="diffusion_fuse"`` compiles add to."""
    return default_report()


__all__ = [
    "DiffusionFuseBackend",
    "Options",
    "Report",
    "diffusion_fuse",
    "explain",
    "last_report",
    "parse_options",
    "profile",
    "register_pattern",
    "unregister_pattern",
]
