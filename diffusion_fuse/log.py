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
Python's default handling. ``TORCH_LOGS="+diffusion_fuse"`` also works (torch accepts a
module name there) and installs torch's handler; ``DIFFUSION_FUSE_LOG``, read later, wins.
An unknown component or level raises ``ValueError`` naming the allowed ones.
"""

from __future__ import annotations

import logging
import os

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


def get_logger(child: str | None = None) -> logging.Logger:
    return logging.getLogger(LOGGER_NAME if child is None else f"{LOGGER_NAME}.{child}")


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
