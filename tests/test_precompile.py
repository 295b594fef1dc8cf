"""lowering/precompile.py on the CPU: a worker compiles a kernel for the H200 (sm_90) into Triton's cache under the
key the launch computes, and the collector records only launches inside ``launching()``. The dry run on real
launches, and its cache hits, are tested on the GPU (tests/gpu/test_precompile_gpu.py)."""

import json
import os
import time
import types

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import serialize_specialization_data  # noqa: E402

from diffusion_fuse.kernels.launch import EAGER_NUMERICS  # noqa: E402
from diffusion_fuse.kernels.lut16 import _lut16_kernel  # noqa: E402
from diffusion_fuse.lowering import precompile  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)


def lut16_specialization():
    """What Triton's JIT hands its compile for a launch of the lut16 kernel on aligned bf16 tensors."""
    k = _lut16_kernel
    const = {"LO": 100, "SPAN": 64, "SPECIAL": 0, "TABLE": 256, "BLOCK": 1024}
    sig = {n: ("constexpr" if n in const else {"X": "*bf16", "O": "*bf16", "LUT": "*i32", "n": "i32"}[n])
           for n in k.arg_names}
    constexprs = {(k.arg_names.index(n),): v for n, v in const.items()}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(3)}
    options = make_backend(SM90).parse_options({"num_warps": 4, **EAGER_NUMERICS})
    return sig, constexprs, attrs, options


def cache_entries(root: str) -> set[str]:
    return set(os.listdir(root)) if os.path.isdir(root) else set()


def test_a_worker_fills_the_cache_the_launch_reads_and_a_failing_job_is_left_to_it(tmp_path, monkeypatch):
    cache, mods = tmp_path / "cache", tmp_path / "mods"  # the launch's Triton cache; the jobs' module files
    mods.mkdir()
    # the pool starts under another cache (as before Inductor sets TRITON_CACHE_DIR in this process): each job
    # carries the one the launch reads
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache_at_start"))
    monkeypatch.setenv(precompile.WORKERS_ENV, "1")
    # kept from the worker: a module name there has torch import that package whole (the spy would see it)
    monkeypatch.setenv("TORCH_LOGS", "+diffusion_fuse")
    sig, constexprs, attrs, options = lut16_specialization()
    job = precompile.CompileJob(_lut16_kernel.__module__, _lut16_kernel.fn.__code__.co_filename, "_lut16_kernel",
                                serialize_specialization_data("_lut16_kernel", sig, constexprs, attrs, options, "k"),
                                SM90, str(cache))

    def module_job(name: str, source: str) -> precompile.CompileJob:
        (mods / f"{name}.py").write_text(source)
        return precompile.CompileJob(name, str(mods / f"{name}.py"), "k", "{}", SM90, str(cache))

    broken = precompile.CompileJob("no_such_module_here", "/nonexistent.py", "k", "{}", SM90, str(cache))
    # prints to stdout, Python's and the descriptor's, then has no kernel
    noisy = module_job("noisy", "import os\nprint('noise')\nos.write(1, b'noise')\n")
    # what the worker has imported with every kernel module: the kernels' needs, not the backend
    spy = module_job("spy", "import importlib, json, pkgutil, sys\nimport diffusion_fuse.kernels as k\n"
                            "for m in pkgutil.iter_modules(k.__path__):\n"
                            "    importlib.import_module(f'diffusion_fuse.kernels.{m.name}')\n"
                            "open(__file__ + '.json', 'w').write(json.dumps(sorted(sys.modules)))\n")
    slow = module_job("slow", "import time\ntime.sleep(600)\n")  # hangs: the worker is killed, the launch has it
    monkeypatch.setattr(precompile, "IDLE_CLOSE_S", 0.2)
    monkeypatch.setattr(precompile, "JOB_TIMEOUT_S", 3.0)
    try:
        compiler = precompile._Compiler()  # one worker: the replies survive the noise
        for j in (noisy, broken, job, spy, slow):
            compiler.submit(j)
        done = compiler.finish(time.perf_counter())
        workers = list(precompile._pool)
        deadline = time.monotonic() + 30
        while precompile._pool and time.monotonic() < deadline:  # unused, the pool goes (its memory with it)
            time.sleep(0.05)
        assert not precompile._pool
        assert all(w.proc.wait(timeout=30) != 0 for w in workers)  # the slow job's worker was killed
    finally:
        precompile._close_pool()
    assert (done["jobs"], done["compiled"], done["failed"]) == (5, 1, 4), done
    imported = set(json.loads((mods / "spy.py.json").read_text()))
    assert {"torch", "triton.compiler", "diffusion_fuse.kernels.lut16"} <= imported
    assert not imported & {"diffusion_fuse.backend", "diffusion_fuse.fxpasses", "torch._inductor"}, imported
    filled = cache_entries(str(cache))
    assert filled and not cache_entries(str(tmp_path / "cache_at_start"))
    # the JIT's own compile of the same launch (JITFunction._do_compile) finds the binary: no new cache entry
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    triton.compile(ASTSource(_lut16_kernel, sig, constexprs, attrs), target=SM90, options=options.__dict__)
    assert cache_entries(str(cache)) == filled


