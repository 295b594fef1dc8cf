"""``python -m diffusion_fuse inspect``, ``explain``'s report, the graph diff and the HTML report.

The CLI runs in subprocesses (started together, read by the tests below): tiny FLUX and Wan
(exact counts, HTML and JSON), and a script with one AdaLN site and one LayerNorm whose output
has an extra user (a near miss), run with a wrong kernel injected (``--fault``).
Counts are summed over the AdaLN pattern families the report lists, so another family taking
some of these sites (e.g. one that folds the residual add in) leaves them unchanged; families
``pointwise`` (the groups of pointwise ops the others left) and ``linear_cat`` (the joint attention's value cat)
are counted on their own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from helpers import AdaLN, adaln_inputs, dropout_clones
from html_report import parse, select

import diffusion_fuse
from diffusion_fuse.log import parse_settings
from diffusion_fuse.verify import graph_diff
from diffusion_fuse.verify.html import svg_graph

ROOT = Path(__file__).resolve().parents[1]
SUMMARY_COLUMNS = ["matched", "kept", "rejected", "unverified", "kernel hits", "guard fallbacks", "kernel errors"]
# On CPU every op call takes the reference path: once in the verifier's check, once in the fused run.
FLUX = {"matched": 6, "kept": 6, "rejected": 0, "unverified": 0, "kernel hits": 0, "guard fallbacks": 12,
        "kernel errors": 0}
WAN21 = {"matched": 4, "kept": 4, "rejected": 0, "unverified": 0, "kernel hits": 0, "guard fallbacks": 8,
         "kernel errors": 0}
# tests/test_models_lossless.py POINTWISE_SITES: tiny FLUX bf16, tiny Wan 2.1 fp32
FLUX_POINTWISE, WAN21_POINTWISE = 15, 4
# tests/test_models_lossless.py LINEAR_CAT_SITES: FLUX's joint-attention value cat; its op runs the GEMMs on the CPU too
FLUX_LINEAR_CAT = 1
# tests/test_grouped_gemv_pass.py: FLUX's modulation linears as one launch (the reference path on the CPU)
FLUX_GROUPED_GEMV = 1
OWN_ROWS = ("pointwise", "linear_cat", "grouped_gemv")  # families counted on their own
FAULT_INDEX = 37  # element 37 of a [2, 8, 32] output is [0, 1, 5]

SCRIPT = '''
import sys
import torch
import diffusion_fuse


class LeakyAdaLN(torch.nn.Module):
    """AdaLN whose first LayerNorm spans two dims: a near miss of every LayerNorm family."""

    def __init__(self, dim=32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.proj = torch.nn.Linear(dim, 4 * dim)

    def forward(self, x, emb):
        scale, shift, scale2, shift2 = self.proj(emb).chunk(4, dim=-1)
        h = torch.nn.functional.layer_norm(x, x.shape[-2:], eps=1e-6)
        y = h * (1 + scale[:, None]) + shift[:, None]
        z = self.norm(y) * (1 + scale2[:, None]) + shift2[:, None]
        return z, h


model = LeakyAdaLN().eval()
compiled = torch.compile(model, backend="diffusion_fuse")
x, emb = torch.randn(2, 8, 32), torch.randn(2, 32)
with torch.no_grad():
    equal = all(torch.equal(a, b) for a, b in zip(model(x, emb), compiled(x, emb)))
print("script args:", sys.argv[1:], "equal to eager:", equal)
'''


# --- the CLI runs ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inspect")
    script = tmp / "leaky_adaln.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("DIFFUSION_FUSE_FAULT", "DIFFUSION_FUSE_LOG",
                                                            "TRITON_INTERPRET")}
    env["OMP_NUM_THREADS"] = "1"  # tiny models; the runs go in parallel
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    runs = {
        "flux": (["--model", "flux", "--html", str(tmp / "flux.html"), "--json", str(tmp / "flux.json")], {}),
        "wan21": (["--model", "wan21", "--dtype", "fp32", "--html", str(tmp / "wan21.html")], {}),
        "script": (["--fault", f"norm_modulate:perturb:{FAULT_INDEX}", "--html", str(tmp / "script.html"),
                    "--script", str(script), "--steps", "2"], {}),
    }
    procs = {name: subprocess.Popen([sys.executable, "-m", "diffusion_fuse", "inspect", *argv], cwd=ROOT,
                                    env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, (argv, extra) in runs.items()}
    results = {}
    for name, p in procs.items():
        out, err = p.communicate(timeout=300)
        results[name] = {"rc": p.returncode, "out": out, "err": err, "dir": tmp}
    return results


def summary_from_text(out: str) -> tuple[dict[str, dict[str, int]], dict[str, int] | None]:
    """The summary table the CLI printed: {family: {column: n}} and the (total) row if any."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["family", "matched"])
    rows, total = {}, None
    for ln in lines[start + 2:]:
        if not ln.strip():
            break
        name, *nums = ln.split()
        vals = dict(zip(SUMMARY_COLUMNS, map(int, nums), strict=True))
        if name == "(total)":
            total = vals
        else:
            rows[name] = vals
    return rows, total


