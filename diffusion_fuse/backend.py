"""The ``diffusion_fuse`` torch.compile backend.

``torch.compile(model, backend="diffusion_fuse", mode=..., options={...})`` finds
``diffusion_fuse`` through the ``torch_dynamo_backends`` entry point and calls
``diffusion_fuse(gm, example_inputs, mode=..., options=...)``.

lossless (default): AOTAutograd inference graph with no decomposition table → passes →
  verifier → boxed callable. Ops no pattern took are the ATen ops eager runs.
  Training graphs (grad-enabled calls) are left unrewritten: plain ATen, exact grads.
high: Inductor's ``compile_fx`` with the family passes as a post-grad ``CustomGraphPass``;
  the anchors of enabled families are kept out of Inductor's decompositions so the
  patterns see them. Sites are verified on the first call (see ``_HighTierGraph``).
``mode="reduce-overhead"`` / ``options={"cudagraphs": True}``: lossless graphs are verified
  eagerly, then run by cudagraph trees (cudagraphs.py); tier high hands the flag to Inductor,
  whose own cudagraph trees run its compiled graph after the verifier's first call.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from . import config, families
from .config import Options
from .cudagraphs import with_cuda_graphs
from .fxpasses.scalar_fill import fill_scalars
from .log import error_message, get_logger
from .lowering import faults, precompile
from .patterns.registry import REGISTRY
from .pipeline import prepare
from .subclass_params import flatten_subclass_params
from .verify.compare import Verdict, compare_close
from .verify.report import Report, default_report
from .verify.verifier import VerifiedGraph

families.load()
faults.check_env()  # DIFFUSION_FUSE_FAULT was read before the ops it names were registered

_log = get_logger("backend")


try:  # Dynamo re-raises a backend's ShortenTraceback as it is, where it wraps anything else in BackendCompilerFailed
    from torch._dynamo.exc import ShortenTraceback as _Unwrapped
except ImportError:  # pragma: no cover - another torch: the error arrives wrapped, its text the same
    _Unwrapped = ValueError  # type: ignore[misc, assignment]


class OptionsError(ValueError, _Unwrapped):  # type: ignore[misc]
    """A bad option or value: a ``ValueError`` that Dynamo does not wrap, whenever it is raised."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        self.first_useful_frame = None


def parse_options(options: Mapping[str, Any] | None = None, mode: str | None = None) -> Options:
    """Check ``options`` (and the ``mode=`` torch.compile passes) and build an ``Options``; a bad key or value
    raises ``ValueError`` (``OptionsError``) naming it and the allowed ones."""
    try:
        return config.parse(options, mode, REGISTRY.names())
    except OptionsError:
        raise
    except ValueError as e:
        raise OptionsError(str(e)) from None


