"""The verifier: judge every rewritten site on the first real call, put back the bad ones.

On the first call with a new input signature (never while Dynamo traces or a CUDA graph
is being captured), ``VerifiedGraph``:

1. runs the *reference* graph (the ATen graph before any rewrite) node by node on copies
   of the inputs the graph mutates, and as soon as a site's inputs and outputs exist,
   runs the site's replacement on the reference inputs and compares it with the reference
   outputs (bitwise for exact sites; ``rtol/atol`` for tier-"high" ones). Every site is
   judged alone, on reference values. Values are freed as soon as nothing needs them.
2. has the fused graph rebuilt without the rejected sites (site ids are stable across
   rebuilds; the rebuilding is the pipeline's, ``Pipeline.build``) and runs it on the real inputs;
3. compares its outputs with the reference outputs; a mismatch there puts every site back
   (the mutated inputs are restored first) and says so.

Verdicts are kept per site; the graph chosen is kept per input signature. The verifier judges and
reports; the graphs it chooses between come from the ``Pipeline`` the backend gives it.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.fx as fx

from ..config import Options
from ..log import error_message, get_logger
from ..lowering.dispatch import capturing
from .compare import Verdict, compare_bitwise, compare_close
from .graph_diff import op_counts
from .report import GraphReport, Report

_log = get_logger("verify")


@dataclasses.dataclass
class SiteCheck:
    id: str
    inputs: list[str]  # reference-graph node names
    outputs: list[str]
    replacement: fx.GraphModule
    exact: bool
    diagnose: Callable[[Sequence[Any]], str] | None = None


class Pipeline(Protocol):
    """What the verifier chooses between: the graph rewritten without some sites, and what runs in its place."""

    def build(self, exclude: frozenset[str]) -> fx.GraphModule: ...

    def runtime(self, gm: fx.GraphModule, rewrite: bool = True) -> tuple[Callable[..., Any], dict[str, int]]: ...


def run_with_site_checks(
    gm: fx.GraphModule,
    args: Sequence[Any],
    checks: Sequence[SiteCheck],
    judge: Callable[[SiteCheck, list[Any], list[Any]], Verdict],
) -> tuple[Any, dict[str, Verdict]]:
    """Run ``gm`` node by node; judge each site when its values exist; free values early."""
    nodes = list(gm.graph.nodes)
    by_name = {n.name: n for n in nodes}
    order = {n: i for i, n in enumerate(nodes)}
    pins: collections.Counter[fx.Node] = collections.Counter()
    triggers: dict[fx.Node, list[SiteCheck]] = collections.defaultdict(list)
    verdicts: dict[str, Verdict] = {}
    for c in checks:
        missing = [x for x in c.inputs + c.outputs if x not in by_name]
        if missing:  # a value a rewrite made that the reference graph has no node for: nothing to compare with
            verdicts[c.id] = Verdict(False, f"no reference value for {missing[0]}")
            continue
        involved = [by_name[x] for x in c.inputs + c.outputs]
        for n in involved:
            pins[n] += 1
        triggers[max(involved, key=order.__getitem__)].append(c)
    remaining = {n: len(n.users) for n in nodes}
    env: dict[fx.Node, Any] = {}
    arg_iter = iter(args)

    def release(n: fx.Node) -> None:
        if remaining[n] <= 0 and pins[n] <= 0 and n.op != "output":
            env.pop(n, None)

    result = None
    for node in nodes:
        if node.op == "placeholder":
            env[node] = next(arg_iter)
        elif node.op == "get_attr":
            obj: Any = gm
            for part in node.target.split("."):
                obj = getattr(obj, part)
            env[node] = obj
        elif node.op == "call_function":
            a, k = fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
            env[node] = node.target(*a, **k)
        elif node.op == "output":
            result = fx.node.map_arg(node.args[0], env.__getitem__)
        else:
            raise RuntimeError(f"diffusion_fuse verifier: unexpected node op {node.op} ({node.name})")
        for c in triggers.pop(node, ()):
            ins = [env[by_name[x]] for x in c.inputs]
            refs = [env[by_name[x]] for x in c.outputs]
            try:
                got = list(c.replacement(*ins))
                verdicts[c.id] = judge(c, refs, got)
            except Exception as e:  # noqa: BLE001 - a failing replacement is a rejection, not a crash
                verdicts[c.id] = Verdict(False, f"replacement raised {type(e).__name__}: {e}")
            if not verdicts[c.id] and c.diagnose is not None:
                try:
                    verdicts[c.id].detail += f"; {c.diagnose(ins)}"
                except Exception as e:  # noqa: BLE001 - a diagnosis must not break verification
                    verdicts[c.id].detail += f"; diagnosis failed: {type(e).__name__}: {e}"
            for x in c.inputs + c.outputs:
                pins[by_name[x]] -= 1
                release(by_name[x])
        for inp in node.all_input_nodes:
            remaining[inp] -= 1
            release(inp)
        release(node)
    return result, verdicts


def _signature_fn(gm: fx.GraphModule) -> Callable[[Sequence[Any]], tuple]:
    """Signature of the inputs that can vary between calls of one compiled graph."""
    dynamic = []
    for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt) or (
            isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride()))
        ):
            dynamic.append(i)

    def sig(args: Sequence[Any]) -> tuple:
        return tuple(
            (tuple(args[i].shape), tuple(args[i].stride())) if isinstance(args[i], torch.Tensor) else int(args[i])
            for i in dynamic
        )

    return sig


class VerifiedGraph:
    """The callable the lossless tier returns for one ATen inference graph.

    ``ref``: the graph as traced; ``fused``: it with every site rewritten (``pipeline.build(frozenset())``);
    ``checks``: one per site; ``mutated``: the indices of the inputs the graph writes in place.
    """

    def __init__(self, ref: fx.GraphModule, fused: fx.GraphModule, checks: Sequence[SiteCheck], mutated: list[int],
                 pipeline: Pipeline, options: Options, graph_report: GraphReport, report: Report) -> None:
        self.ref, self.pipeline, self.options = ref, pipeline, options
        self.greport, self.report = graph_report, report
        self._builds: dict[frozenset[str], fx.GraphModule] = {frozenset(): fused}
        self.checks = {c.id: c for c in checks}
        self.rejected: set[str] = set()
        self._chosen: dict[tuple, Callable[..., Any]] = {}
        self._unverified: Callable[..., Any] | None = None
        self._mutated = mutated
        self.mutated_inputs = bool(mutated)
        self._signature = _signature_fn(ref)

    # --- building ------------------------------------------------------------------------
    def build(self, exclude: frozenset[str]) -> fx.GraphModule:
        if exclude not in self._builds:
            self._builds[exclude] = self.pipeline.build(exclude)
        return self._builds[exclude]

    @property
    def fused(self) -> fx.GraphModule:
        return self._builds[frozenset()]

    # --- running -------------------------------------------------------------------------
    def needs_verification(self, args: Sequence[Any]) -> bool:
        """Whether a call with ``args`` runs the verifier (sites to judge, a new input signature)."""
        return bool(self.checks) and self.options.verify and self._signature(args) not in self._chosen

    def __call__(self, *args: Any) -> Any:
        if not self.checks:
            return self.ref(*args)
        if not self.options.verify:
            if self._unverified is None:
                self._unverified = self.pipeline.runtime(self.fused)[0]
            return self._unverified(*args)
        sig = self._signature(args)
        fn = self._chosen.get(sig)
        if fn is not None:
            return fn(*args)
        if torch.compiler.is_compiling() or capturing():
            # Never verify inside a trace or a capture: run the unrewritten graph instead.
            _log.info("graph %d: not verified yet and capturing/compiling; running the reference graph",
                      self.greport.graph_id)
            return self.ref(*args)
        return self._verify_and_run(sig, list(args))

    def _judge(self, check: SiteCheck, refs: list[Any], got: list[Any]) -> Verdict:
        max_err = 0.0
        for i, (r, g) in enumerate(zip(refs, got)):
            if check.exact:
                v = compare_bitwise(r, g)
            else:
                v = compare_close(r, g, self.options.rtol, self.options.atol)
                max_err = max(max_err, v.max_abs_err or 0.0)
            if not v:
                if v.first_diff is not None and len(refs) > 1:
                    v.first_diff = {**v.first_diff, "output": i}
                return v
        return Verdict(True, "bitwise equal" if check.exact else f"within tolerance (max |err| {max_err:.3g})")

    @staticmethod
    def _run_checked(run: Callable[..., Any], args: list[Any], ref_out: Any) -> tuple[Any, Verdict]:
        """``run``'s output and its end-to-end verdict against ``ref_out``; a graph that raises is a failed verdict
        (a rewrite that made a graph Python cannot run must cost the sites, not the user's forward)."""
        try:
            out = run(*args)
        except Exception as e:  # noqa: BLE001 - the caller puts every site back and runs the reference graph
            return None, Verdict(False, f"the rewritten graph raised {error_message(e)}")
        return out, compare_bitwise(ref_out, out)

    def _verify_and_run(self, sig: tuple, args: list[Any]) -> Any:
        live = [c for cid, c in self.checks.items() if cid not in self.rejected]
        snapshot = {i: args[i].clone() for i in self._mutated}
        ref_args = list(args)
        for i, t in snapshot.items():
            ref_args[i] = t.clone()
        with torch.no_grad():
            ref_out, verdicts = run_with_site_checks(self.ref, ref_args, live, self._judge)
        del ref_args
        for cid, v in verdicts.items():
            rec = self.greport.sites[cid]
            rec.verdict, rec.first_diff = v.detail, v.first_diff
            if v:
                rec.status, rec.reason = "kept", ""
            else:
                rec.status, rec.reason = "rejected", v.detail
                self.rejected.add(cid)
                _log.warning("site %s (%s) rejected by the verifier: %s", cid, rec.location, v.detail)
        gm = self.build(frozenset(self.rejected))
        # what runs from now on, checked end to end below: fewer Python calls, the same kernels
        run, rewrites = self.pipeline.runtime(gm)
        out, e2e = self._run_checked(run, args, ref_out)
        if not e2e and any(rewrites.values()):
            # a binding or at::linear took another path than the one traced: run the ops as traced
            note = f"runtime rewrites {rewrites} put back: the output differed ({e2e.detail})"
            _log.warning("graph %d: %s", self.greport.graph_id, note)
            self.greport.notes.append(note)
            for i, t in snapshot.items():
                args[i].copy_(t)
            run, rewrites = self.pipeline.runtime(gm, rewrite=False)
            out, e2e = self._run_checked(run, args, ref_out)
        entry = {"signature": repr(sig)[:200], "sites_checked": len(verdicts), **rewrites,
                 "rejected": sorted(c for c, v in verdicts.items() if not v), "end_to_end_equal": bool(e2e)}
        if not e2e:
            # Sites that pass alone but not together: trust nothing in this graph.
            raised = e2e.detail.startswith("the rewritten graph raised")
            what = "failed" if raised else "output differs from the reference"
            note = f"end-to-end {what} ({e2e.detail}); every site put back"
            _log.warning("graph %d: %s", self.greport.graph_id, note)
            self.greport.notes.append(note)
            for cid in self.checks:
                self.rejected.add(cid)
                rec = self.greport.sites[cid]
                if rec.status == "kept":
                    rec.status, rec.reason = "rejected", "end-to-end mismatch"
            for i, t in snapshot.items():
                args[i].copy_(t)
            gm = run = self.ref
            out = gm(*args)
        self.greport.final_code, self.greport.final_ops = gm.code, op_counts(gm)
        self.greport.verifications.append(entry)
        self._chosen[sig] = run
        if self.options.report:
            self.report.save(self.options.report)
        return out