def totals(rows: dict[str, dict[str, int]]) -> dict[str, int]:
    """Column sums over the AdaLN families (OWN_ROWS left out)."""
    return {c: sum(r[c] for name, r in rows.items() if name not in OWN_ROWS) for c in SUMMARY_COLUMNS}


def pointwise_row(n_sites: int) -> dict[str, int]:
    """Family pointwise's row on CPU: every site kept, two reference-path calls each."""
    return {"matched": n_sites, "kept": n_sites, "rejected": 0, "unverified": 0, "kernel hits": 0,
            "guard fallbacks": 2 * n_sites, "kernel errors": 0}


def html_of(run: dict, name: str):
    return parse((run["dir"] / name).read_text(encoding="utf-8"))


def test_cli_flux_table_has_the_expected_counts(cli):
    run = cli["flux"]
    assert run["rc"] == 0, run["err"][-3000:]
    rows, total = summary_from_text(run["out"])
    assert "norm_modulate" in rows
    assert totals(rows) == FLUX, run["out"]
    assert rows["pointwise"] == pointwise_row(FLUX_POINTWISE), run["out"]
    assert rows["linear_cat"] == {"matched": 1, "kept": 1, "rejected": 0, "unverified": 0, "kernel hits": 2,
                                  "guard fallbacks": 0, "kernel errors": 0}, run["out"]
    assert rows["grouped_gemv"] == {"matched": 1, "kept": 1, "rejected": 0, "unverified": 0, "kernel hits": 0,
                                    "guard fallbacks": 2, "kernel errors": 0}, run["out"]
    assert total is None or total == {c: FLUX[c] + sum(rows[f][c] for f in OWN_ROWS) for c in SUMMARY_COLUMNS}
    assert "output: bit-identical to eager" in run["out"]
    # every site is listed with its source line and verdict
    site_lines = [ln for ln in run["out"].splitlines() if re.match(r"\S+@\S+\.py:\d+#\d+\s", ln)]
    assert len(site_lines) == 6 + FLUX_POINTWISE + FLUX_LINEAR_CAT + FLUX_GROUPED_GEMV
    assert all(" kept " in ln and "bitwise equal" in ln for ln in site_lines)


