"""Typed backend options.

``torch.compile(m, backend="diffusion_fuse", options={...})`` passes ``options`` here.
Every key and value is checked; a bad one raises ``ValueError`` naming it and the
allowed values.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Collection, Mapping
from typing import Any, Literal

Quality = Literal["lossless", "high"]
QUALITIES: tuple[str, ...] = ("lossless", "high")
MODES: tuple[str | None, ...] = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# The torch.compile modes that turn CUDA graphs on (as in Inductor's ``list_mode_options``).
CUDAGRAPH_MODES: tuple[str, ...] = ("reduce-overhead", "max-autotune")


@dataclasses.dataclass(frozen=True)
class Options:
    """What the backend does.

    quality:  "lossless" (default): only bit-exact rewrites, unmatched ops run the ATen ops
              eager runs. "high": adds non-exact families and hands the graph to Inductor.
    verify:   compare every rewritten site with its reference subgraph on the first real call
              (and on each new input signature); rejected sites go back to their ATen nodes.
    patterns: {pattern name: bool} to enable or disable families; names not listed keep
              their default (enabled when the family's tier is allowed by ``quality``, unless the
              family is off by default: ``PatternFamily.on_by_default``).
    report:   path of a file the report is written to after each verification (``.json``
              for JSON, ``.html`` for the HTML report, anything else for the text table), or None.
    rtol/atol: tolerance for non-exact sites and outputs in tier "high": relative L2 error
              at most ``rtol``, or largest absolute error at most ``atol``.
    cudagraphs: run the graphs under CUDA graphs (cudagraph trees), after verification;
              default: on for ``mode="reduce-overhead"`` and ``"max-autotune"``, as in Inductor.
              An option too because torch.compile takes ``mode`` or ``options``, not both
              (``options={"quality": "high", "cudagraphs": True}``). See diffusion_fuse/cudagraphs.py.
    warm_start: reuse the verifier's verdicts stored by an earlier process for the same graph, input
              metadata, device, options, package source and torch/Triton versions (``cache_root()``/verdicts):
              a call whose key is stored skips the verifier; any other is verified and stored. Off by
              default: a stored verdict was judged on that process's values, not this one's
              (verify/warm_start.py).
    """

    quality: Quality = "lossless"
    verify: bool = True
    patterns: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    report: str | None = None
    rtol: float = 2e-2
    atol: float = 1e-3
    cudagraphs: bool = False
    warm_start: bool = False
    mode: str | None = None

    def pattern_enabled(self, name: str, tier: str, on_by_default: bool = True) -> bool:
        if name in self.patterns:
            return bool(self.patterns[name])
        return on_by_default and (tier == "lossless" or self.quality == "high")


def cache_root() -> str:
    """Where the package keeps what outlives a process (generated kernels, stored verdicts):
    ``DIFFUSION_FUSE_CACHE_DIR``, else a folder per user in the system's temporary directory."""
    return os.environ.get("DIFFUSION_FUSE_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"diffusion_fuse_{os.getuid() if hasattr(os, 'getuid') else 'user'}")


def _fail(key: str, value: Any, allowed: Any) -> None:
    raise ValueError(f"diffusion_fuse: option {key}={value!r} is not allowed; allowed: {allowed}")


def report_path_problem(path: object) -> str:
    """Why the report cannot be written to ``path``, or "": checked when the options are parsed, so that the
    verifier's first call (which writes it) never meets a path that could not work."""
    if not isinstance(path, str) or not path:
        return "not a non-empty str"
    if os.path.isdir(path):
        return f"{path} is a directory"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"{parent} does not exist"
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return f"{path} is not writable"
    return ""


def parse(options: Mapping[str, Any] | None = None, mode: str | None = None,
                  families: Collection[str] = ()) -> Options:
    """Check ``options`` (and the ``mode=`` torch.compile passes) and build an ``Options``; ``families``: the
    pattern names ``patterns`` may name (the registry's)."""

    if mode not in MODES:
        _fail("mode", mode, list(MODES))
    raw = dict(options or {})
    fields = {f.name for f in dataclasses.fields(Options)} - {"mode"}
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise ValueError(
            f"diffusion_fuse: unknown option(s) {unknown}; allowed options: {sorted(fields)}"
        )
    if "quality" in raw and raw["quality"] not in QUALITIES:
        _fail("quality", raw["quality"], list(QUALITIES))
    for key in ("verify", "cudagraphs", "warm_start"):
        if key in raw and not isinstance(raw[key], bool):
            _fail(key, raw[key], [True, False])
    raw.setdefault("cudagraphs", mode in CUDAGRAPH_MODES)
    if raw.get("report") is not None:
        why = report_path_problem(raw["report"])
        if why:
            _fail("report", raw["report"], f"a file path in a writable directory, or None ({why})")
    for key in ("rtol", "atol"):
        if key in raw and (not isinstance(raw[key], (int, float)) or raw[key] < 0):
            _fail(key, raw[key], "a non-negative number")
    patterns = raw.get("patterns", {})
    if not isinstance(patterns, Mapping):
        _fail("patterns", patterns, "a dict {pattern name: bool}")
    known = set(families)
    for name, on in patterns.items():
        if name not in known:
            _fail("patterns", name, sorted(known))
        if not isinstance(on, bool):
            _fail(f"patterns[{name!r}]", on, [True, False])
    raw["patterns"] = dict(patterns)
    return Options(mode=None if mode == "default" else mode, **raw)
