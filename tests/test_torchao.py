"""torchao's own FP8 static recipe (issue #5) on the CPU: its quantizer, as torchao traces it, is fused.

torchao lives outside the venv's site-packages (``./run.sh`` installs it into ``.venv/torchao``): diffusers
imports an installed torchao with every model, so this test runs the model in a subprocess that sees it.
Skips when that folder is missing. ``torch._scaled_mm`` runs on the CPU in torch >= 2.13. The GPU twin is
tests/gpu/test_torchao_gpu.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import full_only

ROOT = Path(__file__).resolve().parents[1]
TORCHAO = Path(os.environ.get("DIFFUSION_FUSE_TORCHAO_PATH", ROOT / ".venv" / "torchao"))


@pytest.mark.skipif(not (TORCHAO / "torchao").is_dir(), reason=f"torchao not installed in {TORCHAO} (./run.sh does)")
@pytest.mark.parametrize("name", ["flux", pytest.param("flux2", marks=full_only(
    "FLUX.1's: the same torchao Float8 linears and quantizer forms"))])
def test_torchao_static_fp8_model_equals_eager_with_quantizers_fused(name):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TORCHAO), str(ROOT)]), OMP_NUM_THREADS="1")
    code = ("import json; from diffusion_fuse.testing.fp8 import torchao_check; "
            f"print(json.dumps(torchao_check({name!r})))")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(run.stdout.strip().splitlines()[-1])
    assert res["linears"] > 0 and res["equal"], res
    assert res["kept"] == res["sites"] > 0, res
    # every quantizer torchao put in front of a linear: one clamp each, all taken by a family
    assert res["quantizers_fused"] == res["linears"], res
    # torchao's Float8 weights are unwrapped once at compile time, not by AOTAutograd on every call
    assert res["subclass_params_flattened"] == res["linears"], res
