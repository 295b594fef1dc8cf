"""benchmarks/bench_models.py: the tiny CPU mode runs the whole code path (regional compilation per variant,
ABBA timing, bit-exactness, JSON), and --table rewrites only the marked part of BENCHMARKS.md."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_models.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_models", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _run(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OUT="")
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_abba_order_and_estimates():
    bm = _load()
    assert bm.abba(["eager", "lossless", "high"], 3) == [
        (0, "eager"), (0, "lossless"), (0, "high"), (1, "high"), (1, "lossless"), (1, "eager"),
        (2, "eager"), (2, "lossless"), (2, "high")]
    assert list(bm.MODELS)[:3] == ["flux1", "sana", "wan22_5b"]  # the first to run on a short GPU budget
    for spec in bm.MODELS.values():
        total, compile_s, forwards = bm.estimate_s(spec, bm.DEFAULT_VARIANTS, 6)
        assert total > compile_s > 0 and forwards > 0


def test_tiny_run_then_table(tmp_path):
    out = tmp_path / "bench_models.json"
    r = _run("--tiny", "--models", "flux1,sana", "--reps", "2", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "regional compilation (diffusers compile_repeated_blocks, dynamic=False)" in r.stdout
    assert "SanaTransformer2DModel declares no _repeated_blocks" in r.stdout
    data = json.loads(out.read_text())
    assert data["meta"]["tiny"] and [m["model"] for m in data["models"]] == ["flux1", "sana"]
    for rec in data["models"]:
        assert list(rec["variants"]) == ["eager", "lossless"]
        eager, lossless = rec["variants"]["eager"], rec["variants"]["lossless"]
        assert len(eager["times_ms"]) == len(lossless["times_ms"]) == 2
        assert eager["bit_exact"] and lossless["bit_exact"]
        assert lossless["kept"] == lossless["sites"] > 0 and lossless["graphs"] >= 1
        # when each timed forward ran, for run_gpu.sh's GPU clock log (benchmarks/clocks_summary.py --phases)
        assert sorted(p[0] for p in rec["phases"]) == ["eager one forward"] * 2 + ["lossless one forward"] * 2
        assert all(t0 <= t1 for _, t0, t1 in rec["phases"])

    md = tmp_path / "BENCHMARKS.md"
    original = (ROOT / "BENCHMARKS.md").read_text()
    md.write_text(original)
    r = _run("--table", "--json", str(out), "--md", str(md))
    assert r.returncode == 0, r.stderr[-3000:]
    text = md.read_text()
    head, rest = original.split("<!-- bench_models:begin")
    tail = rest.split("<!-- bench_models:end -->")[1]
    assert text.startswith(head) and text.endswith(tail)
    assert "| FLUX.1-dev | lossless |" in text and "Tiny CPU models" in text
    bm = _load()  # the rest in this process: what --table calls
    bm.write_table(str(out), str(md))
    assert md.read_text() == text  # idempotent
    # the same models in two runs: each row names its run by its place in the list
    (tmp_path / "second.json").write_text(json.dumps(data))
    bm.write_table(f"{out},{tmp_path / 'second.json'}", str(md))
    text = md.read_text()
    assert "| FLUX.1-dev [run 1] | lossless |" in text and "| FLUX.1-dev [run 2] | lossless |" in text
    assert "| FLUX.1-dev | lossless |" not in text
    # several runs gathered in one file ({"about": ..., "runs": [...]}, as benchmarks/results/models.json) read alike
    (tmp_path / "gathered.json").write_text(json.dumps({"about": "two runs", "runs": [data, data]}))
    bm.write_table(str(tmp_path / "gathered.json"), str(md))
    assert md.read_text() == text


def test_tiny_models_beyond_the_seven(tmp_path):
    # a zoo model (PixArt) and a plain-PyTorch DiT (RMSDiT, positional arguments, no compile_repeated_blocks):
    # their blocks compile one by one, and the lossless output is eager's
    out = tmp_path / "bench_models.json"
    r = _run("--tiny", "--models", "pixart_sigma,rms_dit", "--reps", "1", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "diffusion_fuse.testing.user_dits.RMSDiT declares no _repeated_blocks; set to ['RMSBlock']" in r.stdout
    data = json.loads(out.read_text())
    for rec in data["models"]:
        lossless = rec["variants"]["lossless"]
        assert lossless["bit_exact"] and lossless["kept"] == lossless["sites"] > 0
        assert lossless["graphs"] >= 1
    bm = _load()
    assert bm.DEFAULT_MODELS == list(bm.MODELS)[:7] and "rms_dit" not in bm.DEFAULT_MODELS


def test_every_real_config_builds_and_its_inputs_fit_the_forward():
    # on the meta device: no weights, the real configs and input shapes; a typo in either fails here, not on the GPU
    import inspect

    import torch

    bm = _load()
    for name, spec in bm.MODELS.items():
        cls = bm.model_class(spec.cls)
        with torch.device("meta"):
            model = cls(**spec.config)
        kwargs = spec.inputs(torch.Generator().manual_seed(0))
        inspect.signature(model.forward).bind(**kwargs)  # raises on a name the forward does not take
        for block in spec.repeated_blocks:
            assert any(type(m).__name__ == block for m in model.modules()), (name, block)


def test_bad_arguments_are_refused():
    r = _run("--models", "flux3", "--estimate")
    assert r.returncode != 0 and "unknown models ['flux3']" in r.stderr


def test_tiny_whole_model_run(tmp_path):
    # --whole: one graph per compiled variant (the one-line torch.compile(pipe.transformer)), exact, labelled
    out = tmp_path / "bench_models.json"
    r = _run("--tiny", "--whole", "--models", "flux1", "--reps", "2", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "the whole transformer (torch.compile(model, dynamic=False))" in r.stdout
    data = json.loads(out.read_text())
    (rec,) = data["models"]
    assert data["meta"]["whole"] and rec["compile"] == "whole" and rec["label"] == "FLUX.1-dev (whole)"
    lossless = rec["variants"]["lossless"]
    assert lossless["bit_exact"] and lossless["graphs"] == 1 and lossless["kept"] == lossless["sites"] > 0
