"""diffusion_fuse: a torch.compile backend for diffusion transformers.

    pipe.transformer = torch.compile(pipe.transformer, backend="diffusion_fuse")

Public API: the backend (``diffusion_fuse``, ``DiffusionFuseBackend``), ``Options``,
``register_pattern`` / ``unregister_pattern``, ``explain``, ``Report``; ``report_of(compiled)`` (a compile's
report), ``last_report()`` (the last compile's), ``process_report()`` / ``reset_reports()`` (every graph).
"""

from __future__ import annotations

from typing import Any

import torch

from .log import configure_from_env, register_with_torch

register_with_torch()
configure_from_env()

from .backend import DiffusionFuseBackend, OptionsError, backends_of, diffusion_fuse, parse_options  # noqa: E402
from .config import Options  # noqa: E402
from .patterns.user import register_pattern, unregister_pattern  # noqa: E402
from .profile import profile  # noqa: E402
from .verify.report import Report, last_report, process_report, reset_reports  # noqa: E402

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


def report_of(compiled: Any) -> Report:
    """The report of the compile(s) behind ``compiled``: what ``torch.compile(..., backend="diffusion_fuse")``
    returned, a module compiled in place, or a module whose blocks were (their reports combined)."""
    reports = [b.report for b in backends_of(compiled)]
    if not reports:
        raise ValueError(f"report_of: {type(compiled).__name__} was not compiled with diffusion_fuse (or by a torch "
                         "that gives each compile no report of its own: see last_report())")
    return reports[0] if len(reports) == 1 else Report.combined(reports)


__all__ = [
    "DiffusionFuseBackend",
    "Options",
    "OptionsError",
    "Report",
    "diffusion_fuse",
    "explain",
    "last_report",
    "parse_options",
    "process_report",
    "profile",
    "register_pattern",
    "report_of",
    "reset_reports",
    "unregister_pattern",
]