def test_cli_flux_html_and_json(cli):
    run = cli["flux"]
    els = html_of(run, "flux.html")
    sites = select(els, "tr", "site")
    n_sites = 6 + FLUX_POINTWISE + FLUX_LINEAR_CAT + FLUX_GROUPED_GEMV
    assert len(sites) == n_sites and {s.data("status") for s in sites} == {"kept"}
    assert all(re.search(r"\.py:\d+$", s.data("location")) for s in sites)
    fams = select(els, "tr", "family")
    assert {f.data("family") for f in fams} >= {"norm_modulate", "pointwise"}
    assert {c: sum(int(f.data(c.replace(" ", "-"))) for f in fams if f.data("family") not in OWN_ROWS)
            for c in SUMMARY_COLUMNS} == FLUX
    # per-site before/after: node lists, edges, two drawings, a code diff with the new op
    details = select(els, "section", "site-detail")
    assert [d.data("site-id") for d in details] == [s.data("site-id") for s in sites]
    assert len(select(els, "svg")) == 2 * n_sites
    diffs = select(els, "pre", "site-diff")
    assert len(diffs) == n_sites
    assert all(any(ln.startswith("+") and "diffusion_fuse." in ln for ln in d.text.splitlines()) for d in diffs)
    # plus one group no site accounts for where the trace has eval-mode Dropout's clones (torch <= 2.13):
    # drop_clones' dropped clones (fxpasses/drop_clones.py)
    data = json.loads((run["dir"] / "flux.json").read_text())
    dropped = int(bool(dropout_clones(data["graphs"][0]["ref_code"])))
    unattributed = select(els, "section", "unattributed")
    assert len(unattributed) == dropped and all("clone" in u.text for u in unattributed)
    assert len(select(els, "ul", "removed")) == n_sites + dropped
    assert len(select(els, "ul", "added")) == n_sites + dropped
    (code,) = select(els, "pre", "code-diff")
    assert "diffusion_fuse.norm_modulate.default" in code.text and "-    native_layer_norm" in code.text
    assert only_small_head_dim_near_misses(els)
    assert {c: sum(r[c] for r in data["summary"] if r["family"] not in OWN_ROWS) for c in SUMMARY_COLUMNS} == FLUX
    (g,) = data["graphs"]
    assert len(g["sites"]) == n_sites and g["ref_code"] and g["final_code"] and g["ref_graph"]["edges"]


def only_small_head_dim_near_misses(els) -> bool:
    """The tiny models' heads of 16 are near misses of mean_square (its kernel takes rows of 32 and more)."""
    return all(e.data("pattern") == "mean_square" for e in select(els, "tr", "near-miss"))


def test_cli_wan_counts(cli):
    # Wan's norm2 (a LayerNorm read by no modulate) was a near miss until the gated residual family
    # took it with the attention residual that feeds it; the script run below keeps a near miss.
    run = cli["wan21"]
    assert run["rc"] == 0, run["err"][-3000:]
    rows, _ = summary_from_text(run["out"])
    assert totals(rows) == WAN21, run["out"]
    els = html_of(run, "wan21.html")
    assert only_small_head_dim_near_misses(els)
    sites = select(els, "tr", "site")
    assert len(sites) == 4 + WAN21_POINTWISE
    (norm2,) = [e for e in sites if e.data("location").endswith("normalization.py:87")]
    assert norm2.data("pattern") == "gated_residual_norm_modulate"


def test_cli_script_near_miss_and_injected_fault(cli):
    """A script run under ``--fault``: its one site rejected and named, its leaky LN a near miss."""
    run = cli["script"]
    assert run["rc"] == 0, run["err"][-3000:]
    assert "script args: ['--steps', '2'] equal to eager: True" in run["out"]
    assert "rejected by the verifier" in run["err"]
    rows, _ = summary_from_text(run["out"])
    assert totals(rows)["matched"] == 1 and totals(rows)["rejected"] == 1
    assert "elements differ; first at [0, 1, 5]" in run["out"]
    reason = "normalized_shape [8, 32] spans more than the last dim"
    assert re.search(r"norm_modulate\s+native_layer_norm\s+\S*leaky_adaln\.py:17\s+" + re.escape(reason), run["out"])
    els = html_of(run, "script.html")
    near = [e for e in select(els, "tr", "near-miss") if e.data("pattern") == "norm_modulate"]
    assert len(near) == 1 and near[0].data("reason") == reason
    assert near[0].data("location").endswith("leaky_adaln.py:17")
    (site,) = [s for s in select(els, "tr", "site") if s.data("pattern") == "norm_modulate"]
    assert site.data("status") == "rejected" and site.data("location").endswith("leaky_adaln.py:19")
    assert json.loads(site.data("first-diff-index")) == [0, 1, 5]
    assert float(site.data("got")) != float(site.data("expected"))
    (detail,) = [d for d in select(els, "section", "site-detail") if d.data("status") == "rejected"]
    assert detail.data("site-id") == site.data("site-id") and "first at [0, 1, 5]" in detail.text


