"""The census (diffusion_fuse/census.py, ``python -m diffusion_fuse census``) on two zoo models: its counts are the
report's, and the ops it lists are those of the graph that runs."""

import json
from collections import Counter

import pytest

import diffusion_fuse.__main__ as cli
from diffusion_fuse import census
from diffusion_fuse.verify import verifier
from diffusion_fuse.verify.graph_diff import target_name

MODELS = ("dit", "pixart")


@pytest.fixture(scope="module")
def runs():
    """(census, report, runtime graph modules) per model, bf16."""
    out = {}
    for name in MODELS:
        graphs = []
        init = verifier.VerifiedGraph.__init__

        def keep(self, *a, _init=init, _graphs=graphs, **k):
            _init(self, *a, **k)
            _graphs.append(self)

        verifier.VerifiedGraph.__init__ = keep
        try:
            import torch

            torch._dynamo.reset()
            row, report = census.run_model(name, "bf16")
        finally:
            verifier.VerifiedGraph.__init__ = init
        out[name] = row, report, [vg.build(frozenset(vg.rejected)) for vg in graphs]
    return out


@pytest.mark.parametrize("name", MODELS)
def test_counts_are_the_reports(name, runs):
    row, report, _ = runs[name]
    assert row.bitwise
    assert row.kept == dict(Counter(s.pattern for s in report.sites("kept")))
    assert row.kept, "the census found no site"
    assert row.rejected == report.count(status="rejected") == 0
    calls = Counter()
    for g in report.graphs:
        calls.update(g.final_ops)
    assert sum(row.classes.values()) == sum(calls.values())
    assert row.classes.get("ours", 0) == sum(n for op, n in calls.items() if op.startswith("diffusion_fuse."))
    assert row.classes["ours"] >= sum(row.kept.values())  # a site becomes at least one call of our ops
    for op, n in {**row.eager_ops, **row.views}.items():
        assert calls[op] == n
    # the families took every LayerNorm of these blocks: none is left to eager
    assert "aten.native_layer_norm.default" not in row.eager_ops


@pytest.mark.parametrize("name", MODELS)
def test_final_ops_are_the_runtime_graphs(name, runs):
    _, report, gms = runs[name]
    assert len(gms) == len(report.graphs)
    for g, gm in zip(report.graphs, gms):
        assert g.final_code == gm.code
        assert g.final_ops == dict(Counter(target_name(n) for n in gm.graph.nodes if n.op == "call_function"))


def test_classify():
    assert census.classify("aten.mm.default") == "gemm"
    assert census.classify("aten.addmm.default") == "gemm"
    assert census.classify("aten._scaled_dot_product_flash_attention_for_cpu.default") == "attention"
    assert census.classify("aten.convolution.default") == "convolution"
    assert census.classify("aten.view.default") == "view"
    assert census.classify("aten._unsafe_view.default") == "view"
    assert census.classify("aten.mul.Tensor") == "eager"
    assert census.classify("aten.native_layer_norm.default") == "eager"
    assert census.classify("aten.sym_size.int") == "other"
    assert census.classify("getitem") == "other"
    assert census.classify("diffusion_fuse.any_op.default") == "ours"


def test_table_rows_are_the_counts(runs):
    rows = [runs[n][0] for n in MODELS]
    text = census.format_table(rows)
    header, _, *body = text.split("\n\n")[0].splitlines()
    cols = header.split()
    for row, line in zip(rows, body):
        cells = dict(zip(cols, line.split()))
        assert cells["model"] == row.name and cells["bitwise"] == "yes"
        for fam in cols[2:-4]:
            assert int(cells[fam]) == row.kept.get(fam, 0)
        assert int(cells["rejected"]) == row.rejected
    for row in rows:
        block = next(b for b in text.split("\n\n") if b.startswith(f"{row.name} ("))
        listed = {ln.split()[0]: int(ln.split()[1]) for ln in block.splitlines()[3:]}
        assert listed == row.eager_ops


def test_command_writes_json(tmp_path, capsys, runs):
    path = tmp_path / "census.json"
    assert cli.main(["census", "--models", "dit", "--json", str(path)]) == 0
    assert "diffusion_fuse census: 1 zoo model(s), bf16" in capsys.readouterr().out
    (model,) = json.loads(path.read_text())["models"]
    row = runs["dit"][0]
    assert model["name"] == "dit" and model["kept"] == row.kept and model["eager_ops"] == row.eager_ops


def test_a_model_that_does_not_run_is_a_row_that_says_so():
    rows = [census.ModelCensus("m", "bf16", False, 0, {}, 0, {}, {}, {}, "eager raised RuntimeError: no")]
    text = census.format_table(rows)
    assert text.splitlines()[2].split()[:2] == ["m", "-"]
    assert "not run:\nm: eager raised RuntimeError: no" in text
