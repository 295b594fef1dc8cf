"""The ``diffusion_fuse`` torch.compile backend.

``torch.compile(model, backend="diffusion_fuse", mode=..., options={...})`` finds
``diffusion_fuse`` through the ``torch_dynamo_backends`` entry point and calls
``diffusion_fuse(gm, example_inputs, mode=..., options=...)``.

lossless (default): AOTAutograd inference graph with no decomposition table → passes →
  verifier → boxed callable. Ops no pattern took are the ATen ops eager runs.
  Training graphs (grad-enabled calls) are left unrewritten: plain ATen, exact grads.
high: Inductor's ``compile_fx`` with the same passes as a post-grad ``CustomGraphPass``;
  the anchors of enabled families are kept out of Inductor's decompositions so the
  patterns see them; the first call is checked end to end against the Dynamo graph run
  eagerly, within ``rtol/atol``, and a graph that fails falls back to the lossless tier.
``mode="reduce-overhead"`` is accepted; CUDA graphs are not applied yet (logged).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from . import lowering  # noqa: F401  (registers the ops)
from . import patterns  # noqa: F401  (registers the families)
from .config import Options, parse_options
from .log import get_logger
from .patterns.match_utils import source_location
from .patterns.registry import REGISTRY
from .verify.compare import compare_close
from .verify.report import NearMissRecord, Report, default_report
from .verify.verifier import VerifiedGraph, site_record

_log = get_logger("backend")


class DiffusionFuseBackend:
    """A configured backend: ``torch.compile(m, backend=DiffusionFuseBackend(...))`` works too."""

    def __init__(self, options: Options | Mapping[str, Any] | None = None, report: Report | None = None) -> None:
        self.options = options if isinstance(options, Options) else parse_options(options)
        self.report = report if report is not None else default_report()
        if self.options.mode == "reduce-overhead":
            _log.info("mode='reduce-overhead': CUDA graphs are not applied by diffusion_fuse yet; running without")

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]):
        if self.options.quality == "high":
            return self._high(gm, example_inputs)
        return self._lossless(gm, example_inputs)

    # --- lossless ------------------------------------------------------------------------
    def _lossless(self, gm: fx.GraphModule, example_inputs: Sequence[Any]):
        options, report = self.options, self.report

        def inference_compiler(agm: fx.GraphModule, _inputs: Sequence[Any]):
            greport = report.new_graph(options.quality)
            return make_boxed_func(VerifiedGraph(agm, options, greport, report))

        def training_compiler(agm: fx.GraphModule, _inputs: Sequence[Any]):
            greport = report.new_graph(options.quality, kind="training")
            greport.notes.append("grad-enabled graph: left unrewritten (plain ATen, exact gradients)")
            return make_boxed_func(agm.forward)

        return aot_autograd(
            fw_compiler=training_compiler,
            bw_compiler=training_compiler,
            inference_compiler=inference_compiler,
            keep_inference_input_mutations=True,
        )(gm, example_inputs)

    # --- high ----------------------------------------------------------------------------
    def _high(self, gm: fx.GraphModule, example_inputs: Sequence[Any]):
        from torch._inductor import list_mode_options
        from torch._inductor.compile_fx import compile_fx
        from torch._inductor.decomposition import select_decomp_table

        from .fxpasses.inductor_pass import InductorFusePass

        greport = self.report.new_graph("high")

        def on_context(graph: fx.Graph, ctx) -> None:
            for s in ctx.sites:
                rec = site_record(s, "lossless" if s.exact else "high")
                rec.status = "unverified"
                rec.reason = "inside Inductor: checked end to end only"
                greport.sites[s.id] = rec
            for m in ctx.near_misses:
                greport.near_misses.append(NearMissRecord(m.pattern, m.anchor.name, source_location(m.anchor), m.reason))

        keep = {a for fam in REGISTRY.enabled(self.options.pattern_enabled) for a in fam.anchors}
        decomps = {op: fn for op, fn in select_decomp_table().items() if op not in keep}
        patches: dict[str, Any] = dict(list_mode_options(self.options.mode) if self.options.mode else {})
        patches["post_grad_custom_pre_pass"] = InductorFusePass(self.options, on_context)
        compiled = compile_fx(gm, example_inputs, config_patches=patches, decompositions=decomps)
        return _CheckedHigh(compiled, gm, self, greport)


class _CheckedHigh:
    """First call of a tier-"high" graph: compare with the Dynamo graph run eagerly."""

    def __init__(self, compiled, gm: fx.GraphModule, backend: DiffusionFuseBackend, greport) -> None:
        self.compiled, self.gm, self.backend, self.greport = compiled, gm, backend, greport
        self.fn = None

    def __call__(self, *args: Any) -> Any:
        if self.fn is not None:
            return self.fn(*args)
        out = self.compiled(*args)
        if not self.backend.options.verify or torch.compiler.is_compiling():
            self.fn = self.compiled
            return out
        ref = self.gm(*args)
        opts = self.backend.options
        flat_ref = ref if isinstance(ref, (list, tuple)) else [ref]
        flat_out = out if isinstance(out, (list, tuple)) else [out]
        bad = [v for r, o in zip(flat_ref, flat_out) if isinstance(r, torch.Tensor)
               for v in [compare_close(r, o, opts.rtol, opts.atol)] if not v]
        self.greport.verifications.append({"end_to_end_within_tolerance": not bad,
                                           "detail": bad[0].detail if bad else ""})
        if bad:
            note = f"tier high: output outside tolerance ({bad[0].detail}); graph falls back to the lossless tier"
            _log.warning(note)
            self.greport.notes.append(note)
            for rec in self.greport.sites.values():
                rec.status, rec.reason = "rejected", "end-to-end tolerance"
            self.fn = lambda *a: self.gm(*a)
            return ref
        self.fn = self.compiled
        return out


def diffusion_fuse(gm: fx.GraphModule, example_inputs: Sequence[Any], mode: str | None = None,
                   options: Mapping[str, Any] | None = None):
    """The entry point torch.compile calls (registered as ``torch_dynamo_backends.diffusion_fuse``)."""
    return DiffusionFuseBackend(parse_options(options, mode))(gm, example_inputs)