class DiffusionFuseBackend:
    """A configured backend: ``torch.compile(m, backend=DiffusionFuseBackend(...))`` works too."""

    def __init__(self, options: Options | Mapping[str, Any] | None = None, report: Report | None = None) -> None:
        self.options = options if isinstance(options, Options) else parse_options(options)
        self.report = report if report is not None else Report()
        self._by_name = False  # made for torch.compile(backend="diffusion_fuse"): equal to another by its options

    def __eq__(self, other: object) -> bool:
        # Dynamo reuses a graph compiled under an equal backend: blocks compiled one by one with the same options
        # (diffusers' compile_repeated_blocks) share one compile, as they do with Inductor; its report holds it
        if self._by_name and isinstance(other, DiffusionFuseBackend) and other._by_name:
            return self.options == other.options
        return self is other

    def __hash__(self) -> int:
        return hash(repr(self.options)) if self._by_name else id(self)

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], **torch_compile_kwargs: Any):
        if torch_compile_kwargs:
            raise _object_with_options(torch_compile_kwargs)
        if self.options.quality == "high":
            return self._high(gm, example_inputs)
        return self._lossless(gm, example_inputs)

    # --- lossless ------------------------------------------------------------------------
    def _lossless(self, gm: fx.GraphModule, example_inputs: Sequence[Any]):
        options, report = self.options, self.report
        if options.verify and any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs) \
                and precompile.available():
            precompile.start()  # the compile workers import torch and Triton while AOTAutograd and the passes run

        try:
            flat = flatten_subclass_params(gm, example_inputs) if not torch.is_grad_enabled() else None
        except Exception as e:  # noqa: BLE001 - never a crash in the user's compile: AOTAutograd's own path
            _log.warning("subclass parameters left to AOTAutograd (%s: %s)", type(e).__name__, e)
            flat = None

        def inference_compiler(agm: fx.GraphModule, inputs: Sequence[Any]):
            greport = report.new_graph(options.quality)
            if flat is not None:
                greport.notes.append(f"{flat[2].count} tensor-subclass parameters flattened at compile time "
                                     "(inner tensors are the graph's inputs; no per-call unwrap by AOTAutograd)")
            try:  # before the reference is taken: exact, and no CPU node for CUDA graphs
                filled = fill_scalars(agm)
            except Exception as e:  # noqa: BLE001 - never a crash in the user's compile: the fills stay as traced
                filled = []
                greport.notes.append(f"scalar_fill raised {type(e).__name__}: {e}; the graph's fills run as traced")
                _log.warning("scalar_fill raised %s: %s", type(e).__name__, e)
            if filled:
                greport.notes.append(f"scalar_fill: {len(filled)} fill(s) from a 0-dim CPU constant made fills "
                                     f"with its value (no CPU node: CUDA graphs can take the graph): "
                                     f"{', '.join(filled[:4])}{', ...' if len(filled) > 4 else ''}")
            vg = prepare(agm, options, greport, report)
            if options.cudagraphs:
                n_dynamo = len(flat[1]) if flat is not None else len(example_inputs)  # the graph AOTAutograd saw
                return with_cuda_graphs(vg, agm, n_dynamo, inputs, greport)
            return make_boxed_func(vg)

        def training_compiler(agm: fx.GraphModule, _inputs: Sequence[Any]):
            greport = report.new_graph(options.quality, kind="training")
            greport.notes.append("grad-enabled graph: left unrewritten (plain ATen, exact gradients)"
                                 + ("; CUDA graphs not applied" if options.cudagraphs else ""))
            return make_boxed_func(agm.forward)

        compile_aot = aot_autograd(
            fw_compiler=training_compiler,
            bw_compiler=training_compiler,
            inference_compiler=inference_compiler,
            keep_inference_input_mutations=True,
        )
        if flat is not None:
            # Subclass weights (torchao Float8) unwrapped once here, not by AOTAutograd on every call
            flat_gm, flat_inputs, params = flat
            try:
                return params.wrap(compile_aot(flat_gm, flat_inputs))
            except Exception as e:  # noqa: BLE001 - the unflattened graph is always an option
                _log.warning("subclass parameters left to AOTAutograd (flattened graph failed to compile: %s: %s)",
                             type(e).__name__, e)
                flat = None
        return compile_aot(gm, example_inputs)

    # --- high ----------------------------------------------------------------------------
    def _high(self, gm: fx.GraphModule, example_inputs: Sequence[Any]):
        greport = self.report.new_graph("high")
        verified: list[VerifiedGraph] = []

        def inference_compiler(agm: fx.GraphModule, _inputs: Sequence[Any]):
            vg = prepare(agm, self.options, greport, self.report)
            verified.append(vg)
            return make_boxed_func(vg)

        # The verifier's view: the same families on the undecomposed ATen graph, judged per
        # site on the first call (bitwise for exact sites, rtol/atol for the others).
        checker = aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g.forward),
                               inference_compiler=inference_compiler,
                               keep_inference_input_mutations=True)(gm, example_inputs)
        compiled = self._inductor_or_none(gm, example_inputs, frozenset(), greport)
        return _HighTierGraph(self, gm, checker, verified, compiled, greport)

    def _inductor_or_none(self, gm: fx.GraphModule, example_inputs: Sequence[Any], exclude: frozenset[str], greport):
        """``_inductor``, or None when Inductor (with our passes inside) fails to compile: the verified ATen
        graph then runs, noted and logged; never a failed compile."""
        try:
            return self._inductor(gm, example_inputs, exclude, greport)
        except Exception as e:  # noqa: BLE001 - the checker graph is always an option
            note = f"tier high: Inductor failed to compile ({error_message(e)}); the verified ATen graph runs"
            _log.warning(note)
            greport.notes.append(note)
            return None

    def _inductor(self, gm: fx.GraphModule, example_inputs: Sequence[Any], exclude: frozenset[str], greport):
        from torch._dynamo.utils import counters as torch_counters
        from torch._inductor import list_mode_options
        from torch._inductor.compile_fx import compile_fx
        from torch._inductor.decomposition import select_decomp_table

        from .fxpasses.inductor_pass import InductorFusePass

        def on_context(graph: fx.Graph, ctx) -> None:
            greport.inductor_sites = sorted(s.id for s in ctx.sites)

        keep = {a for fam in REGISTRY.searched(self.options) for a in fam.anchors}
        decomps = {op: fn for op, fn in select_decomp_table().items() if op not in keep}
        _lower_kept_anchors_as_fallbacks(keep & set(select_decomp_table()))
        patches: dict[str, Any] = dict(list_mode_options(self.options.mode) if self.options.mode else {})
        patches["triton.cudagraphs"] = self.options.cudagraphs  # Inductor's own cudagraph trees
        patches["post_grad_custom_pre_pass"] = InductorFusePass(self.options, on_context, exclude)
        skips = torch_counters["inductor"]["cudagraph_skips"]
        compiled = compile_fx(gm, example_inputs, config_patches=patches, decompositions=decomps)
        if self.options.cudagraphs:
            # Inductor decides while compiling (CPU tensors, unsafe ops) and counts what it skips.
            skipped = torch_counters["inductor"]["cudagraph_skips"] > skips
            greport.cudagraphs = ("not applied by Inductor (TORCH_LOGS=cudagraphs says why)" if skipped
                                  else "on (Inductor's cudagraph trees, after the verifier's first call)")
        return compiled