def test_cli_usage_errors(capsys):
    from diffusion_fuse.__main__ import main

    for argv in (["inspect", "--model", "flux", "--fault", "norm_modulate:oops"], ["inspect"],
                 ["inspect", "--model", "nosuchmodel"], ["inspect", "--model", "flux", "--json", "r.txt"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    assert "op:kind[:index]" in capsys.readouterr().err
    assert main([]) == 2


def test_console_script_is_declared():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^\[project\.scripts\]\s*\ndiffusion-fuse = "diffusion_fuse\.__main__:main"', text, re.M)


# --- in process: explain, the structural diff, the HTML --------------------------------------


def test_explain_report_has_the_graph_level_detail(tmp_path):
    report = diffusion_fuse.explain(AdaLN().eval(), *adaln_inputs())
    (site,) = report.sites()
    assert site.status == "kept" and site.verdict == "bitwise equal" and site.first_diff is None
    assert site.before[:2] == ["native_layer_norm", "getitem"] and site.after.endswith("norm_modulate")
    assert site.input_shapes[0] == "float32[2, 8, 32]" and site.output_shapes == ["float32[2, 8, 32]"]
    assert "tests/helpers.py:" in site.location  # where the modulate is written
    (g,) = report.graphs
    d = graph_diff.graph_diff(g)
    grp = d["sites"][site.id]
    created = [n for n in g.fused_graph["nodes"] if n.get("site") == site.id]
    assert grp["added"] == [n["name"] for n in created] == site.created
    assert set(site.nodes) <= set(grp["removed"]) and set(grp["removed"]) == set(d["removed"])
    assert d["unattributed"] is None
    roles = {n["name"]: n["role"] for n in grp["before"]["nodes"]}
    assert all(roles[n] == "core" for n in site.nodes)
    assert {roles[n] for n in site.input_nodes} == {"input"}
    assert "+norm_modulate" in grp["code_diff"].replace(" ", "").replace("_default", "")
    assert graph_diff.code_diff(g).startswith("--- graph 0: ATen graph")
    assert "=== graph 0" in graph_diff.format_text(report)
    json.dumps(report.to_dict())  # plain data only
    report.save(str(tmp_path / "r.html"))
    els = parse((tmp_path / "r.html").read_text(encoding="utf-8"))
    assert len(select(els, "tr", "site")) == 1 and select(els, "tr", "total")[0].data("matched") == "1"


def test_svg_is_well_formed_xml():
    sub = {"nodes": [{"name": "a", "role": "input", "op": "placeholder", "target": "placeholder", "value": "f32[2]",
                      "code": "a = input"},
                     {"name": "b<c", "role": "core", "op": "call_function", "target": "aten.mul.Tensor",
                      "value": "", "code": "b = mul(a, a) & 'x'"}],
           "edges": [["a", "b<c"]]}
    root = ET.fromstring(svg_graph(sub, "added", "t"))
    assert root.tag.endswith("svg") and len(root.findall("{http://www.w3.org/2000/svg}g")) == 2


def test_no_sites_still_renders(tmp_path):
    class Plain(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1

    report = diffusion_fuse.explain(Plain(), torch.randn(4), options={"patterns": {"pointwise": False}})
    els = parse(report.to_html())
    assert not select(els, "tr", "site") and not select(els, "tr", "near-miss")


@pytest.mark.parametrize("raw,expected", [
    ("info", {"diffusion_fuse": 20}),
    ("+", {"diffusion_fuse": 10}),
    ("+verify,-lowering", {"diffusion_fuse.verify": 10, "diffusion_fuse.lowering": 40}),
    ("verify", {"diffusion_fuse.verify": 20}),
    ("+diffusion_fuse", {"diffusion_fuse": 10}),
])
def test_log_env_follows_torch_logs_syntax(raw, expected):
    assert parse_settings(raw) == expected


def test_log_env_rejects_unknown_names():
    with pytest.raises(ValueError, match="neither a level"):
        parse_settings("+dynamo")


def test_readme_shows_the_inspect_output(cli):
    """README's family summary is what ``inspect --model flux`` prints now (its empty families left out)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Inspecting what the backend did", 1)[1]
    assert "python -m diffusion_fuse inspect --model flux" in section
    block = textwrap.dedent(section.split("```text\n", 1)[1].split("```", 1)[0])
    rows, total = summary_from_text(block)
    run_rows, run_total = summary_from_text(cli["flux"]["out"])
    assert rows == {name: r for name, r in run_rows.items() if r["matched"]}
    assert total == run_total and "output: bit-identical to eager" in block
