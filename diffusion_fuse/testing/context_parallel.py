"""Several processes running one diffusers transformer under context parallelism, for tests and benchmarks.

``spawn(fn, world, *args)`` starts ``world`` processes on this host, each with ``torch.distributed`` initialized
(gloo on CPU, NCCL on CUDA, through a rendezvous file), calls ``fn(rank, world, *args)`` in each and returns what
every rank's ``fn`` returned (plain data), in rank order; a rank that raises, or processes still running after
``timeout`` seconds (a collective that never completes), raise ``RuntimeError`` here.

``enable_context_parallel(model, ulysses_degree=..., ring_degree=...)`` is ``model.enable_parallelism(
config=ContextParallelConfig(...))``; on a CPU-only build, diffusers 0.42 computes the rank's device as ``rank %
torch.accelerator.device_count()``, which is ``rank % 0`` there, so the call sees a device count of 1 (the device
is then ``cpu``, the mesh a gloo one; nothing else changes).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["compiled_vs_eager", "cpu_flash_attention", "enable_context_parallel", "in_sequence", "spawn"]


@contextlib.contextmanager
def _one_cpu_device() -> Iterator[None]:
    if torch.accelerator.device_count() > 0:
        yield
        return
    count = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = count


def enable_context_parallel(model: torch.nn.Module, ulysses_degree: int = 1, ring_degree: int = 1) -> None:
    """Split ``model``'s sequence over the ranks as its ``_cp_plan`` says (diffusers' own hooks and attention)."""
    from diffusers import ContextParallelConfig

    with _one_cpu_device():
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=ulysses_degree, ring_degree=ring_degree))


@contextlib.contextmanager
def cpu_flash_attention() -> Iterator[None]:
    """``aten._scaled_dot_product_flash_attention`` on CPU tensors, as the CPU's own flash kernel
    (``_scaled_dot_product_flash_attention_for_cpu``, the same output and log-sum-exp).

    diffusers' ring attention merges each step's output by its log-sum-exp, which only its CUDA backends return
    (``_native_flash`` calls this op, which has no CPU kernel); with this, ring attention runs on the CPU.
    """
    lib = torch.library.Library("aten", "IMPL")

    def flash(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal,
                                                                                 scale=scale)
        none = torch.empty(0, dtype=torch.int64)
        return out, lse, none, none, q.shape[2], k.shape[2], none, none, torch.empty(0, dtype=q.dtype)

    lib.impl("_scaled_dot_product_flash_attention", flash, "CPU")
    try:
        yield
    finally:
        lib._destroy()


def _entry(rank: int, world: int, fn: Callable[..., Any], args: tuple, rendezvous: str, results: str,
           device: str, timeout_s: float) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        out: Any = ("ok", fn(rank, world, *args))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        out = ("error", traceback.format_exc())
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    torch.save(out, os.path.join(results, f"rank{rank}.pt"))


def spawn(fn: Callable[..., Any], world: int, *args: Any, device: str = "cpu", timeout: float = 300.0) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` fresh processes; their return values in rank order."""
    with tempfile.TemporaryDirectory(prefix="diffusion_fuse_cp_") as tmp:
        ctx = mp.start_processes(_entry, args=(world, fn, args, os.path.join(tmp, "rendezvous"), tmp, device,
                                               timeout), nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"{world} processes still running after {timeout:.0f} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
        outs = []
        for rank in range(world):
            status, value = torch.load(os.path.join(tmp, f"rank{rank}.pt"), weights_only=False)
            if status != "ok":
                raise RuntimeError(f"rank {rank} raised:\n{value}")
            outs.append(value)
        return outs


@contextlib.contextmanager
def _kept_graphs() -> Iterator[list]:
    """The ``VerifiedGraph``s built inside the block, in order."""
    from ..verify import verifier

    graphs: list = []
    init = verifier.VerifiedGraph.__init__

    def keep(self, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        graphs.append(self)

    verifier.VerifiedGraph.__init__ = keep
    try:
        yield graphs
    finally:
        verifier.VerifiedGraph.__init__ = init


@contextlib.contextmanager
def _end_to_end_fails() -> Iterator[None]:
    """This rank's end-to-end comparisons fail, as a rewritten graph whose output differs would."""
    from ..verify import verifier
    from ..verify.compare import Verdict

    run_checked = verifier.VerifiedGraph._run_checked

    def failing(run: Callable[..., Any], args: list[Any], ref_out: Any) -> tuple[Any, Verdict]:
        out, _ = run_checked(run, args, ref_out)
        return out, Verdict(False, "forced end-to-end mismatch")

    verifier.VerifiedGraph._run_checked = staticmethod(failing)
    try:
        yield
    finally:
        verifier.VerifiedGraph._run_checked = staticmethod(run_checked)


def compiled_vs_eager(rank: int, world: int, name: str = "flux", dtype: str = "float32", ulysses_degree: int = 2,
                      ring_degree: int = 1, scenarios: tuple[str, ...] = ("plain",), fault_op: str = "norm_modulate",
                      odd_rank: int = 0, calls: int = 2, fullgraph: bool = True, device: str = "cpu",
                      attention_backend: str | None = None) -> dict[str, Any]:
    """One rank of: tiny model ``name`` single-process eager, then under context parallelism eager and compiled with
    the ``diffusion_fuse`` backend, once per scenario (a fresh compile each):

    - ``plain``: nothing forced;
    - ``site_rejected``: on rank ``odd_rank`` alone, op ``fault_op``'s output is perturbed while the first call is
      verified, so that rank's verifier rejects its sites;
    - ``end_to_end_fails``: on rank ``odd_rank`` alone, the first call's end-to-end comparison fails;
    - ``cudagraphs``: ``options={"cudagraphs": True}`` (``mode="reduce-overhead"``), at least 3 calls (verification,
      warm-up and recording, replay); on the CPU the graphs run without (noted in the report).

    ``attention_backend``: diffusers' ``set_attention_backend`` before parallelism (ring attention needs one that
    returns the log-sum-exp, e.g. ``_native_flash``, CUDA only).

    Returns plain data: whether CP eager equals single-process eager, and per scenario each call's bitwise equality
    with CP eager, every site's status and reason, the collectives of the reference and the final graph, and the
    ``diffusion_fuse`` ops of the final graph.
    """
    import diffusion_fuse

    from ..lowering import faults
    from ..verify.agree import collectives
    from .tiny_models import build

    model, kwargs = build(name, dtype=getattr(torch, dtype), device=device)
    if attention_backend is not None:
        model.set_attention_backend(attention_backend)
    with torch.no_grad():
        single = model(**kwargs)[0]
    enable_context_parallel(model, ulysses_degree=ulysses_degree, ring_degree=ring_degree)
    with torch.no_grad():
        eager = model(**kwargs)[0]
    result: dict[str, Any] = {
        "rank": rank,
        "cp_equals_single": bool(diffusion_fuse.verify.compare_bitwise(single, eager)),
        "cp_vs_single_max_abs": float((single.double() - eager.double()).abs().max()),
        "scenarios": {},
    }
    for scenario in scenarios:
        torch._dynamo.reset()
        report = diffusion_fuse.Report()
        options = {"cudagraphs": True} if scenario == "cudagraphs" else None
        compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(options, report),
                                 fullgraph=fullgraph)
        odd = rank == odd_rank
        forced = (faults.inject(fault_op) if scenario == "site_rejected" and odd
                  else _end_to_end_fails() if scenario == "end_to_end_fails" and odd else contextlib.nullcontext())
        equal = []
        with _kept_graphs() as graphs, torch.no_grad():
            with forced:
                equal.append(bool(diffusion_fuse.verify.compare_bitwise(eager, compiled(**kwargs)[0])))
            for _ in range(max(calls, 3 if scenario == "cudagraphs" else 0) - 1):
                equal.append(bool(diffusion_fuse.verify.compare_bitwise(eager, compiled(**kwargs)[0])))
        result["scenarios"][scenario] = {
            "equal": equal,
            "graphs": len(graphs),
            "sites": {cid: [rec.status, rec.reason] for g in report.graphs for cid, rec in g.sites.items()},
            "notes": [n for g in report.graphs for n in g.notes],
            "collectives_ref": [collectives(vg.ref) for vg in graphs],
            "collectives_final": [collectives(vg.build(frozenset(vg.rejected))) for vg in graphs],
            "final_ops": [sorted(str(n.target) for n in vg.build(frozenset(vg.rejected)).graph.nodes
                                 if n.op == "call_function" and "diffusion_fuse" in str(n.target)) for vg in graphs],
            "agreed": [vg.agreement is not None for vg in graphs],
            "kernels": dict(report.counters()["kernel"]),
            "cudagraphs": [g.cudagraphs for g in report.graphs],
        }
    return result


def in_sequence(rank: int, world: int, *runs: tuple[Callable[..., Any], dict[str, Any]]) -> list[Any]:
    """``fn(rank, world, **kwargs)`` for each ``(fn, kwargs)`` of ``runs`` on one set of processes, in order."""
    return [fn(rank, world, **kwargs) for fn, kwargs in runs]


def ring_on_cpu(rank: int, world: int, **kwargs: Any) -> dict[str, Any]:
    """``compiled_vs_eager`` with ring attention on the CPU: ``_native_flash`` over ``cpu_flash_attention``."""
    with cpu_flash_attention():
        return compiled_vs_eager(rank, world, attention_backend="_native_flash", **kwargs)