def _lower_kept_anchors_as_fallbacks(ops) -> None:
    """Give Inductor an explicit fallback lowering for anchor ops kept out of its decompositions.

    An anchor no pattern took (a plain LayerNorm) reaches Inductor's lowering undecomposed;
    Inductor would make an implicit fallback, which it refuses when the environment sets CI
    (``make_fallback``: "a decomposition exists"). Registering the fallback explicitly is the
    same lowering without that check; it only matters for graphs that still hold the op,
    which only this backend produces.
    """
    from torch._inductor import lowering

    for op in ops:
        if op not in lowering.lowerings:
            lowering.make_fallback(op, override_decomp=True)


class _HighTierGraph:
    """A tier-"high" graph: verified per site on the first call, then run by Inductor.

    First call: the checker (the undecomposed ATen graph with the same families) judges
    every site; if it rejected any, Inductor recompiles without them (sites are keyed by
    pattern, source line and ordinal, the same in both traces); then Inductor's output is
    compared with the checker's within ``rtol/atol``. A failure there runs the checker
    (exact except for the non-exact sites it kept) from then on.
    """

    def __init__(self, backend: DiffusionFuseBackend, gm, checker, verified, compiled, greport) -> None:
        self.backend, self.gm, self.checker, self.verified = backend, gm, checker, verified
        self.compiled, self.greport = compiled, greport
        self.fn = None

    def __call__(self, *args: Any) -> Any:
        if self.fn is not None:
            return self.fn(*args)
        opts = self.backend.options
        if self.compiled is None:  # Inductor failed to compile (noted): the checker graph, verified, runs
            self.fn = self.checker
            return self.checker(*args)
        if not opts.verify or torch.compiler.is_compiling() or not self.verified:
            self.fn = self.compiled
            return self.compiled(*args)
        ref = self.checker(*args)
        vg = self.verified[0]
        if vg.rejected:
            _log.warning("tier high: recompiling with Inductor without rejected site(s) %s", sorted(vg.rejected))
            self.compiled = self.backend._inductor_or_none(self.gm, list(args), frozenset(vg.rejected), self.greport)
            if self.compiled is None:
                self.fn = self.checker
                return ref
        seen = set(getattr(self.greport, "inductor_sites", []))
        missing = sorted(set(self.greport.sites) - seen - vg.rejected)
        if missing:
            self.greport.notes.append(f"verified but not matched inside Inductor: {missing}")
        if vg.mutated_inputs:
            self.greport.notes.append("graph mutates its inputs: end-to-end check skipped on the first call")
            self.fn = self.compiled
            return ref
        try:
            out = self.compiled(*args)
        except Exception as e:  # noqa: BLE001 - never a failed forward: the verified graph's output stands
            note = f"tier high: Inductor's graph raised {error_message(e)}; running the verified ATen graph"
            _log.warning(note)
            self.greport.notes.append(note)
            self.greport.verifications.append({"inductor_within_tolerance": False, "detail": note})
            self.fn = self.checker
            return ref
        flat_ref = ref if isinstance(ref, (list, tuple)) else [ref]
        flat_out = out if isinstance(out, (list, tuple)) else [out]
        bad = [v for r, o in zip(flat_ref, flat_out) if isinstance(r, torch.Tensor)
               for v in [compare_close(r, o, opts.rtol, opts.atol)] if not v]
        failed = vg.agreement.ranks_where(bool(bad)) if vg.agreement is not None else []
        if failed and not bad:  # every rank of a graph with collectives runs the same graph
            bad = [Verdict(False, f"outside tolerance on rank(s) {failed}")]
        self.greport.verifications.append({"inductor_within_tolerance": not bad,
                                           "detail": bad[0].detail if bad else ""})
        if not bad:
            self.greport.notes.append(f"Inductor's output is within tolerance of the verified graph (rtol "
                                      f"{opts.rtol:g}, atol {opts.atol:g})")
        if bad:
            note = f"tier high: Inductor output outside tolerance ({bad[0].detail}); running the verified ATen graph"
            _log.warning(note)
            self.greport.notes.append(note)
            self.fn = self.checker
            return ref
        self.fn = self.compiled
        return out


