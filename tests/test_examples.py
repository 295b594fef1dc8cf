"""The pipeline examples under examples/ run end to end on CPU and the compiled output is bit-identical to eager.

Every example runs as a subprocess (``python examples/X.py --steps 2 --device cpu``), once with the whole
transformer compiled and, where the transformer has diffusers' ``_repeated_blocks``, once with
``--repeated-blocks``. The selected runs are started together by a module fixture, two at a time (the suite must
stay within a few minutes on a 2-core CI machine; each run is mostly a single-threaded import + compile, about
half a minute). The default run takes FLUX.1's (the demo's) and SANA's whole-model runs; the full run
(``DIFFUSION_FUSE_FULL=1``) every run. The other transformers' graphs are compiled and checked bit for bit in
tests/test_models_lossless.py; what an example adds is its diffusers pipeline around them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from helpers import FULL, full_only

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES_DIR = ROOT / "examples"

# id: (script, extra arguments, transformer class in diffusers). Not run here: wan22_ti2v_pipeline.py --image, whose
# transformer graph is wan22_ti2v's with first-frame tokens at timestep 0, as the tiny model's own inputs have them
# (tests/test_models_lossless.py); what it adds is diffusers' image-to-video pipeline
EXAMPLES = {
    "flux": ("flux_pipeline.py", [], "FluxTransformer2DModel"),
    "flux2": ("flux2_pipeline.py", [], "Flux2Transformer2DModel"),
    "wan21": ("wan21_pipeline.py", [], "WanTransformer3DModel"),
    "wan22_ti2v": ("wan22_ti2v_pipeline.py", [], "WanTransformer3DModel"),
    "sana": ("sana_pipeline.py", [], "SanaTransformer2DModel"),
    "qwen_image": ("qwen_image_pipeline.py", [], "QwenImageTransformer2DModel"),
    "sd35": ("sd35_pipeline.py", [], "SD3Transformer2DModel"),
}
# transformers with _repeated_blocks in diffusers 0.42.1 (checked against diffusers below)
REPEATED_BLOCKS = ["flux", "flux2", "wan21", "wan22_ti2v", "qwen_image"]
NO_REPEATED_BLOCKS = ["sana", "sd35"]
# id or (id, "repeated-blocks") -> reason: runs that fail because of a backend bug (xfail, strict)
XFAIL: dict = {}

WHOLE_RUNS = [(name, False) for name in EXAMPLES]
# Blocks compiled alone through the backend elsewhere: Wan's (wan21's class, wan22_ti2v's too) in
# tests/test_table_slice_pattern.py (compile_repeated_blocks, both dtypes), FLUX.1's in tests/test_bench_models.py
# (regional compilation, bitwise); the whole-model runs here cover their pipelines
REPEATED_RUNS = [(name, True) for name in REPEATED_BLOCKS if name not in ("flux", "wan21", "wan22_ti2v")]
# slowest first, so the two workers finish together
_ORDER = ["qwen_image", "sd35", "wan22_ti2v", "wan21", "flux2", "flux", "sana"]


# the runs of the default run (see the module docstring)
DEFAULT_RUNS = [("flux", False), ("sana", False)]


def _selected(run) -> bool:
    return FULL or tuple(run) in DEFAULT_RUNS


def _params(runs):
    out = []
    for name, repeated in runs:
        reason = XFAIL.get((name, "repeated-blocks") if repeated else name)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        if not _selected((name, repeated)):
            marks.append(full_only("FLUX.1's and SANA's pipelines, and this transformer in test_models_lossless.py"))
        out.append(pytest.param((name, repeated), id=name, marks=marks))
    return out


def _command(name: str, repeated: bool) -> list[str]:
    script, extra, _ = EXAMPLES[name]
    return [sys.executable, str(Path("examples") / script), "--steps", "2", "--device", "cpu", *extra,
            *(["--repeated-blocks"] if repeated else [])]


def _run(name: str, repeated: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"  # two runs share the CPU; their tensors are tiny
    for var in ("DIFFUSION_FUSE_FAULT", "DIFFUSION_FUSE_DISABLE_KERNELS", "TRITON_INTERPRET"):
        env.pop(var, None)
    return subprocess.run(_command(name, repeated), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def example_runs(request):
    """Start every selected run of this module at once (2 workers); tests wait for their own."""
    keys = []
    for item in request.session.items:
        spec = getattr(item, "callspec", None)
        if item.path == Path(__file__).resolve() and spec is not None and "run" in spec.params \
                and _selected(spec.params["run"]):
            keys.append(spec.params["run"])
    keys.sort(key=lambda k: (_ORDER.index(k[0]), not k[1]))
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {key: pool.submit(_run, *key) for key in keys}


def _check(proc: subprocess.CompletedProcess, name: str, repeated: bool) -> None:
    cmd = " ".join(_command(name, repeated)[1:])
    assert proc.returncode == 0, (f"`python {cmd}` exited {proc.returncode}\n--- stdout (tail)\n"
                                  f"{proc.stdout[-4000:]}\n--- stderr (tail)\n{proc.stderr[-4000:]}")
    assert "bit-identical to eager: True" in proc.stdout, proc.stdout[-4000:]
    assert "graph(s) compiled" in proc.stdout and " 0 graph(s) compiled" not in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("run", _params(WHOLE_RUNS))
def test_example(run, example_runs):
    """torch.compile(pipe.transformer, backend="diffusion_fuse"): the pipeline's output is eager's, bit for bit."""
    _check(example_runs[run].result(), *run)


@pytest.mark.parametrize("run", _params(REPEATED_RUNS))
def test_example_repeated_blocks(run, example_runs):
    """pipe.transformer.compile_repeated_blocks(backend="diffusion_fuse"): the output is eager's, bit for bit."""
    proc = example_runs[run].result()
    _check(proc, *run)
    assert "compile_repeated_blocks (" in proc.stdout


