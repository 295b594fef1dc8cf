"""Logging for diffusion_fuse.

Everything logs through ``logging.getLogger("diffusion_fuse")`` (children such as
``diffusion_fuse.verify``). ``DIFFUSION_FUSE_LOG`` sets the level the first time the
package is imported, in the spirit of ``TORCH_LOGS``: ``debug``, ``info``, ``warning``
(default), ``error``, or ``+``/``-`` as shorthands for debug/error.
"""

from __future__ import annotations

import logging
import os

LOGGER_NAME = "diffusion_fuse"
ENV_VAR = "DIFFUSION_FUSE_LOG"
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


def configure_from_env() -> None:
    raw = os.environ.get(ENV_VAR, "").strip().lower()
    if not raw:
        return
    if raw not in _LEVELS:
        raise ValueError(f"{ENV_VAR}={raw!r} is not a level; allowed: {sorted(_LEVELS)}")
    logger = get_logger()
    logger.setLevel(_LEVELS[raw])
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[diffusion_fuse %(levelname)s] %(name)s: %(message)s"))
        logger.addHandler(handler)
