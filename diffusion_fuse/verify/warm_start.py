"""Warm start: the verifier's verdicts stored by one process and reused by the next (``options={"warm_start": True}``).

A stored entry is keyed by everything the verdicts depend on except the values: the ATen graph as traced and as
rewritten (code, placeholder metadata), every argument's dtype, shape, strides, device and 16-byte alignment, the
device's name, the options that change what is rewritten or how it is judged, the package's source, torch's and
Triton's versions and the environment variables that change which kernels run (``TRITON_INTERPRET``,
``DIFFUSION_FUSE_*``). Where the key is stored the verifier does not run: the sites it kept are kept, those it put
back are put back, and the runtime rewrites are applied as they were. Where anything differs the call is verified
and its verdicts stored. The values (weights, inputs) are not in the key: a stored verdict says the kernels matched
eager on the first process's values, which is what warm start trusts.

Each store also marks its graph (the key without the call's arguments, ``graph_stored``): a graph compiled with
a mark will most likely take stored verdicts at its first call, so the verifier leaves its dry run (the kernels
compiled ahead, lowering/precompile.py) to a first call that finds none.

Generated pointwise kernels are reused through their own files (``kernels/pointwise.py``, named by their source's
hash) and Triton's cache; this module stores only verdicts, under ``config.cache_root()``/verdicts.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from ..config import Options, cache_root
from ..log import get_logger

_log = get_logger("verify")
_PACKAGE = Path(__file__).resolve().parents[1]
# where things go, and how many processes compile: no verdict depends on them
_ENV_SKIP = {"DIFFUSION_FUSE_CACHE_DIR", "DIFFUSION_FUSE_DUMP_DIR", "DIFFUSION_FUSE_LOG",
             "DIFFUSION_FUSE_COMPILE_WORKERS"}


@functools.lru_cache(maxsize=1)
def package_digest() -> str:
    """sha256 of the package's Python files: a changed kernel, guard or pass is a different key."""
    h = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        h.update(str(path.relative_to(_PACKAGE)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"cuda {props.name} sm{props.major}{props.minor}"
    return f"{device.type} {platform.machine()} {platform.processor()}"


def _value_meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return [str(v.dtype), list(v.shape), list(v.stride()), str(v.device), v.data_ptr() % 16]
    if isinstance(v, (int, float, bool, str)) or v is None:
        return repr(v)
    return type(v).__name__


def _placeholder_meta(gm: fx.GraphModule) -> list[str]:
    out = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = n.meta.get("val")
            out.append(f"{n.name}: {v.dtype}{list(v.shape)}{list(v.stride())}" if isinstance(v, torch.Tensor)
                       else f"{n.name}: {v!r}")
    return out


_CALL_PARTS = ("args", "devices", "device_name")  # what only the call's arguments tell


def key_parts(ref: fx.GraphModule, fused: fx.GraphModule, args: Sequence[Any], options: Options) -> dict[str, Any]:
    """What the key hashes, as plain data (also stored beside the verdicts, to tell what differed)."""
    devices = sorted({str(a.device) for a in args if isinstance(a, torch.Tensor)})
    first = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    return {
        **graph_parts(ref, fused, options),
        "args": [_value_meta(a) for a in args],
        "devices": devices,
        "device_name": device_name(first),
    }


def graph_parts(ref: fx.GraphModule, fused: fx.GraphModule, options: Options) -> dict[str, Any]:
    """The key's parts known when the graph is compiled: all but the call's arguments."""
    return {
        "ref_code": ref.code,
        "fused_code": fused.code,
        "placeholders": _placeholder_meta(ref),
        "options": {"quality": options.quality, "patterns": sorted(options.patterns.items()),
                    "rtol": options.rtol, "atol": options.atol},
        "package": package_digest(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "env": sorted((k, v) for k, v in os.environ.items()
                      if (k == "TRITON_INTERPRET" or k.startswith("DIFFUSION_FUSE_")) and k not in _ENV_SKIP),
    }


def graph_stored(ref: fx.GraphModule, fused: fx.GraphModule, options: Options) -> bool:
    """Whether some call of this graph has stored verdicts (its first call here will most likely take them)."""
    return os.path.exists(_graph_path(key(graph_parts(ref, fused, options))))


def _graph_path(graph_key: str) -> str:
    return os.path.join(cache_root(), "verdicts", "graphs", graph_key)


def key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _path(k: str) -> str:
    return os.path.join(cache_root(), "verdicts", f"{k}.json")


def load(k: str) -> dict[str, Any] | None:
    """The entry stored under ``k``, or None (none stored, or unreadable: logged, then verified again)."""
    path = _path(k)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
        if not isinstance(entry.get("verdicts"), dict):
            raise ValueError("no verdicts")
        return entry
    except (OSError, ValueError) as e:
        _log.warning("warm start: stored verdicts %s unreadable (%s); verifying again", path, e)
        return None


def store(k: str, entry: dict[str, Any]) -> None:
    """Write ``entry`` under ``k`` (atomically: a concurrent reader sees the old file or the new one)."""
    path = _path(k)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(entry, f, default=str)
        os.replace(tmp, path)
    except OSError as e:
        _log.warning("warm start: verdicts not stored at %s (%s)", path, e)
        return
    parts = entry.get("key_parts")
    if isinstance(parts, dict):  # the graph's mark, for graph_stored
        mark = _graph_path(key({name: v for name, v in parts.items() if name not in _CALL_PARTS}))
        try:
            os.makedirs(os.path.dirname(mark), exist_ok=True)
            open(mark, "w").close()
        except OSError as e:
            _log.warning("warm start: graph mark not written at %s (%s); its next compile dry-runs again", mark, e)
