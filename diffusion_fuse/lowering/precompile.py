"""Compile a first call's Triton kernels in worker processes, ahead of their launches.

A kernel's first launch compiles it (Triton's MLIR passes, ptxas, then its launcher's C module): 0.05 to 1.5 s a
kernel, holding the GIL, so threads do not overlap them. SANA-1.6B's first call launches 19 kernels this way.

``compile_ahead(fn)`` runs ``fn`` with each launch inside ``launching()`` of a kernel that has no binary yet
skipped: Triton's ``jit_cache_hook`` records the kernel's specialization data instead of compiling it, and a pool of
worker processes compiles it meanwhile, kernel and launcher, into Triton's on-disk cache, where the real launches
that follow find their binaries. The verifier runs its site replacements so, on stand-in inputs, when its graph
is compiled (verify/verifier.py), and waits for the pool at its first call (``Ahead.wait``). Launches outside
``launching()`` compile as usual: a plan's probe (kernels/mean_square.py's order search) compares a kernel's output
with eager's, so it must run for real.

The workers (``serve``) start with ``start()``, which the backend calls so that they import torch while AOTAutograd
and the passes run. Each holds an imported torch (about 0.4 GB), so the pool closes once unused for
``IDLE_CLOSE_S``.

Nothing here decides a result. A kernel the pool did not compile, or compiled under another key, compiles at its
launch as it would without this; a worker that fails is logged and left out. ``DIFFUSION_FUSE_COMPILE_WORKERS``
sets the pool's size (0: no pool).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import pickle
import queue
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..log import get_logger

_log = get_logger("lowering")
WORKERS_ENV = "DIFFUSION_FUSE_COMPILE_WORKERS"
_FRAME = struct.Struct("<Q")


@dataclasses.dataclass(frozen=True)
class CompileJob:
    """One kernel specialization, as Triton's ``jit_cache_hook`` describes it, and where its function lives."""

    module: str  # the function's module (a generated kernel's is not importable by name: ``path`` is)
    path: str
    name: str
    specialization: str  # Triton's serialized specialization data (JSON)
    target: Any  # triton.backends.compiler.GPUTarget
    cache_dir: str = ""  # the caller's Triton cache when the job was found ('': the worker's own)


