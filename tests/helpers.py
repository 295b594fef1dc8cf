"""Shared test helpers."""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch
import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd

import diffusion_fuse
from diffusion_fuse.fxpasses import PassManager

# DIFFUSION_FUSE_FULL=1: the whole suite. The default run (CI's: two cores, a twelve-minute budget) leaves out
# cases whose path another case of the default run takes already; each says which.
FULL = os.environ.get("DIFFUSION_FUSE_FULL", "") not in ("", "0")


def full_only(covered_by: str):
    """A mark for a case only the full run (``DIFFUSION_FUSE_FULL=1``) takes; ``covered_by`` names the case of the
    default run that takes the same path."""
    return pytest.mark.skipif(not FULL, reason=f"DIFFUSION_FUSE_FULL=1 runs it; the default run has {covered_by}")


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



class AdaLN(torch.nn.Module):
    """LayerNorm + AdaLN modulate as diffusers writes it: one norm_modulate site."""

    def __init__(self, dim: int = 32, out_proj: bool = False) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.proj = torch.nn.Linear(dim, 2 * dim)
        self.out = torch.nn.Linear(dim, dim) if out_proj else torch.nn.Identity()

    def forward(self, x, emb):
        scale, shift = self.proj(emb).chunk(2, dim=-1)
        return self.out(self.norm(x) * (1 + scale[:, None]) + shift[:, None])


def dropout_clones(code: str) -> list[str]:
    """The plain clones in a graph's code: eval-mode Dropout's, as torch <= 2.13 traces it (2.14 traces none);
    the ``contiguous_format`` clones of expands (RoPE's) are real copies and not among them."""
    return re.findall(r"(\w+) = torch\.ops\.aten\.clone\.default\(\w+\)", code)


def adaln_inputs(dim: int = 32, seq: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, seq, dim, generator=g), torch.randn(2, dim, generator=g)


def lossless_tiny_model(name: str, monkeypatch=None, calls: int = 2):
    """Tiny model ``name`` compiled with the lossless tier and called ``calls`` times (first call verified).

    Asserts every call equals eager bitwise. Returns ``(report, runtime graphs)``: the graphs each
    ``VerifiedGraph`` chose to run per signature (kept through ``monkeypatch`` when given, else [])."""
    from diffusion_fuse.testing.tiny_models import build
    from diffusion_fuse.verify import verifier

    graphs = []
    if monkeypatch is not None:
        init = verifier.VerifiedGraph.__init__

        def keep(self, *a, **k):
            init(self, *a, **k)
            graphs.append(self)

        monkeypatch.setattr(verifier.VerifiedGraph, "__init__", keep)
    model, kwargs = build(name)
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
    with torch.no_grad():
        ref = model(**kwargs)[0]
        for _ in range(calls):
            assert bitwise_equal(ref, compiled(**kwargs)[0])
    return report, [run for vg in graphs for run in vg._chosen.values()]


def rewrite_high(model, *args, **kwargs):
    """Trace ``model`` to the ATen graph the backend sees (no decompositions), rewrite it with the
    tier-high families and run both: (pass context, ATen graph output, rewritten graph output, rewritten graph)."""
    got = {}

    def compiler(gm, _):
        fused, ctx = PassManager(diffusion_fuse.parse_options({"quality": "high"})).rewrite(gm)
        got.update(ctx=ctx, fused=fused)

        def run(*a):
            got["ref"], got["out"] = gm(*a), fused(*a)
            return got["ref"]

        return run

    with torch.no_grad():
        torch.compile(model, backend=aot_autograd(fw_compiler=compiler, inference_compiler=compiler),
                      fullgraph=True)(*args, **kwargs)
    return got["ctx"], got["ref"], got["out"], got["fused"]


def capture_graphs(model: torch.nn.Module, kwargs: dict) -> list[fx.GraphModule]:
    """Compile with an aot_autograd backend (no decompositions) and return the captured ATen inference graph(s)."""
    from functorch.compile import make_boxed_func

    graphs: list[fx.GraphModule] = []

    def capture(gm: fx.GraphModule, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=capture, inference_compiler=capture)
    torch._dynamo.reset()
    with torch.no_grad():
        ref = model(**kwargs)[0]
        out = torch.compile(model, backend=backend, fullgraph=True)(**kwargs)[0]
    torch._dynamo.reset()
    if not torch.equal(ref, out):
        print("WARNING: captured graph output differs from eager", file=sys.stderr)
    return graphs
