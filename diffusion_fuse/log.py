"""Logging for diffusion_fuse.

Everything logs through ``logging.getLogger("diffusion_fuse")`` and its children, one per
component: ``diffusion_fuse.backend``, ``.verify`` (verdicts, rejected sites), ``.lowering``
(kernel fallbacks and errors), ``.fxpasses``, ``.patterns``, ``.kernels``.

``DIFFUSION_FUSE_LOG`` sets levels when the package is first imported. It takes what
``TORCH_LOGS`` takes for a component, comma-separated, plus plain level names:

    DIFFUSION_FUSE_LOG=info              the whole package at INFO (debug, info, warning, error)
    DIFFUSION_FUSE_LOG=+                 the whole package at DEBUG (``-``: ERROR)
    DIFFUSION_FUSE_LOG=verify            one component at INFO, as ``TORCH_LOGS=dynamo`` does
    DIFFUSION_FUSE_LOG=+verify,-lowering +: DEBUG, -: ERROR, as ``TORCH_LOGS=+dynamo,-aot`` does
    DIFFUSION_FUSE_LOG=+diffusion_fuse   the whole package at DEBUG

Unset, the package logs WARNING and above (a rejected site, a failing kernel) through
Python's default handling. An unknown component or level raises ``ValueError`` naming the allowed ones.

torch's logging: the package registers ``diffusion_fuse`` as a torch log and ``ARTIFACTS`` as torch artifacts
(``register_with_torch``), so ``TORCH_LOGS="+diffusion_fuse"`` (or ``torch._logging.set_logs(diffusion_fuse=
logging.DEBUG, diffusion_fuse_graphs=True)``) prints through torch's handler, each line with its compile id
(``[0/1]``; the verifier's lines on the first call too: ``in_compile``). In ``TORCH_LOGS`` an artifact name
comes after ``diffusion_fuse`` (``TORCH_LOGS="+diffusion_fuse,diffusion_fuse_graphs"``): torch imports the
package when it reads that name, which registers the artifacts it reads next. ``DIFFUSION_FUSE_LOG``, read
later, wins. ``trace_artifact`` writes a structured artifact under ``TORCH_TRACE`` (shown by tlparse).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

LOGGER_NAME = "diffusion_fuse"
ENV_VAR = "DIFFUSION_FUSE_LOG"
COMPONENTS = ("backend", "verify", "lowering", "fxpasses", "patterns", "kernels")
_LEVELS = {
    "debug": logging.DEBUG,
    "+": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "-": logging.ERROR,
}


# torch artifacts: name -> (what it prints, off by default: only when named, not with +diffusion_fuse)
ARTIFACTS = {
    "diffusion_fuse_graphs": ("the ATen graph before and after rewriting, and the graph that runs", True),
    "diffusion_fuse_verdicts": ("the verifier's verdict per rewritten site", False),
    "diffusion_fuse_timings": ("seconds per graph pass and per verifier step", False),
}


def get_logger(child: str | None = None) -> logging.Logger:
    return logging.getLogger(LOGGER_NAME if child is None else f"{LOGGER_NAME}.{child}")


def register_with_torch() -> None:
    """``diffusion_fuse`` as a torch log and ``ARTIFACTS`` as torch artifacts (once per process)."""
    from torch._logging import _internal

    if _internal.log_registry.is_log(LOGGER_NAME) and all(_internal.log_registry.is_artifact(a) for a in ARTIFACTS):
        return
    if not _internal.log_registry.is_log(LOGGER_NAME):
        _internal.register_log(LOGGER_NAME, LOGGER_NAME)
    for name, (description, off_by_default) in ARTIFACTS.items():
        if not _internal.log_registry.is_artifact(name):
            _internal.register_artifact(name, description, visible=True, off_by_default=off_by_default)


def artifact_logger(component: str, artifact: str) -> logging.Logger:
    """The logger of one torch artifact, a child of ``diffusion_fuse.<component>``; it logs at DEBUG."""
    import torch._logging

    register_with_torch()
    return torch._logging.getArtifactLogger(f"{LOGGER_NAME}.{component}", artifact)


def current_compile_id() -> Any:
    """torch's id of the compile under way (``CompileId``; ``str`` of it is ``0/1``), or None."""
    import torch._guards

    return torch._guards.CompileContext.current_compile_id()


@contextlib.contextmanager
def in_compile(compile_id: Any) -> Iterator[None]:
    """Run under ``compile_id``'s compile context, so that torch's log lines and trace records carry it (the
    verifier runs on the first call, after Dynamo's compile has ended)."""
    import torch._guards

    if compile_id is None or torch._guards.CompileContext.try_get() is not None:
        yield
        return
    with torch._guards.compile_context(torch._guards.CompileContext(compile_id)):
        yield


def trace_artifact(name: str, payload: Callable[[], Any], encoding: str = "string") -> None:
    """One ``TORCH_TRACE`` artifact (``encoding`` "string" or "json"); nothing is built when no trace is written."""
    from torch._logging._internal import trace_log, trace_structured

    if not trace_log.handlers:
        return

    def payload_fn() -> str:
        value = payload()
        return value if isinstance(value, str) else json.dumps(value, default=str)

    trace_structured("artifact", metadata_fn=lambda: {"name": name, "encoding": encoding}, payload_fn=payload_fn,
                     expect_trace_id=False)


def parse_settings(raw: str) -> dict[str, int]:
    """``DIFFUSION_FUSE_LOG``'s value → {logger name: level}."""
    out: dict[str, int] = {}
    for item in (x.strip().lower() for x in raw.split(",")):
        if not item:
            continue
        if item in _LEVELS:
            out[LOGGER_NAME] = _LEVELS[item]
            continue
        level = {"+": logging.DEBUG, "-": logging.ERROR}.get(item[0], logging.INFO)
        name = item[1:] if item[0] in "+-" else item
        if name.startswith(LOGGER_NAME + "."):
            name = name[len(LOGGER_NAME) + 1:]
        if name in ("all", LOGGER_NAME):
            out[LOGGER_NAME] = level
        elif name in COMPONENTS:
            out[f"{LOGGER_NAME}.{name}"] = level
        else:
            raise ValueError(
                f"{ENV_VAR}: {item!r} is neither a level ({sorted(k for k in _LEVELS if k.isalpha())}, '+', '-') "
                f"nor a component ([+|-]name with name in {['diffusion_fuse', *COMPONENTS]})"
            )
    return out


def configure_from_env() -> None:
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return
    for name, level in parse_settings(raw).items():
        logging.getLogger(name).setLevel(level)
    logger = get_logger()
    if not logger.handlers:  # TORCH_LOGS may have installed one already
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[diffusion_fuse %(levelname)s] %(name)s: %(message)s"))
        logger.addHandler(handler)


def error_message(e: BaseException) -> str:
    """``Type: first line of the message``, at most 200 characters: how reports and logs name an exception."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
