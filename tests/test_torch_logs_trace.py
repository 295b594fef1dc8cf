"""torch's logging and tracing: ``TORCH_LOGS`` names the package and its artifacts, ``TORCH_TRACE`` holds the
report and the graphs as structured artifacts (tlparse lists them), ``DIFFUSION_FUSE_DUMP_DIR`` writes the graph
that runs as a ``.py`` file whose comments name each op's kernel sources (the HTML report names them). One
subprocess on tiny FLUX (the CPU)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("diffusers")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = """
import sys, torch, diffusion_fuse
from diffusion_fuse.testing.tiny_models import build
model, kw = build("flux")
with torch.no_grad():
    ref = model(**kw)[0]
    out = torch.compile(model, backend="diffusion_fuse", options={"report": sys.argv[1]})(**kw)[0]
assert torch.equal(ref, out)
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("logs")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "TORCH_LOGS": "+diffusion_fuse,diffusion_fuse_graphs", "TORCH_TRACE": str(tmp / "trace"),
           "DIFFUSION_FUSE_DUMP_DIR": str(tmp / "dump"), "DIFFUSION_FUSE_CACHE_DIR": str(tmp / "cache")}
    env.pop("DIFFUSION_FUSE_LOG", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp / "report.html")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp, proc.stderr


def test_torch_logs_show_verdicts_graphs_and_timings_with_compile_ids(run):
    _, err = run
    lines = err.splitlines()
    verdicts = [ln for ln in lines if "[__diffusion_fuse_verdicts] site " in ln]
    assert verdicts and all("] [0/0] [" in ln for ln in verdicts)  # judged on the first call, under its compile id
    assert any("bitwise equal" in ln for ln in verdicts)
    assert any("[__diffusion_fuse_timings] pass fuse_patterns:" in ln for ln in lines)
    assert any("[__diffusion_fuse_timings] graph 0: reference run" in ln for ln in lines)
    assert any("[__diffusion_fuse_graphs] graph 0: the ATen graph as traced" in ln for ln in lines)
    assert any("[__diffusion_fuse_graphs] graph 0: the graph that runs" in ln for ln in lines)
    assert any("] [0/0] graph 0: " in ln and "site(s) rewritten" in ln for ln in lines)


def _trace_records(tmp: Path) -> list[dict]:
    files = list((tmp / "trace").iterdir())
    assert files
    records = []
    for line in files[0].read_text().splitlines():
        start = line.find("{")  # each line: a glog prefix, then one JSON record
        if start >= 0:
            try:
                records.append(json.loads(line[start:]))
            except json.JSONDecodeError:
                continue  # a payload line
    return records


def test_torch_trace_holds_the_report_and_graphs_under_the_compile(run):
    tmp, _ = run
    ours = {r["artifact"]["name"]: r for r in _trace_records(tmp)
            if "artifact" in r and r["artifact"]["name"].startswith("diffusion_fuse_")}
    assert set(ours) >= {"diffusion_fuse_graph_before", "diffusion_fuse_graph_after", "diffusion_fuse_graph_final",
                         "diffusion_fuse_report"}
    for r in ours.values():
        assert (r.get("frame_id"), r.get("frame_compile_id")) == (0, 0)
    assert ours["diffusion_fuse_report"]["artifact"]["encoding"] == "json"


def test_tlparse_lists_the_artifacts(run, tmp_path):
    exe = shutil.which("tlparse") or (Path(sys.executable).parent / "tlparse")
    if not Path(exe).exists():
        pytest.skip("tlparse not installed (the test extra has it)")
    tmp, _ = run
    trace = next((tmp / "trace").iterdir())
    subprocess.run([str(exe), str(trace), "-o", str(tmp_path / "tl"), "--no-browser", "--overwrite"], check=True,
                   capture_output=True, timeout=120)
    names = {p.name for p in (tmp_path / "tl").rglob("*")}
    assert any("diffusion_fuse_report" in n for n in names), sorted(names)[:40]
    assert any("diffusion_fuse_graph_final" in n for n in names)


def test_the_graph_that_runs_is_a_py_file_with_its_kernel_sources(run):
    tmp, _ = run
    path = tmp / "dump" / "graph_0_0_0.py"
    text = path.read_text()
    compile(text, str(path), "exec")
    assert "def forward(" in text
    kernel = ROOT / "diffusion_fuse" / "kernels" / "norm_modulate.py"
    assert f"# kernel: {kernel}" in text  # next to each call of the op
    assert f"-> diffusion_fuse::norm_modulate: {kernel}" in text  # in the header, per site


def test_the_html_report_names_the_kernel_sources_and_the_graph_file(run):
    tmp, _ = run
    html = (tmp / "report.html").read_text()
    kernel = ROOT / "diffusion_fuse" / "kernels" / "norm_modulate.py"
    assert f'<span class="mono kernel-source">{kernel}</span>' in html
    assert f'<span class="mono graph-file">{tmp / "dump" / "graph_0_0_0.py"}</span>' in html