def workers() -> int:
    try:
        n = int(os.environ.get(WORKERS_ENV, ""))
    except ValueError:
        n = min(8, max(1, (os.cpu_count() or 2) // 2))
    return max(0, n)


def available() -> bool:
    """Whether kernels compile at launch here: Triton compiling for a GPU (not its interpreter), a pool allowed."""
    if workers() == 0 or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    try:
        import torch
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


# --- collecting -----------------------------------------------------------------------------------------
_state = threading.local()
_hook_lock = threading.Lock()
_hook_installed = False
_previous_hook: Callable[..., Any] | None = None


def collecting() -> bool:
    """Whether this thread runs inside ``collect`` (dispatch then launches without counting or faults)."""
    return getattr(_state, "sink", None) is not None


@contextlib.contextmanager
def launching() -> Iterator[None]:
    """Around a kernel's own launch: while ``collect`` runs, a launch here that would compile is skipped."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def _hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002 - Triton's keywords
    sink = getattr(_state, "sink", None)
    if sink is None or not getattr(_state, "depth", 0):
        if _previous_hook is not None:
            return _previous_hook(key=key, repr=repr, fn=fn, compile=compile, is_manual_warmup=is_manual_warmup,
                                  already_compiled=already_compiled)
        return None
    jf = fn.jit_function
    from triton import knobs

    # the cache the launch will read: Inductor sets TRITON_CACHE_DIR in its process when it first compiles, which
    # a pool started before then does not see
    job = CompileJob(fn.module, inspect.getsourcefile(jf.fn) or "", fn.name, compile["specialization_data"],
                     jf.device_caches[compile["device"]][2], knobs.cache.dir)
    if (job.path, job.name, job.specialization) not in _state.seen:
        _state.seen.add((job.path, job.name, job.specialization))
        sink(job)
    return True  # skipped: no compile, no launch


def _install_hook() -> None:
    global _hook_installed, _previous_hook
    with _hook_lock:
        if _hook_installed:
            return
        from triton import knobs

        _previous_hook = knobs.runtime.jit_cache_hook
        knobs.runtime.jit_cache_hook = _hook
        _hook_installed = True


def collect(fn: Callable[[], Any], sink: Callable[[CompileJob], None] | None = None) -> list[CompileJob]:
    """The kernels ``fn`` would compile at launches inside ``launching()``, each once, also handed to ``sink`` as
    they are found; ``fn``'s errors are logged and end the collection (its results are never used)."""
    _install_hook()
    jobs: list[CompileJob] = []

    def record(job: CompileJob) -> None:
        jobs.append(job)
        if sink is not None:
            sink(job)

    _state.sink, _state.seen = record, set()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - a dry run only finds kernels to compile
        _log.debug("precompile: the dry run stopped at %s: %s", type(e).__name__, e)
    finally:
        _state.sink = _state.seen = None
    return jobs


class Ahead:
    """What ``compile_ahead`` started: the pool compiling the kernels a dry run found. ``wait()`` returns once they
    are compiled, with counts, seconds since the start, ``collected`` (the dry run's seconds) and ``waited`` (the
    seconds the caller waited: what is left on the first call's path)."""

    def __init__(self, fn: Callable[[], Any], device: Any) -> None:
        import torch
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        self._began = time.perf_counter()
        self._compiler = _Compiler()
        try:
            # a backend is called inside the compile's fake mode: the dry run's stand-ins are real tensors
            with unset_fake_temporarily(), (torch.cuda.device(device) if device is not None
                                            else contextlib.nullcontext()):
                collect(fn, self._compiler.submit)
        finally:
            self._compiler.close()  # every job is known: the pool is given back once they are done, waited or not
        self._collected = round(time.perf_counter() - self._began, 3)
        self._result: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def wait(self) -> dict[str, Any]:
        with self._lock:
            if self._result is None:
                began = time.perf_counter()
                done = self._compiler.finish(self._began)
                self._result = {**done, "collected": self._collected,
                                "waited": round(time.perf_counter() - began, 3)}
            return self._result


def compile_ahead(fn: Callable[[], Any], device: Any = None) -> Ahead:
    """Run the dry run ``fn`` now with ``device`` current (None: as it is), hand each kernel it finds to the pool,
    and return without waiting for them.

    The verifier calls this when its graph is compiled, so the pool compiles while Dynamo finishes the frame and
    the first call begins; the first call waits only for what is left. The dry run itself runs on the caller's
    thread: on another, its Python and the probes' in-process compiles would take the GIL from Dynamo's, and the
    two together are slower (an A/B on SANA-1.6B)."""
    return Ahead(fn, device)


# --- the pool ---------------------------------------------------------------------------------------------
# The worker imports the package's modules without its ``__init__`` (the backend, the passes, Dynamo): a job needs
# Triton, torch and a kernel's module only. With the whole package, SANA-1.6B's workers (H100 host) were ready
# 10-12 s after their start and its first call waited 2.2-2.5 s for them; without, they take the first job 5 s
# after their start and the first call waits under 0.05 s.
# The package gets a real spec: importlib.util.find_spec raises on a module without one.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WORKER_MAIN = ("import importlib.util, os, sys\n"
                f"spec = importlib.util.spec_from_file_location('diffusion_fuse', os.path.join({_PACKAGE_DIR!r}, "
                f"'__init__.py'), submodule_search_locations=[{_PACKAGE_DIR!r}])\n"
                "sys.modules['diffusion_fuse'] = importlib.util.module_from_spec(spec)\n"
                "from diffusion_fuse.lowering.precompile import serve\n"
                "serve()\n")


class _Worker:
    def __init__(self) -> None:
        # the same interpreter and import path; stdout carries the replies (the worker sends its prints to stderr)
        # without TORCH_LOGS: its output is discarded, and a module name there has torch import that package whole
        env = {**{k: v for k, v in os.environ.items() if k != "TORCH_LOGS"},
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER_MAIN], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.started = False
        self.lock = threading.Lock()  # two compilers (two graphs' dry runs) may share the worker

    def ask(self, job: CompileJob) -> str:
        """'' once ``job`` is compiled, else why not; raises if the worker is gone or takes past JOB_TIMEOUT_S."""
        with self.lock:
            if not self.started:  # its imports done (the first reply)
                self._reply(START_TIMEOUT_S)
                self.started = True
            _send(self.proc.stdin, job)
            return self._reply(JOB_TIMEOUT_S)

    def _reply(self, timeout: float) -> Any:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:  # a compile that hangs must not hang the first call: the launch compiles it instead
            self.proc.kill()
            raise TimeoutError(f"no answer in {timeout} s")
        return _receive(self.proc.stdout)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # the worker reads the end of its input and exits


_pool: list[_Worker] = []
_pool_lock = threading.Lock()
_in_use = 0  # compilers running
_idle_timer: threading.Timer | None = None
START_TIMEOUT_S = 300.0  # a worker's imports
JOB_TIMEOUT_S = 300.0  # one kernel compiles in seconds at most
IDLE_CLOSE_S = 120.0  # each worker holds an imported torch (hundreds of MB): the pool goes when unused this long


def start(use: bool = False) -> list[_Worker]:
    """Start the pool's workers (they import torch and Triton while the caller goes on), unless they run; with
    ``use``, count the caller in (``_in_use``) under the same lock, so that an idle close cannot come between."""
    global _in_use
    with _pool_lock:
        if not _pool and workers():
            try:
                _pool.extend(_Worker() for _ in range(workers()))
            except OSError as e:
                _log.warning("precompile: no worker started (%s); kernels compile at their launches", e)
        if use:
            _in_use += 1
        _close_when_idle()
        return list(_pool)


def _close_when_idle() -> None:
    """(Re)arm the idle timer; with ``_pool_lock`` held."""
    global _idle_timer
    if _idle_timer is not None:
        _idle_timer.cancel()
    _idle_timer = threading.Timer(IDLE_CLOSE_S, _close_pool, kwargs={"only_idle": True})
    _idle_timer.daemon = True
    _idle_timer.start()


def _close_pool(only_idle: bool = False) -> None:
    with _pool_lock:
        if only_idle and _in_use:
            return
        for w in _pool:
            w.close()
        _pool.clear()


atexit.register(_close_pool)


class _Compiler:
    """One thread per worker, each sending it a job and waiting for its answer, fed until ``close``; the last
    thread to end gives the pool back (so a compiler nobody waits for still frees it)."""

    def __init__(self) -> None:
        pool = start(use=True)
        self.todo: queue.SimpleQueue[CompileJob | None] = queue.SimpleQueue()
        self.done = {"jobs": 0, "compiled": 0, "failed": 0}
        self.lock = threading.Lock()
        self.closed = False
        self.running = len(pool)
        self.threads = [threading.Thread(target=self._serve, args=(w,), daemon=True) for w in pool]
        for t in self.threads:
            t.start()
        if not pool:
            self._release()

    def submit(self, job: CompileJob) -> None:
        with self.lock:
            self.done["jobs"] += 1
        if self.threads:
            self.todo.put(job)

    def close(self) -> None:
        """No more jobs: each thread ends once the queue is empty."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for _ in self.threads:
            self.todo.put(None)

    def finish(self, began: float) -> dict[str, Any]:
        """``close``, then wait for every job; counts and the seconds since ``began``."""
        self.close()
        for t in self.threads:
            t.join()
        return {**self.done, "seconds": round(time.perf_counter() - began, 3)}

    @staticmethod
    def _release() -> None:
        global _in_use
        with _pool_lock:
            _in_use -= 1
            _close_when_idle()

    def _serve(self, w: _Worker) -> None:
        try:
            while (job := self.todo.get()) is not None:
                try:
                    why = w.ask(job)
                except Exception as e:  # noqa: BLE001 - a broken pipe or an unreadable reply: this worker is done
                    why = f"worker lost: {type(e).__name__}: {e}"
                    w.close()
                    with _pool_lock:
                        if w in _pool:
                            _pool.remove(w)
                with self.lock:
                    self.done["failed" if why else "compiled"] += 1
                if why:
                    _log.debug("precompile: %s.%s not compiled ahead: %s", job.module, job.name, why)
                    if why.startswith("worker lost"):
                        return  # the other threads take the rest
        finally:
            with self.lock:
                self.running -= 1
                last = self.running == 0
            if last:
                self._release()


def _send(stream, obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(_FRAME.pack(len(data)) + data)
    stream.flush()


def _receive(stream) -> Any:
    head = stream.read(_FRAME.size)
    if len(head) < _FRAME.size:
        raise EOFError("the worker closed its output")
    (n,) = _FRAME.unpack(head)
    return pickle.loads(stream.read(n))


# --- in the worker ----------------------------------------------------------------------------------------
def compile_job(job: CompileJob) -> None:
    """Compile ``job`` as Triton's JIT would at the launch (``JITFunction.preload``'s reading of the data),
    for its target, without a GPU: the binary lands in Triton's cache under the key the launch computes."""
    import triton.language as tl
    from triton.compiler import ASTSource, make_backend
    from triton.compiler import compile as triton_compile

    if job.cache_dir:
        os.environ["TRITON_CACHE_DIR"] = job.cache_dir
    module = sys.modules.get(job.module)
    if module is None:
        try:
            module = importlib.import_module(job.module)
        except ImportError:  # a generated kernel: its file
            spec = importlib.util.spec_from_file_location(job.module, job.path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[job.module] = module
    jf = getattr(module, job.name)
    d = json.loads(job.specialization)
    constexprs = {
        tuple(k): tl.dtype(v) if tl.dtype.is_dtype(v) else
        tl.constexpr(v["constexpr"]) if isinstance(v, dict) and "constexpr" in v else v
        for k, v in zip(d["constant_keys"], d["constant_vals"])}
    attrs = dict(zip(map(tuple, d["attrs_keys"]), d["attrs_vals"]))
    signature = {k: tuple(v) if isinstance(v, list) else v for k, v in d["signature"].items()}
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in d["options"].items()}
    options = make_backend(job.target).parse_options(options)
    kernel = triton_compile(ASTSource(jf, signature, constexprs, attrs), target=job.target, options=options.__dict__)
    try:  # its launcher too: a C module per signature, compiled into the same cache (CompiledKernel._init_handles)
        from triton.runtime.driver import driver

        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001 - no driver here (a machine without the GPU's libraries): the launch builds it
        pass


def serve() -> None:
    """A worker's loop: read a job, compile it, answer '' or why not; until the parent closes its input."""
    # the replies get their own descriptor: a print while importing or compiling, Python's or a C library's, goes
    # to stderr (which the parent discards)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch  # noqa: F401 - the kernels' modules import it: before the first job, while the parent traces
    import triton.compiler  # noqa: F401

    import diffusion_fuse.kernels  # noqa: F401

    with contextlib.suppress(Exception):  # the driver's own C module, built once into the cache
        from triton.runtime.driver import driver

        driver.active.utils  # noqa: B018 - building it is the point; no device context is made
    _send(out, "started")
    while True:
        try:
            job = _receive(sys.stdin.buffer)
        except EOFError:
            return
        try:
            compile_job(job)
            why = ""
        except Exception as e:  # noqa: BLE001 - reported to the parent, which compiles it at the launch
            why = f"{type(e).__name__}: {e}"
        _send(out, why)

