"""The pass pipeline: every registered pass (fxpasses/base.py ``register_pass``), in the order their ``after``
declarations give (a pass runs after each pass it names; passes no declaration orders keep their registration
order).

lossless: cat_of_slices (a cat that rebuilds the tensor its inputs were sliced from is that tensor; exact by
          construction, noted in the report) → fuse_patterns (the anchored families) → grouped_gemv (linears of
          one short input as one launch) → drop_clones (clones of contiguous intermediates are their input:
          eval-mode Dropout, traced as a clone up to torch 2.13) → interleave_scatter (even/odd halves written
          into ``empty_like`` are their stack; exact by construction) → pointwise (groups what the families
          left) → common_subexpressions (a call repeating an earlier one's arguments reads its result) →
          cleanup. What runs after
          verification is that graph with runtime rewrites that change no kernel, only what the host does to
          issue them (``PassManager.runtime``): recompose_linear (view → t → addmm → view back to one
          ``aten.linear``), python_bindings (ATen ops through torch's generated bindings, as eager calls them)
          and direct_calls (our ops without the dispatcher).
high:     the same pipeline runs inside Inductor as a post-grad ``CustomGraphPass`` (fxpasses/inductor_pass.py),
          with the tier-"high" families enabled too. Only cat_of_slices, fuse_patterns and cleanup act there:
          the other passes act in the lossless tier only, and Inductor fuses pointwise work itself.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import time
from collections.abc import Callable

import torch.fx as fx

from ..config import Options
from ..log import artifact_logger, error_message, get_logger
from . import (  # noqa: F401  (register)
    cat_of_slices,
    cleanup,
    common_subexpressions,
    direct_calls,
    drop_clones,
    fuse_patterns,
    interleave_scatter,
    python_bindings,
    recompose_linear,
)
from .base import PASSES, GraphPass, PassContext, retarget_calls

# Above: the passes no family owns. A family's own pass (grouped_gemv, pointwise) registers when families.load()
# imports the family's stages.

_log = get_logger("fxpasses")
_timings = artifact_logger("fxpasses", "diffusion_fuse_timings")


class PassFailed(Exception):
    """A graph pass raised: its name and what it raised (``pass cleanup raised KeyError: ...``)."""

    def __init__(self, name: str, error: BaseException) -> None:
        super().__init__(f"pass {name} raised {error_message(error)}")
        self.name = name


def copy_graph(ref: fx.GraphModule) -> fx.Graph:
    """A copy of ``ref``'s graph: same node names, meta and calling convention, owned by ``ref`` (whose attributes
    its ``get_attr`` nodes name: torch's ``SubgraphMatcher`` compares constants through the owner) until a
    GraphModule is built around it.

    ``copy.deepcopy`` of the module would also copy parameters and constants (and fails on fake ones).
    """
    graph = fx.Graph(owning_module=ref)
    graph._codegen = copy.deepcopy(ref.graph._codegen)
    out = graph.graph_copy(ref.graph, {})
    graph.output(out)
    return graph


def pass_order() -> list[str]:
    """The registered passes' names in pipeline order (``after`` names that are not registered are ignored)."""
    names = list(PASSES)
    done: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in done:
            return
        if name in visiting:
            raise ValueError(f"pass order: a cycle through {name!r}")
        visiting.add(name)
        for dep in PASSES[name].after:
            if dep in PASSES:
                visit(dep)
        visiting.discard(name)
        done.append(name)

    for name in names:
        visit(name)
    return done


class PassManager:
    """Runs the pipeline: ``rewrite`` gives the graph with every site not excluded rewritten (what the verifier
    judges), ``runtime`` what runs in its place once judged."""

    def __init__(self, options: Options, inline_user_sites: bool = False) -> None:
        self.options, self.inline_user_sites = options, inline_user_sites
        self.passes: list[GraphPass] = [PASSES[name]() for name in pass_order()]

    def run(self, graph: fx.Graph, exclude: frozenset[str] = frozenset()) -> PassContext:
        ctx = PassContext(options=self.options, exclude=exclude, inline_user_sites=self.inline_user_sites)
        timed = _timings.isEnabledFor(logging.DEBUG)
        for p in self.passes:
            start = time.perf_counter()
            try:
                p(graph, ctx)
            except Exception as e:
                raise PassFailed(p.name, e) from e
            if timed:
                _timings.debug("pass %s: %.4f s%s", p.name, time.perf_counter() - start,
                               f" (excluding {len(exclude)} site(s))" if exclude else "")
        return ctx

    def rewrite(self, ref: fx.GraphModule, exclude: frozenset[str] = frozenset()) -> tuple[fx.GraphModule, PassContext]:
        """A rewritten copy of ``ref`` (``ref`` itself is left as it is). A pass that raises leaves the whole
        graph as traced (a pass may have rewritten part of it): noted, logged, never a failed compile."""
        graph = copy_graph(ref)
        try:
            ctx = self.run(graph, exclude)
            gm = fx.GraphModule(ref, graph)  # its code generated once, after the passes
        except Exception as e:  # noqa: BLE001 - a broken pass costs its graph's rewrites, not the user's forward
            note = f"{e}; the graph runs as traced" if isinstance(e, PassFailed) else \
                f"the rewritten graph did not build ({error_message(e)}); the graph runs as traced"
            _log.warning(note)
            gm = fx.GraphModule(ref, copy_graph(ref))
            ctx = PassContext(options=self.options, exclude=exclude, notes=[note])
        return gm, ctx

    @staticmethod
    def runtime(gm: fx.GraphModule, rewrite: bool = True) -> tuple[Callable, dict[str, int]]:
        """The graph that runs in place of ``gm`` (verified end to end by the caller), and what the
        ATen-level runtime rewrites changed (``rewrite=False``: our ops' direct calls only)."""
        counts = {"linears_recomposed": 0, "python_bindings": 0}
        if rewrite:
            gm, counts["linears_recomposed"] = recompose_linear.recompose_linear(gm)

        def change(n: fx.Node) -> tuple | None:  # our ops and ATen's are apart: one copy of the graph does both
            new = direct_calls.direct_call(n)
            if new is None and rewrite:
                new = python_bindings.binding(n)
                counts["python_bindings"] += new is not None
            return new

        return retarget_calls(gm, change)[0], counts

    def uuid(self) -> str:
        h = hashlib.sha256()
        h.update(repr(sorted(self.options.patterns.items())).encode())
        h.update(self.options.quality.encode())
        for p in self.passes:
            h.update(p.uuid().encode())
        return h.hexdigest()
