"""The verifier: judge every rewritten site on the first real call, put back the bad ones.

On the first call with a new input signature (never while Dynamo traces or a CUDA graph
is being captured), ``VerifiedGraph``:

1. runs the *reference* graph (the ATen graph before any rewrite) node by node on copies
   of the inputs the graph mutates, and as soon as a site's inputs and outputs exist,
   runs the site's replacement on the reference inputs and compares it with the reference
   outputs (bitwise for exact sites; ``rtol/atol`` for tier-"high" ones; for both, dtype, shape and the
   strides of every dimension of size > 1). Every site is judged alone, on reference values. Values are freed
   as soon as nothing needs them.
2. has the fused graph rebuilt without the rejected sites (site ids are stable across
   rebuilds; the rebuilding is the pipeline's, ``Pipeline.build``) and runs it on the real inputs;
3. compares its outputs with the reference outputs (values, strides, and the 16-byte alignment their storage
   offsets give them: what the caller receives); a mismatch there puts every site back
   (the mutated inputs are restored first) and says so.

A graph with collectives in it (context parallelism) runs in lockstep on several ranks: each decision above is shared
over the collectives' process groups before it takes effect (``Agreement``, verify/agree.py), so a site one rank
rejects is put back on every rank and all ranks run the same graph.

Verdicts are kept per site; the graph chosen is kept per input signature. The verifier judges and
reports; the graphs it chooses between come from the ``Pipeline`` the backend gives it. With
``options.warm_start`` the verdicts of a call are stored, and a later process whose call has the same key
(verify/warm_start.py) takes them instead of running steps 1-3.
The verifier's log lines and trace artifacts carry the compile id of the graph's compile (``log.in_compile``).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import operator
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.fx as fx

from ..config import Options
from ..log import artifact_logger, current_compile_id, error_message, get_logger, in_compile, trace_artifact
from ..lowering import precompile
from ..lowering.dispatch import capturing
from . import warm_start
from .agree import Agreement
from .compare import Verdict, compare_bitwise, compare_close, compare_layout
from .graph_diff import op_counts
from .report import GraphReport, Report
from .runtime_graph import publish

_log = get_logger("verify")
_verdicts = artifact_logger("verify", "diffusion_fuse_verdicts")
_timings = artifact_logger("verify", "diffusion_fuse_timings")
# graph-level data the report artifact leaves out: each has its own artifact
_TRACE_SKIP = {"ref_graph", "fused_graph", "ref_code", "fused_code", "final_code"}


@dataclasses.dataclass
class SiteCheck:
    """One site as the verifier judges it: the reference-graph values it reads and writes, and its replacement
    as a graph of its own (run on the reference's inputs, compared with the reference's outputs)."""

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


def dry_run(gm: fx.GraphModule, checks: Sequence[SiteCheck]) -> None:
    """Run each site's replacement once on stand-ins for its inputs (zeros of the reference values' dtypes,
    shapes, strides and storage offsets, which decide a kernel's specialization): what ``precompile.compile_ahead``
    watches to learn which kernels the checks will launch. A site whose inputs have no static layout is left out."""
    by_name = {n.name: n for n in gm.graph.nodes}
    for c in checks:
        try:
            ins = [stand_in(by_name[x].meta.get("val")) for x in c.inputs]
            with torch.no_grad():
                c.replacement(*ins)
        except Exception as e:  # noqa: BLE001 - the real check judges this site; its kernels compile there
            _log.debug("dry run: site %s left out: %s: %s", c.id, type(e).__name__, e)


def compile_device(gm: fx.GraphModule) -> torch.device | None:
    """The CUDA device of ``gm``'s first CUDA input, from its traced values; None when it has none."""
    for n in gm.graph.find_nodes(op="placeholder"):
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor) and v.device.type == "cuda":
            return v.device
    return None