# ---------------------------------------------------------------------------------------------------------------
# in-process checks of the shared plumbing (cheap)
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def common():
    sys.path.insert(0, str(EXAMPLES_DIR))
    try:
        import _common

        yield _common
    finally:
        sys.path.remove(str(EXAMPLES_DIR))


def test_repeated_blocks_table_matches_diffusers(common):
    """REPEATED_BLOCKS / NO_REPEATED_BLOCKS say what diffusers' _repeated_blocks says, and cover every example."""
    import diffusers

    assert set(REPEATED_BLOCKS) | set(NO_REPEATED_BLOCKS) == set(EXAMPLES)
    for name in REPEATED_BLOCKS + NO_REPEATED_BLOCKS:
        cls = getattr(diffusers, EXAMPLES[name][2])
        assert bool(common.repeated_blocks_of(cls)) == (name in REPEATED_BLOCKS), name


@pytest.mark.parametrize("name", NO_REPEATED_BLOCKS)
def test_repeated_blocks_refused_where_unsupported(name, common, capsys):
    """--repeated-blocks is documented as unsupported in --help and refused (exit 2) for those transformers."""
    import diffusers

    cls = getattr(diffusers, EXAMPLES[name][2])
    with pytest.raises(SystemExit) as e:
        common.parse_args("doc", cls, argv=["--help"])
    assert e.value.code == 0
    assert "NOT SUPPORTED" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as e:
        common.parse_args("doc", cls, argv=["--repeated-blocks"])
    assert e.value.code == 2
    assert "has no _repeated_blocks" in capsys.readouterr().err


def test_bitwise_diff(common):
    """The check compares bits: -0.0 vs 0.0 and differing NaN payloads count; equal NaNs do not."""
    a = torch.tensor([0.0, 1.0, float("nan")], dtype=torch.bfloat16)
    assert common.bitwise_diff(a, a.clone()) is None
    b = a.clone()
    b[0] = -0.0
    assert common.bitwise_diff(a, b).startswith("1 of 3 elements differ; first at (0,)")
    assert "vs compiled" in common.bitwise_diff(a, a.float())
    assert common.bitwise_diff(a.float(), a.float().clone()) is None


def test_mismatch_exits_nonzero(common, capsys):
    """main() prints the report and exits 1 when the compiled run's output differs from eager's."""

    class Pipe:
        transformer = torch.nn.Linear(4, 4)

    calls = []

    def generate(pipe, args):
        calls.append(1)
        with torch.no_grad():
            out = pipe.transformer(torch.ones(2, 4))
        return out + (len(calls) - 1)  # the compiled (second) run differs

    args = argparse.Namespace(steps=1, device="cpu", dtype="fp32", torch_dtype=torch.float32, repeated_blocks=False,
                              quality="lossless")
    with pytest.raises(SystemExit) as e:
        common.main(args, name="toy", build_pipeline=lambda dtype, device: Pipe(), generate=generate)
    assert e.value.code == 1
    captured = capsys.readouterr()
    assert "bit-identical to eager: False" in captured.out
    assert "8 of 8 elements differ" in captured.err
