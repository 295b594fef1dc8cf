"""Run a test module's ``worker()`` in a child process under Triton's interpreter.

TRITON_INTERPRET must be set before triton is first imported, so each interpreter test file
starts with ``if __name__ == "__main__": os.environ["TRITON_INTERPRET"] = "1"`` and ends with
``if __name__ == "__main__": worker_main(worker)``; its fixture calls ``run_worker(__file__)``.
"""

from __future__ import annotations

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


def worker_main(worker) -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1" and sys.argv[1] == "--worker"
    Path(sys.argv[2]).write_text(json.dumps(worker()))