def stand_in(v: Any) -> Any:
    """A zero tensor laid out as ``v`` (a fake or real tensor), or ``v`` itself when it is not a tensor."""
    if not isinstance(v, torch.Tensor):
        if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
            raise ValueError("a symbolic value")
        return v
    shape, stride, offset = tuple(v.shape), tuple(v.stride()), v.storage_offset()
    if not all(isinstance(d, int) for d in (*shape, *stride, offset)):
        raise ValueError("a symbolic layout")
    extent = offset + (1 + sum((d - 1) * s for d, s in zip(shape, stride)) if all(shape) else 0)
    return torch.zeros(extent, dtype=v.dtype, device=v.device).as_strided(shape, stride, offset)


def returned_storage(gm: fx.GraphModule) -> set[str]:
    """Names of the nodes whose storage the caller receives: the graph's outputs and what they are views of (a
    value's storage offset, and so its alignment, is observable there, and nowhere else in the graph)."""
    names: set[str] = set()
    for out in gm.graph.output_node().all_input_nodes:
        n: Any = out
        while isinstance(n, fx.Node) and n.name not in names:
            names.add(n.name)
            if n.op != "call_function" or not n.args:
                break
            if n.target is operator.getitem or _is_view(n.target):
                n = n.args[0]
            else:
                break
    return names


