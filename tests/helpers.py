"""Shared test helpers."""

from __future__ import annotations

import torch

import diffusion_fuse


def compile_and_run(model, kwargs, options=None, fullgraph=True):
    """(eager output, compiled output, report) for one call under no_grad."""
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(options, report), fullgraph=fullgraph)
    with torch.no_grad():
        ref = model(**kwargs)
        out = compiled(**kwargs)
    return ref, out, report


def bitwise_equal(a, b) -> bool:
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(bitwise_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return bool(diffusion_fuse.verify.compare_bitwise(a, b))
    return a == b

