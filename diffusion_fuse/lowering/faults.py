"""Fault injection: make an op's kernel wrong or failing on purpose, to see the safety nets work.

Two ways to turn a fault on, for ops dispatched through ``GuardedKernel`` (lowering/dispatch.py):

    with diffusion_fuse.lowering.faults.inject("norm_modulate", kind="perturb", index=3):
        ...

    DIFFUSION_FUSE_FAULT=norm_modulate:perturb:3 python ...      # op:kind[:index], comma-separated list

(the variable is read when the package is imported; ``faults.refresh()`` re-reads it).

Kinds:

- ``perturb``: add 1 to element ``index`` (flat, modulo the element count) of the op's output,
  on the kernel path *and* on the reference path (on CPU only the reference path runs). The
  verifier must reject every site of the op, name the element, and the output must stay eager's.
- ``raise``: the kernel raises ``RuntimeError`` as a failing kernel would; the dispatcher handles
  it exactly like a real kernel error (the reference result is returned, the call is counted as
  ``kernel error: ...`` and logged; a real kernel is disabled for that input layout).

The op name is the ``GuardedKernel``'s (``norm_modulate``); ``diffusion_fuse::norm_modulate`` is
accepted too. The context manager wins over the environment variable for the same op.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator

import torch

ENV_VAR = "DIFFUSION_FUSE_FAULT"
KINDS = ("perturb", "raise")


@dataclasses.dataclass(frozen=True)
class Fault:
    op: str
    kind: str = "perturb"
    index: int = 0
    # raise, where no kernel runs: the layouts whose stand-in kernel already failed (dispatch.py)
    failed: set = dataclasses.field(default_factory=set, compare=False, hash=False, repr=False)

    def error(self) -> RuntimeError:
        return RuntimeError(f"injected fault ({self.op}:{self.kind})")

    def apply(self, out: object) -> object:
        """The op's output with this fault applied (``perturb``; ``raise`` is the dispatcher's)."""
        if self.kind != "perturb":
            return out
        if isinstance(out, (list, tuple)):
            return type(out)(self.apply(o) if i == 0 else o for i, o in enumerate(out))
        if not isinstance(out, torch.Tensor) or out.numel() == 0:
            return out
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(self.index % out.numel()), out.shape))
        out = out.clone()
        old = out[idx].clone()
        out[idx] += 1
        if torch.equal(out[idx], old) or not torch.isfinite(old).all():
            # 1 does not change this value (inf, NaN, or too large for the dtype): make it 0 (or 1).
            out[idx] = 0 if old.item() != 0 else 1
        return out


def _norm_op(op: str) -> str:
    return op.split("::")[-1].split(".")[0]


def parse(spec: str) -> dict[str, Fault]:
    """``op:kind[:index]`` entries, comma-separated → {op: Fault}; raises ``ValueError`` on a bad one."""
    out: dict[str, Fault] = {}
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        parts = entry.split("::", 1)[-1].split(":")  # a "diffusion_fuse::" prefix is allowed
        op = parts[0] if len(parts) <= 3 else ""
        kind = parts[1] if len(parts) > 1 else "perturb"
        index = parts[2] if len(parts) > 2 else "0"
        if kind not in KINDS or not op or not index.isdigit():
            raise ValueError(f"{ENV_VAR}: bad entry {entry!r}; expected op:kind[:index] with kind in {list(KINDS)} "
                             "and index >= 0, e.g. norm_modulate:perturb:3")
        out[_norm_op(op)] = Fault(_norm_op(op), kind, int(index))
    return out


_lock = threading.Lock()
_injected: dict[str, list[Fault]] = {}  # op → stack of context-manager faults
_env_faults: dict[str, Fault] = {}


def refresh() -> dict[str, Fault]:
    """Re-read ``DIFFUSION_FUSE_FAULT`` (read once when the package is imported, like
    ``DIFFUSION_FUSE_LOG``, so that dispatch pays no environment lookup per call)."""
    global _env_faults
    _env_faults = parse(os.environ.get(ENV_VAR, ""))
    return _env_faults


def active(op: str) -> Fault | None:
    """The fault in force for ``op``, or None (two dict checks when none is)."""
    if _injected:
        stack = _injected.get(op)
        if stack:
            return stack[-1]
    if _env_faults:
        return _env_faults.get(op)
    return None


refresh()  # a bad value fails at import, like DIFFUSION_FUSE_LOG


@contextlib.contextmanager
def inject(op_name: str, kind: str = "perturb", index: int = 0) -> Iterator[Fault]:
    """Inject a fault into ``op_name``'s output while the block runs (see the module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"inject: kind={kind!r} is not allowed; allowed: {list(KINDS)}")
    if int(index) < 0:
        raise ValueError(f"inject: index={index} must be >= 0")
    fault = Fault(_norm_op(op_name), kind, int(index))
    with _lock:
        _injected.setdefault(fault.op, []).append(fault)
    try:
        yield fault
    finally:
        with _lock:
            stack = _injected.get(fault.op, [])
            if fault in stack:
                stack.remove(fault)
            if not stack:
                _injected.pop(fault.op, None)
