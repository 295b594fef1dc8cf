"""Without Triton the package imports, compiles and runs every op's reference (kernels/optional_triton.py).

A subprocess hides Triton behind a ``sys.meta_path`` finder that refuses ``triton`` and ``triton.*``, as on a machine
where Triton has no wheel, then imports diffusion_fuse, compiles tiny FLUX with ``backend="diffusion_fuse"`` and runs
the dispatch gate (a guard that accepts, on a machine without Triton) and a kernel module's stand-in kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HIDE_TRITON = '''
import importlib.abc
import sys


class HideTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, HideTriton())
'''

CHILD = HIDE_TRITON + '''
import json
import os

os.environ["TRITON_INTERPRET"] = "1"  # asked for, but there is no Triton to interpret with

import torch

import diffusion_fuse
from diffusion_fuse import kernels
from diffusion_fuse.kernels import optional_triton, rms_norm
from diffusion_fuse.lowering import counters
from diffusion_fuse.lowering.dispatch import GuardedKernel
from diffusion_fuse.testing.tiny_models import build
from diffusion_fuse.verify.compare import compare_bitwise

out = {"triton_imported": "triton" in sys.modules, "have_triton": optional_triton.HAVE_TRITON,
       "interpret": kernels.triton_interpret(), "reason": optional_triton.MISSING_REASON}

# a kernel module's kernel is a stand-in that says what is missing when launched
try:
    rms_norm.neg_f32[(1,)]
    out["launch_error"] = ""
except ModuleNotFoundError as e:
    out["launch_error"] = str(e)

# the gate: a guard that accepts on a machine without Triton gives the reference, counted with the reason
def gate(needs_triton):
    k = GuardedKernel("probe", lambda args: tuple(a.shape for a in args), lambda a: (True, ""),
                      lambda a: (lambda a: a[0] * 2), torch.neg, tuple, needs_triton=needs_triton)
    return k(torch.ones(3)).tolist()

before = counters.snapshot()
out["gate"] = {"triton": gate(True), "no_triton": gate(False)}
out["gate_counts"] = counters.diff(counters.snapshot(), before)

model, kwargs = build("flux", torch.bfloat16)
report = diffusion_fuse.Report()
compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
with torch.no_grad():
    ref, got = model(**kwargs), compiled(**kwargs)
out["bitwise"] = bool(compare_bitwise(list(ref), list(got)))
out["kept"] = report.count(status="kept")
out["rejected"] = report.count(status="rejected")
out["counters"] = report.counters()
out["triton_imported_after"] = "triton" in sys.modules
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def without_triton() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_package_imports_without_triton(without_triton):
    r = without_triton
    assert not r["have_triton"] and not r["triton_imported"] and not r["triton_imported_after"]
    assert "pip install triton" in r["reason"]
    assert not r["interpret"], "TRITON_INTERPRET=1 with no Triton must not make the guards take CPU tensors"


def test_a_kernel_without_triton_says_what_is_missing(without_triton):
    assert "neg_f32" in without_triton["launch_error"] and "Triton is not installed" in without_triton["launch_error"]


def test_an_accepted_layout_takes_the_reference_without_triton(without_triton):
    r = without_triton
    assert r["gate"] == {"triton": [-1.0, -1.0, -1.0], "no_triton": [2.0, 2.0, 2.0]}
    assert r["gate_counts"]["fallback"] == {"probe": {r["reason"]: 1}}
    assert r["gate_counts"]["kernel"] == {"probe": 1}  # the op whose kernel is not Triton's ran it


def test_tiny_flux_compiles_and_matches_eager_without_triton(without_triton):
    r = without_triton
    assert r["bitwise"] and r["kept"] > 0 and r["rejected"] == 0
    # on the CPU the Triton ops fall back for the device; linear_cat (cuBLAS / CPU BLAS, no Triton) runs its kernel
    assert set(r["counters"]["kernel"]) == {"linear_cat"}
    reasons = {reason for per_op in r["counters"]["fallback"].values() for reason in per_op}
    assert reasons == {"device is cpu"}, reasons


def test_every_kernel_module_imports_triton_through_the_stand_in():
    # a plain `import triton` in a kernel module would break `import diffusion_fuse` where Triton has no wheel
    bad = []
    for path in sorted((ROOT / "diffusion_fuse").rglob("*.py")):
        if path.name == "optional_triton.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            s = line.strip()
            if s.startswith(("import triton", "from triton")) and line == s:  # module level (not in a function)
                bad.append(f"{path.relative_to(ROOT)}:{n}: {s}")
    assert not bad, bad
