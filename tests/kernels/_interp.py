"""Run a test module's ``worker()`` in a child process under Triton's interpreter.

TRITON_INTERPRET must be set before triton is first imported, so each interpreter test file
starts with ``if __name__ == "__main__": os.environ["TRITON_INTERPRET"] = "1"`` and ends with
``if __name__ == "__main__": worker_main(worker)``; its fixture calls ``run_worker(__file__)``.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_worker(test_file: str, timeout: int = 900) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        proc = subprocess.run([sys.executable, test_file, "--worker", str(out)], env=env, capture_output=True,
                              text=True, timeout=timeout)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(out.read_text())


def patch_language_once_per_launch() -> None:
    """Make Triton's interpreter patch ``triton.language`` once per launch, not on every device-function call.

    The interpreter (Triton 3.6) re-patches the language modules each time a kernel calls a ``@triton.jit``
    helper, with ``inspect.getmembers`` over them, once per program: up to 40% of a worker's time.
    Here a helper call patches only the language modules the launch has not patched yet (``tl.core`` for
    ``tl.zeros``'s own body), and the launch's end restores them all. What the kernels compute is unchanged;
    without the private function (another Triton) nothing is patched."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang", None)
    if original is None or getattr(original, "once_per_launch", False):
        return
    import triton.language as tl

    launch: dict = {"langs": None, "scopes": []}

    def langs_of(fn) -> set:
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}

    class _Patched:
        def restore(self) -> None:  # the launch's scope restores
            pass

    def patch_lang(fn):
        if launch["langs"] is not None:  # a helper called inside a launch
            new = langs_of(fn) - launch["langs"]
            if new:
                launch["langs"] |= new
                launch["scopes"].append(original(fn))
            return _Patched()
        scope = original(fn)
        launch["langs"] = langs_of(fn)
        restore_launch = scope.restore

        def restore() -> None:
            for helper_scope in reversed(launch["scopes"]):
                helper_scope.restore()
            launch["langs"], launch["scopes"] = None, []
            restore_launch()

        scope.restore = restore
        return scope

    patch_lang.once_per_launch = True
    interpreter._patch_lang = patch_lang


def worker_main(worker) -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1" and sys.argv[1] == "--worker"
    patch_language_once_per_launch()
    Path(sys.argv[2]).write_text(json.dumps(worker()))
