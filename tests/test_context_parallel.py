"""diffusion_fuse under diffusers' context parallelism: 2 CPU processes, gloo, Ulysses degree 2.

Each rank runs a tiny transformer through diffusers' own ``enable_parallelism`` (its ``_cp_plan`` hooks split the
sequence, its native attention backend runs the Ulysses all-to-alls as functional collectives) and compiles it with
the backend (testing/context_parallel.py). Checked on every rank: each call bitwise equal to eager with the same
parallel config; the collectives of the graph that runs are those of the traced graph; the verifier's decisions are
the same on both ranks, also when only one rank rejects a site or fails the end-to-end check.
Ring degree 2 runs too: diffusers' ring attention needs a backend that returns the log-sum-exp, CUDA-only in
diffusers, so ``_native_flash`` runs there over the CPU's own flash kernel (``cpu_flash_attention``).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from diffusion_fuse.testing import context_parallel

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not available")

SCENARIOS = ("plain", "site_rejected", "end_to_end_fails")
WAN_SCENARIOS = ("plain",)
RING_SCENARIOS = ("site_rejected",)


@pytest.fixture(scope="module")
def ranks() -> dict[str, list[dict]]:
    """Every run on one pair of processes (one start-up): per run, each rank's result."""
    pytest.importorskip("diffusers", reason="diffusers is needed for its context parallelism")
    from diffusers import ContextParallelConfig  # noqa: F401 - diffusers >= 0.36

    cp = context_parallel
    common = dict(dtype="float32", ulysses_degree=2, ring_degree=1, fault_op="norm_modulate", odd_rank=0, calls=2,
                  device="cpu")
    runs = [(cp.compiled_vs_eager, dict(name="flux", scenarios=SCENARIOS, **common)),
            # diffusers' Wan logs (logger.warning_once) that a 1-d timestep is not split: a graph break under Dynamo
            (cp.compiled_vs_eager, dict(name="wan21", scenarios=WAN_SCENARIOS, fullgraph=False, **common)),
            (cp.ring_on_cpu, dict(name="flux", scenarios=RING_SCENARIOS, **{**common, "dtype": "bfloat16",
                                                                               "ulysses_degree": 1, "ring_degree": 2}))]
    per_rank = cp.spawn(cp.in_sequence, 2, *runs, timeout=300)
    return {key: [r[i] for r in per_rank] for i, key in enumerate(("flux", "wan21", "flux_ring"))}


def check(ranks: list[dict], scenarios: tuple[str, ...], fault_family: str = "norm_modulate") -> None:
    for scenario in scenarios:
        per_rank = [r["scenarios"][scenario] for r in ranks]
        for r in per_rank:
            assert all(r["equal"]), (scenario, r["equal"], r["notes"])
            assert r["graphs"] >= 1 and all(r["agreed"]), (scenario, r["agreed"])
            assert r["collectives_final"] == r["collectives_ref"], scenario
            assert any(r["collectives_ref"]), "no collective in the graph: not context parallel"
        a, b = per_rank
        assert a["collectives_ref"] == b["collectives_ref"]
        assert a["final_ops"] == b["final_ops"], scenario
        assert a["sites"].keys() == b["sites"].keys() and a["sites"], scenario
        status = [{cid: s for cid, (s, _) in r["sites"].items()} for r in per_rank]
        assert status[0] == status[1], scenario
        faulty = {cid for cid in a["sites"] if cid.startswith(fault_family + "@")}
        fault_op = f"diffusion_fuse.{fault_family}."
        if scenario == "plain":
            assert set(status[0].values()) == {"kept"}
            assert any(op.startswith(fault_op) for ops in a["final_ops"] for op in ops)
        elif scenario == "site_rejected":
            assert faulty and {cid for cid, s in status[0].items() if s == "rejected"} == faulty
            for cid in faulty:
                assert "elements differ" in a["sites"][cid][1]  # rank 0's own verdict
                assert b["sites"][cid][1] == "rejected on rank(s) [0]"  # rank 1 put it back
            assert not any(op.startswith(fault_op) for ops in a["final_ops"] for op in ops)
        elif scenario == "end_to_end_fails":
            assert set(status[0].values()) == {"rejected"}
            assert a["final_ops"] == [[]] * len(a["final_ops"])


def test_flux_ulysses_compiled_equals_eager_cp_and_ranks_agree(ranks):
    check(ranks["flux"], SCENARIOS)
    # FLUX's joint attention sees [text shard, image shard] per rank after the all-to-all, so keys come in another
    # order than on one process: the gathered output is close to single-process eager, not bitwise equal.
    for r in ranks["flux"]:
        assert r["cp_vs_single_max_abs"] < 1e-5


def test_wan_ulysses_compiled_equals_eager_cp_and_ranks_agree(ranks):
    check(ranks["wan21"], WAN_SCENARIOS)
    for r in ranks["wan21"]:
        assert r["cp_vs_single_max_abs"] < 1e-5


def test_flux_ring_compiled_equals_eager_cp_and_ranks_agree(ranks):
    check(ranks["flux_ring"], RING_SCENARIOS)
    # ring attention merges per-step outputs by their log-sum-exp (in fp32): close to one process, not bitwise
    for r in ranks["flux_ring"]:
        assert r["cp_vs_single_max_abs"] < 0.05


def test_collectives_are_read_from_the_graph():
    from diffusion_fuse.verify.agree import Agreement, collectives, group_names

    g = torch.fx.Graph()
    x = g.placeholder("x")
    reduced = g.call_function(torch.ops._c10d_functional.all_reduce.default, (x, "sum", "7"))
    waited = g.call_function(torch.ops._c10d_functional.wait_tensor.default, (reduced,))
    g.output(g.call_function(torch.ops.aten.relu.default, (waited,)))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    assert collectives(gm) == [("_c10d_functional.all_reduce.default", "7"),
                               ("_c10d_functional.wait_tensor.default", None)]
    assert group_names(gm) == ("7",)
    if not dist.is_initialized():
        assert Agreement.of(gm) is None  # one process decides alone


def test_a_rewrite_that_changes_the_collectives_puts_every_site_back(monkeypatch):
    from helpers import AdaLN, adaln_inputs, bitwise_equal, compile_and_run

    from diffusion_fuse.fxpasses import PassManager

    rewrite = PassManager.rewrite

    def with_an_extra_collective(self, ref, exclude=frozenset()):
        gm, ctx = rewrite(self, ref, exclude)
        g = gm.graph
        x = next(n for n in g.nodes if n.op == "placeholder")
        with g.inserting_before(next(n for n in g.nodes if n.op == "output")):
            reduced = g.call_function(torch.ops._c10d_functional.all_reduce.default, (x, "sum", "0"))
            g.call_function(torch.ops._c10d_functional.wait_tensor.default, (reduced,))
        gm.recompile()
        return gm, ctx

    monkeypatch.setattr(PassManager, "rewrite", with_an_extra_collective)
    x, emb = adaln_inputs()
    ref, out, report = compile_and_run(AdaLN(), dict(x=x, emb=emb))
    assert bitwise_equal(ref, out)
    sites = report.sites()
    assert sites and all(s.status == "rejected" for s in sites), report.table()
    assert {s.reason for s in sites} == {"the rewrite changed the graph's collectives"}


def test_each_rank_writes_its_own_report_file():
    from diffusion_fuse.verify.report import rank_path

    assert rank_path("out/report.json", 0, 1) == "out/report.json"
    assert rank_path("out/report.json", 1, 2) == "out/report.rank1.json"
    assert rank_path("out.d/report", 0, 2) == "out.d/report.rank0"
