"""The diffusers zoo (diffusion_fuse/testing/zoo.py) compiled with the lossless tier on the CPU, fp32 and bf16.

Per model and dtype: the compiled output equals eager's bit for bit, every site the families matched is kept by the
verifier, and no pass or matcher failed (no error in the report's near misses or notes). Models Dynamo cannot take
whole (``ZooModel.fullgraph`` False) compile with graph breaks; every other model compiles with ``fullgraph=True``.

Default run: one model per norm form that no model of diffusion_fuse.testing.tiny_models has
(tests/test_models_lossless.py runs those in both dtypes), in bf16 (``norm_form``: the shared norm classes it uses,
whether it has one of its own, and whether it keeps modules in fp32, where bf16's casts differ from fp32's; the
first model of each form in zoo order): each case is mostly Dynamo's tracing, about ten seconds, and every model
would double the CPU suite. The GPU zoo (tests/gpu/test_zoo_gpu.py) runs bf16 on every model;
``DIFFUSION_FUSE_FULL=1`` runs every model in both dtypes here.

The cases run in one worker process per core (compiling is single-threaded Python; CI has two cores), started once
for the selected cases; each test asserts on its own case's result.
"""

import concurrent.futures
import logging
import multiprocessing
import os
import traceback
import warnings

import pytest
import torch
from helpers import FULL, bitwise_equal, compile_and_run

from diffusion_fuse.testing.zoo import ZOO

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# What a failed pass, matcher, rewrite or check writes into a near miss or a note (fxpasses/, verify/verifier.py).
ERROR_MARKERS = ("raised", "failed", "did not build", "put back", "differs")

# Known failures, each with its reason; strict: one that starts passing fails until it is taken off this list.
XFAIL = {
    ("sana_wm", "bf16"): "eager SANA-WM fails in bf16, on the CPU and on CUDA (its camera geometry needs fp32; "
                         "with fp32 cameras a bf16 einsum meets an fp32 operand)",
}


# norm classes shared across models; a model's own classes (e.g. CogView4AdaLayerNormZero) wrap these
SHARED_NORMS = {"LayerNorm", "RMSNorm", "FP32LayerNorm", "GroupNorm", "AdaLayerNorm", "AdaLayerNormZero",
                "AdaLayerNormZeroSingle", "AdaLayerNormContinuous", "AdaLayerNormSingle"}


def norm_form(name: str) -> tuple:
    """The shared norm classes among the model's norm modules (those with "Norm" in their name), whether it has a
    norm class of its own, and whether it keeps modules in fp32.

    A model whose build raises is a form of its own (its test reports the error)."""
    entry = ZOO[name]
    try:
        with torch.random.fork_rng(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # diffusers' deprecation warnings, as in run_case
            model, _ = entry.build(torch.float32)
    except Exception:  # noqa: BLE001 - the case itself raises and says why
        return ("build raised", name)
    norms = {type(m).__name__ for m in model.modules() if "norm" in type(m).__name__.lower()}
    return (tuple(sorted(norms & SHARED_NORMS)), bool(norms - SHARED_NORMS),
            bool(getattr(entry.cls, "_keep_in_fp32_modules", None)))


def cases() -> list:
    """(name, dtype) of every case this run checks: see the module docstring."""
    # the tiny_models entries: tests/test_models_lossless.py compiles the same builds in both dtypes, and checks
    # more (every family's site count, the near misses, the counters)
    if FULL:
        names = list(ZOO)
    else:
        # a norm form a tiny model has runs in both dtypes there already
        first: dict[tuple, str] = {norm_form(n): n for n in ZOO if ZOO[n].tiny}
        for n in ZOO:
            first.setdefault(norm_form(n), n)
        names = [n for n in first.values() if not ZOO[n].tiny]
    dtypes = DTYPES if FULL else ["bf16"]  # bf16: the dtype users run, with the casts fp32 has not
    return [pytest.param(n, dtype, id=f"{n}-{dtype}") for dtype in dtypes for n in names]


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return []


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(f"{record.name}: {record.getMessage()}")


def run_case(name: str, dtype: str, device: str = "cpu") -> dict:
    """Compile and run one zoo model; the verdicts as plain data (this runs in a worker process)."""
    torch.set_num_threads(1)
    torch._dynamo.reset()
    warnings.filterwarnings("ignore")
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    records = _Records()
    logging.getLogger("diffusion_fuse").addHandler(records)
    logging.getLogger("diffusion_fuse").propagate = False
    try:
        entry = ZOO[name]
        model, kwargs = entry.build(DTYPES[dtype], device=device)
        ref, out, report = compile_and_run(model, kwargs, fullgraph=entry.fullgraph)
        refs = _tensors(ref)
        errors = [f"near miss {m.pattern} at {m.location}: {m.reason}" for g in report.graphs for m in g.near_misses
                  if any(k in m.reason for k in ERROR_MARKERS)]
        errors += [f"graph {g.graph_id}: {n}" for g in report.graphs for n in g.notes
                   if any(k in n for k in ERROR_MARKERS)]
        return dict(
            degenerate=not refs or not all(t.isfinite().all() and t.count_nonzero() for t in refs),
            bitwise=bitwise_equal(ref, out),
            graphs=len(report.graphs),
            not_kept=[(s.id, s.status, s.reason) for s in report.sites() if s.status != "kept"],
            sites=len(report.sites()),
            kernel_calls=sum(report.counters()["kernel"].values()),
            errors=errors,
            table=report.table(),
            log=records.lines,
        )
    except Exception:  # noqa: BLE001 - reported by the test of this case
        return dict(raised=traceback.format_exc(), log=records.lines)
    finally:
        logging.getLogger("diffusion_fuse").removeHandler(records)
        torch._dynamo.reset()


@pytest.fixture(scope="module")
def results(request):
    """Every selected case of this module, run in worker processes."""
    cases = sorted({(item.callspec.params["name"], item.callspec.params["dtype"]) for item in request.session.items
                    if item.module is request.module and hasattr(item, "callspec")})
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no fork of this process's threads
    workers = max(1, min(os.cpu_count() or 1, len(cases)))
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        futures = {case: pool.submit(run_case, *case) for case in cases}
        return {case: f.result() for case, f in futures.items()}


@pytest.mark.parametrize(("name", "dtype"), cases())
def test_zoo_model_is_bitwise_eager(name, dtype, results, request):
    if (name, dtype) in XFAIL:
        request.applymarker(pytest.mark.xfail(reason=XFAIL[name, dtype], strict=True))
    r = results[name, dtype]
    assert "raised" not in r, r["raised"]
    assert not r["degenerate"], "eager output is empty, all zero or not finite"
    assert r["bitwise"], r["table"]
    assert r["graphs"], "the backend compiled no graph"
    assert not r["not_kept"], r["table"]
    assert not r["errors"], "\n".join(r["errors"])