def test_only_launches_inside_launching_are_recorded_and_skipped():
    fake_jit = types.SimpleNamespace(device_caches={0: (None, None, SM90, None, None)}, fn=lut16_specialization)
    info = types.SimpleNamespace(module=__name__, name="k", jit_function=fake_jit)

    def launch(spec: str):
        return precompile._hook(key=spec, repr="", fn=info, compile={"device": 0, "specialization_data": spec},
                                is_manual_warmup=False, already_compiled=False)

    skipped = []

    def dry_run():
        assert precompile.collecting()  # what dispatch asks before launching inside launching()
        skipped.append(launch("probe"))  # a plan's probe: compiled and run for real
        with precompile.launching():
            skipped.append(launch("a"))
            skipped.append(launch("a"))  # the same specialization again: one job
            skipped.append(launch("b"))

    jobs = precompile.collect(dry_run)
    assert skipped == [None, True, True, True]
    assert [j.specialization for j in jobs] == ["a", "b"]
    assert jobs[0].target == SM90 and jobs[0].path == __file__
    assert launch("a") is None and not precompile.collecting()  # after the collection: launches compile as usual


def test_dispatch_in_a_dry_run_launches_inside_launching_and_counts_nothing():
    import torch

    from diffusion_fuse.lowering import counters
    from diffusion_fuse.lowering.dispatch import GuardedKernel

    depths = []

    def plan(a):
        def launch(a):
            depths.append(precompile._state.depth)  # 1: a launch here that would compile is recorded, not run
            return a[0] * 2

        return launch

    op = GuardedKernel("precompile_dry_run_test", lambda args: 0, lambda a: (True, ""), plan, lambda x: x * 2,
                       lambda args: args, needs_triton=False)
    before = counters.snapshot()
    precompile.collect(lambda: op(torch.ones(3)))
    assert depths == [1] and counters.snapshot() == before
    op(torch.ones(3))  # a real call: launched outside, counted
    assert depths == [1, 0]
    assert counters.diff(counters.snapshot(), before)["kernel"] == {"precompile_dry_run_test": 1}


def test_compile_ahead_runs_the_dry_run_on_real_tensors_and_the_wait_gives_what_it_compiled(monkeypatch):
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    monkeypatch.setenv(precompile.WORKERS_ENV, "0")  # no pool: jobs are counted, launches compile them
    made = []

    def dry_run():
        made.append(torch.zeros(2))  # a stand-in
        with precompile.launching():
            precompile._state.sink(precompile.CompileJob("m", "p", "k", "a", SM90))
        raise RuntimeError("a site that cannot run on stand-ins")  # logged; the collection ends

    with FakeTensorMode():  # as when a backend is called
        ahead = precompile.compile_ahead(dry_run)
    assert made and not isinstance(made[0], FakeTensor)
    done = ahead.wait()
    assert (done["jobs"], done["compiled"], done["failed"]) == (1, 0, 0), done
    assert done["collected"] >= 0 and done["waited"] >= 0 and ahead.wait() is done
    assert not precompile.collecting()


def test_a_compiler_nobody_waits_for_gives_the_pool_back(monkeypatch):
    """A graph compiled and never called: its jobs still end, and the pool may close once idle."""

    class Worker:  # answers at once; two compilers' threads may ask it
        def ask(self, job):
            return ""

        def close(self):
            pass

    monkeypatch.setenv(precompile.WORKERS_ENV, "2")
    monkeypatch.setattr(precompile, "_pool", [Worker(), Worker()])
    before = precompile._in_use

    def dry_run():
        with precompile.launching():
            for spec in "abc":
                precompile._state.sink(precompile.CompileJob("m", "p", "k", spec, SM90))

    first, second = precompile.compile_ahead(dry_run), precompile.compile_ahead(dry_run)  # neither waited for
    deadline = time.monotonic() + 30
    while precompile._in_use != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert precompile._in_use == before
    assert [(d["jobs"], d["compiled"]) for d in (first.wait(), second.wait())] == [(3, 3), (3, 3)]
    assert precompile._in_use == before  # a late wait gives nothing back twice


def test_a_lost_worker_leaves_its_jobs_to_the_others_and_the_pool_is_given_back(monkeypatch):
    import threading

    lost_asked = threading.Event()

    class Worker:
        def __init__(self, lost: bool):
            self.lost, self.asked, self.closed = lost, 0, False

        def ask(self, job):
            self.asked += 1
            if self.lost:
                lost_asked.set()
                raise BrokenPipeError("gone")
            lost_asked.wait(10)  # the lost one takes a job meanwhile
            return ""

        def close(self):
            self.closed = True

    lost, alive = Worker(True), Worker(False)
    monkeypatch.setenv(precompile.WORKERS_ENV, "2")
    monkeypatch.setattr(precompile, "_pool", [lost, alive])
    before = precompile._in_use

    def dry_run():
        with precompile.launching():
            for spec in "abcde":
                precompile._state.sink(precompile.CompileJob("m", "p", "k", spec, SM90))

    done = precompile.compile_ahead(dry_run).wait()
    assert (done["jobs"], done["compiled"] + done["failed"]) == (5, 5) and done["failed"] == lost.asked == 1, done
    assert lost.closed and precompile._pool == [alive] and precompile._in_use == before

    monkeypatch.setattr(precompile, "_pool", [])
    monkeypatch.setenv(precompile.WORKERS_ENV, "0")  # no pool at all: nothing to give back later
    assert precompile.compile_ahead(dry_run).wait()["jobs"] == 5 and precompile._in_use == before
