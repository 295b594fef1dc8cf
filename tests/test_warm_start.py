"""Warm start (``options={"warm_start": True}``): a second process compiling tiny FLUX takes the verdicts the first
stored, skips the verifier and still gives eager's bits; a call whose key differs (another input shape) is verified
and stored. The first process is this one (cold), the second a subprocess sharing ``DIFFUSION_FUSE_CACHE_DIR``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import diffusion_fuse
from diffusion_fuse.verify import warm_start

pytest.importorskip("diffusers")
from diffusion_fuse.testing.tiny_models import build  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SECOND = """
import json, torch, diffusion_fuse
from diffusion_fuse.testing.tiny_models import build, wider
model, kw = build("flux")
report = diffusion_fuse.Report()
compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend({"warm_start": True}, report))
out = {}
with torch.no_grad():
    out["same_key_equal"] = torch.equal(model(**kw)[0], compiled(**kw)[0])
    kw2 = wider("flux", kw)  # more tokens: another graph, another key
    out["new_key_equal"] = torch.equal(model(**kw2)[0], compiled(**kw2)[0])
out["entries"] = [e for g in report.graphs for e in g.verifications]
out["verdicts"] = [s.verdict for s in report.sites()]
print("RESULT " + json.dumps(out))
"""


def test_a_second_process_takes_the_stored_verdicts(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFUSION_FUSE_CACHE_DIR", str(tmp_path))
    model, kw = build("flux")
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend({"warm_start": True}, report))
    with torch.no_grad():
        assert torch.equal(model(**kw)[0], compiled(**kw)[0])
    (cold,) = [e for g in report.graphs for e in g.verifications]
    assert cold["warm_start"] == "stored" and cold["sites_checked"] > 0
    stored = list((tmp_path / "verdicts").glob("*.json"))
    assert len(stored) == 1
    entry = json.loads(stored[0].read_text())
    assert len(entry["verdicts"]) == cold["sites_checked"] and entry["end_to_end_equal"]

    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", SECOND], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert out["same_key_equal"] and out["new_key_equal"]
    hit, new = out["entries"]
    assert hit["warm_start"] == "hit" and hit["sites_checked"] == 0 and hit["rejected"] == []
    assert new["warm_start"] == "stored" and new["sites_checked"] > 0  # the key differs: verified again
    assert any(v.endswith("(stored verdict)") for v in out["verdicts"])
    assert len(list((tmp_path / "verdicts").glob("*.json"))) == 2


def test_the_key_changes_with_what_the_verdicts_depend_on():
    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))
    opts = diffusion_fuse.parse_options()
    x = torch.randn(2, 4)
    base = warm_start.key(warm_start.key_parts(gm, gm, [x], opts))
    assert base == warm_start.key(warm_start.key_parts(gm, gm, [torch.randn(2, 4)], opts))  # values are not in it
    assert base != warm_start.key(warm_start.key_parts(gm, gm, [x.double()], opts))
    assert base != warm_start.key(warm_start.key_parts(gm, gm, [x.t().contiguous().t()], opts))
    assert base != warm_start.key(warm_start.key_parts(gm, gm, [x], diffusion_fuse.parse_options({"rtol": 0.1})))
    other = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    assert base != warm_start.key(warm_start.key_parts(other, other, [x], opts))


def test_an_unreadable_entry_is_verified_again(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DIFFUSION_FUSE_CACHE_DIR", str(tmp_path))
    (tmp_path / "verdicts").mkdir()
    (tmp_path / "verdicts" / "k.json").write_text("{not json")
    assert warm_start.load("k") is None
    assert "unreadable" in caplog.text
    warm_start.store("k", {"verdicts": {"a": [True, "bitwise equal"]}})
    assert warm_start.load("k")["verdicts"] == {"a": [True, "bitwise equal"]}