def _is_view(target: object) -> bool:
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.returns:
        return False
    alias = schema.returns[0].alias_info
    return alias is not None and not alias.is_write


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
    ``checks``: one per site; ``mutated``: the indices of the inputs the graph writes in place; ``agreement``: the
    ranks whose decisions this graph shares (None: this process decides alone).
    """

    def __init__(self, ref: fx.GraphModule, fused: fx.GraphModule, checks: Sequence[SiteCheck], mutated: list[int],
                 pipeline: Pipeline, options: Options, graph_report: GraphReport, report: Report,
                 agreement: Agreement | None = None) -> None:
        self.ref, self.pipeline, self.options, self.agreement = ref, pipeline, options, agreement
        self.greport, self.report = graph_report, report
        self._builds: dict[frozenset[str], fx.GraphModule] = {frozenset(): fused}
        self.checks = {c.id: c for c in checks}
        self.rejected: set[str] = set()
        self._chosen: dict[tuple, Callable[..., Any]] = {}
        self._unverified: Callable[..., Any] | None = None
        self._mutated = mutated
        self.mutated_inputs = bool(mutated)
        self._signature = _signature_fn(ref)
        self.compile_id = current_compile_id()  # made while torch compiles; verified on a later call
        # A graph the ranks share goes through verification even with no site here: the other ranks' may have some.
        self._verifies = bool(self.checks) or agreement is not None
        self._returned = returned_storage(ref)
        self._dry_run_device: torch.device | None = None  # set where the dry run waits for the first call
        self._ahead = self._compile_ahead()

    def _compile_ahead(self) -> precompile.Ahead | None:
        """The dry run at compile time, and the pool compiling what it found (CUDA): else the first call would
        compile its kernels one after another. Where a warm start will most likely take stored verdicts (their
        kernels in Triton's cache), the dry run waits for the first call to find none."""
        device = compile_device(self.ref)
        if not (self.checks and self.options.verify and device is not None and precompile.available()):
            return None
        if self.options.warm_start and self.agreement is None and self._graph_stored():
            self._dry_run_device = device
            return None
        return self._start_ahead(device)

    def _graph_stored(self) -> bool:
        try:
            return warm_start.graph_stored(self.ref, self.fused, self.options)
        except Exception as e:  # noqa: BLE001 - the first call makes the full key and says what failed
            _log.debug("graph %d: warm start's graph marks not read (%s)", self.greport.graph_id, error_message(e))
            return False

    def _start_ahead(self, device: torch.device) -> precompile.Ahead | None:
        live = [c for cid, c in self.checks.items() if cid not in self.rejected]
        try:
            return precompile.compile_ahead(lambda: dry_run(self.ref, live), device)
        except Exception as e:  # noqa: BLE001 - nothing compiled ahead: each kernel compiles at its first launch
            _log.info("graph %d: kernels not compiled ahead (%s)", self.greport.graph_id, error_message(e))
            return None

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
        return self._verifies and self.options.verify and self._signature(args) not in self._chosen

    def __call__(self, *args: Any) -> Any:
        if not self._verifies:
            return self.ref(*args)
        if not self.options.verify:
            if self._unverified is None:
                self._unverified = self.pipeline.runtime(self.fused)[0]
                with in_compile(self.compile_id):
                    publish(self.fused, self.greport)
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
        with in_compile(self.compile_id):
            return self._verify_and_run(sig, list(args))

    def _judge(self, check: SiteCheck, refs: list[Any], got: list[Any]) -> Verdict:
        """Values (bitwise, or within tolerance for a non-exact site), then the layout: a site's output must have the
        reference's strides, or what reads it downstream (a view, a pointwise op keeping its input's layout, the
        caller) sees another tensor; and, where the caller receives its storage, the reference's alignment."""
        max_err = 0.0
        for i, (r, g) in enumerate(zip(refs, got)):
            if check.exact or not isinstance(r, torch.Tensor):
                v = compare_bitwise(r, g)
            else:
                v = compare_close(r, g, self.options.rtol, self.options.atol)
                max_err = max(max_err, v.max_abs_err or 0.0)
            if v and isinstance(r, torch.Tensor) and isinstance(g, torch.Tensor):
                v = compare_layout(r, g, offset=i < len(check.outputs) and check.outputs[i] in self._returned)
            if not v:
                if v.first_diff is not None and len(refs) > 1:
                    v.first_diff = {**v.first_diff, "output": i}
                if len(refs) > 1 and not v.detail.startswith("output "):
                    v.detail = f"output {i}: {v.detail}"
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
        v = compare_bitwise(ref_out, out)
        return out, (compare_layout(ref_out, out, offset=True) if v else v)

    def _agree_on_sites(self, rejected_here: set[str]) -> dict[str, list[int]]:
        """Put back every site some rank of the agreement rejected; the ones this rank kept, with their ranks."""
        if self.agreement is None:
            return {}
        elsewhere: dict[str, list[int]] = {}
        for cid, ranks in self.agreement.union(rejected_here).items():
            if cid in self.rejected:  # this rank's own verdict, or an earlier signature's
                continue
            if cid not in self.checks:
                note = f"site {cid} rejected on rank(s) {ranks} has no counterpart on rank {self.agreement.rank}"
                _log.warning("graph %d: %s", self.greport.graph_id, note)
                self.greport.notes.append(note)
                continue
            elsewhere[cid] = ranks
            self.rejected.add(cid)
            rec = self.greport.sites[cid]
            rec.status, rec.reason = "rejected", f"rejected on rank(s) {ranks}"
            _log.warning("site %s (%s) put back on rank %d: rejected on rank(s) %s", cid, rec.location,
                         self.agreement.rank, ranks)
        if elsewhere:
            self.greport.notes.append(f"rank {self.agreement.rank}: {len(elsewhere)} site(s) it kept put back, "
                                      f"rejected on other ranks ({self.agreement.describe()})")
        return elsewhere

    def _agree_on(self, verdict: Verdict, what: str) -> Verdict:
        """``verdict`` where every rank of the agreement passed, else a failure naming the ranks that did not."""
        if self.agreement is None:
            return verdict
        failed = self.agreement.ranks_where(not verdict)
        if not verdict or not failed:
            return verdict
        note = f"{what} differed on rank(s) {failed}"
        _log.warning("graph %d, rank %d: %s", self.greport.graph_id, self.agreement.rank, note)
        return Verdict(False, note)

    def _verify_and_run(self, sig: tuple, args: list[Any], use_stored: bool = True) -> Any:
        began = time.perf_counter()
        # the kernels compiled ahead since the compile (the first verification only), before any launch needs them
        ahead, self._ahead = (self._ahead.wait() if self._ahead is not None else None), None
        key = parts = None
        # ranks sharing verdicts all verify (one rank's stored verdict would leave the others waiting)
        if self.options.warm_start and self.agreement is None:
            parts = warm_start.key_parts(self.ref, self.fused, args, self.options)
            key = warm_start.key(parts)
            entry = warm_start.load(key)
            if entry is not None and use_stored:
                return self._run_stored(sig, args, key, entry, began)
        timed = _timings.isEnabledFor(logging.DEBUG)
        start = time.perf_counter()
        if self._dry_run_device is not None:  # no stored verdict after all
            started, self._dry_run_device = self._start_ahead(self._dry_run_device), None
            ahead = started.wait() if started is not None else None
        live = [c for cid, c in self.checks.items() if cid not in self.rejected]
        if ahead is not None:
            if ahead["failed"]:
                _log.info("graph %d: %d of %d kernel(s) not compiled ahead; they compile at their first launch",
                          self.greport.graph_id, ahead["failed"], ahead["jobs"])
            if timed:
                _timings.debug("graph %d: kernels compiled ahead: %s", self.greport.graph_id, ahead)
        snapshot = {i: args[i].clone() for i in self._mutated}
        ref_args = list(args)
        for i, t in snapshot.items():
            ref_args[i] = t.clone()
        with torch.no_grad():
            ref_out, verdicts = run_with_site_checks(self.ref, ref_args, live, self._judge)
        del ref_args
        if timed:
            _timings.debug("graph %d: reference run and %d site check(s): %.4f s", self.greport.graph_id,
                           len(live), time.perf_counter() - start)
            start = time.perf_counter()
        for cid, v in verdicts.items():
            rec = self.greport.sites[cid]
            _verdicts.debug("site %s (%s): %s", cid, rec.location, v.detail)
            rec.verdict, rec.first_diff = v.detail, v.first_diff
            if v:
                rec.status, rec.reason = "kept", ""
            else:
                rec.status, rec.reason = "rejected", v.detail
                self.rejected.add(cid)
                _log.warning("site %s (%s) rejected by the verifier: %s", cid, rec.location, v.detail)
        agreed = self._agree_on_sites({cid for cid, v in verdicts.items() if not v})
        gm = self.build(frozenset(self.rejected))
        # what runs from now on, checked end to end below: fewer Python calls, the same kernels
        run, rewrites = self.pipeline.runtime(gm)
        out, e2e = self._run_checked(run, args, ref_out)
        e2e = self._agree_on(e2e, "the rewritten graph's output")
        if not e2e and any(rewrites.values()):
            # a binding or at::linear took another path than the one traced: run the ops as traced
            note = f"runtime rewrites {rewrites} put back: the output differed ({e2e.detail})"
            _log.warning("graph %d: %s", self.greport.graph_id, note)
            self.greport.notes.append(note)
            for i, t in snapshot.items():
                args[i].copy_(t)
            run, rewrites = self.pipeline.runtime(gm, rewrite=False)
            out, e2e = self._run_checked(run, args, ref_out)
            e2e = self._agree_on(e2e, "the rewritten graph's output without runtime rewrites")
        if timed:
            _timings.debug("graph %d: rebuild and end-to-end run: %.4f s", self.greport.graph_id,
                           time.perf_counter() - start)
        entry = {"signature": repr(sig)[:200], "sites_checked": len(verdicts), **rewrites,
                 "rejected": sorted(c for c, v in verdicts.items() if not v), "end_to_end_equal": bool(e2e),
                 "seconds": round(time.perf_counter() - began, 4)}
        if ahead is not None:
            entry["compiled_ahead"] = ahead
        if self.agreement is not None:
            entry["agreed_over"] = self.agreement.describe()
            entry["rejected_on_other_ranks"] = agreed
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
                if rec.status == "kept":  # one verdict per site: the end-to-end one replaces "bitwise equal"
                    rec.status, rec.reason = "rejected", "end-to-end mismatch"
                    rec.verdict = f"end-to-end mismatch ({e2e.detail})"
            for i, t in snapshot.items():
                args[i].copy_(t)
            gm = run = self.ref
            out = gm(*args)
        if key is not None:
            entry["warm_start"] = "stored"
            warm_start.store(key, {
                "verdicts": {cid: [bool(v), v.detail] for cid, v in verdicts.items()},
                "runtime_rewrites": any(rewrites.values()), "end_to_end_equal": bool(e2e),
                "end_to_end_detail": e2e.detail, "key_parts": parts})
        return self._chose(sig, gm, run, entry, out)

    def _chose(self, sig: tuple, gm: fx.GraphModule, run: Callable[..., Any], entry: dict, out: Any) -> Any:
        """Record what runs for ``sig`` from now on, publish it (log, trace, dump) and save the report."""
        self.greport.final_code, self.greport.final_ops = gm.code, op_counts(gm)
        self.greport.verifications.append(entry)
        self._chosen[sig] = run
        publish(gm, self.greport)
        trace_artifact("diffusion_fuse_report", lambda: {k: v for k, v in dataclasses.asdict(self.greport).items()
                                                         if k not in _TRACE_SKIP}, encoding="json")
        if self.options.report:
            self._save_report(self.options.report)
        return out

    def _run_stored(self, sig: tuple, args: list[Any], key: str, stored: dict[str, Any], began: float) -> Any:
        """Run with the verdicts a process stored under ``key`` (warm start): no reference run, no site check."""
        verdicts, rejected_before = stored["verdicts"], set(self.rejected)
        for cid in self.checks:
            rec = self.greport.sites[cid]
            ok, detail = verdicts.get(cid, [False, "no stored verdict"])
            rec.verdict = f"{detail} (stored verdict)"
            if ok:
                rec.status, rec.reason = "kept", ""
            else:
                rec.status, rec.reason = "rejected", f"{detail} (stored verdict)"
                self.rejected.add(cid)
            _verdicts.debug("site %s (%s): %s (stored verdict)", cid, rec.location, detail)
        if stored.get("end_to_end_equal", False):
            gm = self.build(frozenset(self.rejected))
            run, rewrites = self.pipeline.runtime(gm, rewrite=bool(stored.get("runtime_rewrites", True)))
        else:
            for cid in self.checks:
                self.rejected.add(cid)
                rec = self.greport.sites[cid]
                if rec.status == "kept":
                    rec.status, rec.reason = "rejected", "end-to-end mismatch (stored verdict)"
            gm, run, rewrites = self.ref, self.ref, {}
        snapshot = {i: args[i].clone() for i in self._mutated}
        try:
            out = run(*args)
        except Exception as e:  # noqa: BLE001 - a stored verdict must not cost the user's forward: verify it again
            note = f"warm start: the graph the stored verdicts chose raised {error_message(e)}; verified again"
            _log.warning("graph %d: %s", self.greport.graph_id, note)
            self.greport.notes.append(note)
            for i, t in snapshot.items():
                args[i].copy_(t)
            self.rejected = rejected_before
            return self._verify_and_run(sig, args, use_stored=False)
        del snapshot
        entry = {"signature": repr(sig)[:200], "sites_checked": 0, **rewrites, "rejected": sorted(self.rejected),
                 "end_to_end_equal": bool(stored.get("end_to_end_equal", False)), "warm_start": "hit",
                 "key": key[:16], "seconds": round(time.perf_counter() - began, 4)}
        _log.info("graph %d: warm start: %d stored verdict(s) taken (key %s), verifier skipped",
                  self.greport.graph_id, len(verdicts), key[:16])
        return self._chose(sig, gm, run, entry, out)

    def _save_report(self, path: str) -> None:
        """Write the report; a failure (the directory went away, a full disk) is logged and noted, and the forward
        goes on: the path itself was checked when the options were parsed."""
        try:
            self.report.save(path)
        except Exception as e:  # noqa: BLE001 - writing the report must never fail the user's forward
            note = f"report not written to {path}: {error_message(e)}"
            _log.warning("graph %d: %s", self.greport.graph_id, note)
            self.greport.notes.append(note)