def diffusion_fuse(gm: fx.GraphModule, example_inputs: Sequence[Any], mode: str | None = None,
                   options: Mapping[str, Any] | None = None):
    """The entry point torch.compile calls (registered as ``torch_dynamo_backends.diffusion_fuse``)."""
    opts = parse_options(options, mode)
    return DiffusionFuseBackend(opts, default_report(opts.report))(gm, example_inputs)


def _object_with_options(kwargs: Mapping[str, Any]) -> OptionsError:
    return OptionsError(f"diffusion_fuse: torch.compile({', '.join(f'{k}=...' for k in kwargs)}) with a "
                        "DiffusionFuseBackend object: give the options to the object, "
                        "backend=DiffusionFuseBackend(options)")


def _check_options_at_torch_compile() -> None:
    """Check ``torch.compile(m, backend="diffusion_fuse", mode=..., options=...)``'s options when torch.compile is
    called, as Inductor checks its own, and give that compile its own backend object and report. Torch hands a
    named backend its options only on the first compile (its ``_TorchCompileWrapper`` keeps them until then), so
    the check wraps that class's constructor, for this backend only; where the class is not there (another torch),
    the options are checked on the first compile, raising the same ``ValueError``, and graphs go to the
    process-wide report (or one per report path)."""
    import functools

    wrapper = getattr(torch, "_TorchCompileWrapper", None)
    init = getattr(wrapper, "__init__", None)
    if init is None or getattr(init, "_diffusion_fuse", False):
        return

    @functools.wraps(init)
    def checked(self, backend, mode, options, dynamic, *args: Any, **kwargs: Any) -> None:
        init(self, backend, mode, options, dynamic, *args, **kwargs)
        fn = getattr(self, "compiler_fn", None)
        if fn is diffusion_fuse:
            # one backend, and so one report, per torch.compile call (report_of)
            self.compiler_fn, self.kwargs = DiffusionFuseBackend(parse_options(options, mode)), {}
            self.compiler_fn._by_name = True
        elif isinstance(fn, DiffusionFuseBackend) and getattr(self, "kwargs", None):
            raise _object_with_options(self.kwargs)

    checked._diffusion_fuse = True  # type: ignore[attr-defined]
    wrapper.__init__ = checked


def backends_of(obj: object) -> list[DiffusionFuseBackend]:
    """The backend objects behind a compiled model or function: ``torch.compile``'s result, a module compiled in
    place (``module.compile``), or a module holding such (diffusers' ``compile_repeated_blocks``)."""
    found: dict[int, DiffusionFuseBackend] = {}
    roots = list(obj.modules()) if isinstance(obj, torch.nn.Module) else [obj]
    for root in roots:
        stack, seen = [(root, 0)], set()
        while stack:  # torch's wrappers, a few levels: OptimizedModule → context → callback → ... → backend
            o, depth = stack.pop()
            if id(o) in seen or depth > 8:
                continue
            seen.add(id(o))
            if isinstance(o, DiffusionFuseBackend):
                found.setdefault(id(o), o)
                continue
            nxt = [o.__dict__.get(a) for a in ("dynamo_ctx", "callback", "_torchdynamo_orig_backend", "compiler_fn",
                                               "_compiled_call_impl") if isinstance(getattr(o, "__dict__", None), dict)]
            if isinstance(o, types.FunctionType):
                nxt += [c.cell_contents for c in o.__closure__ or () if _filled(c)]
            stack.extend((n, depth + 1) for n in nxt if n is not None and not isinstance(n, torch.nn.Module))
    return list(found.values())


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _register_by_name() -> None:
    # The entry point finds the backend when the package is installed; registering on import
    # also covers a checkout on PYTHONPATH.
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if _BACKENDS.get("diffusion_fuse") is None:
        register_backend(name="diffusion_fuse")(diffusion_fuse)


_register_by_name()
_check_options_at_torch_compile()
