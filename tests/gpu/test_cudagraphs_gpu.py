"""``mode="reduce-overhead"`` on CUDA: verified eagerly, then replayed by cudagraph trees, equal to eager.

Tiny FLUX and Wan models compiled with ``torch.compile(model, backend="diffusion_fuse",
mode="reduce-overhead")``: every call's output is bit-identical to eager's over several calls
(verification, tree warm-up, recording, replays), after the inputs are changed in place, at a
second resolution (a dynamic-shape graph: verified, then recorded) and back at the first. A
counter on ``torch.cuda.CUDAGraph.replay`` shows the graphs were replayed. Tier high with
CUDA graphs (Inductor's own trees after our verifier) stays within its tolerance. Writes
``$OUT/cudagraphs_gpu.json`` when ``OUT`` is set.
"""

import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import diffusion_fuse  # noqa: E402
from diffusion_fuse.lowering import counters  # noqa: E402
from diffusion_fuse.testing.tiny_models import build, wider  # noqa: E402

SUMMARY = []


def _bits(t):
    return t.view({torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[t.dtype])


@pytest.fixture
def replays(monkeypatch):
    """Counts ``CUDAGraph.replay`` calls (cudagraph trees replay through it)."""
    count = [0]
    replay = torch.cuda.CUDAGraph.replay

    def counting_replay(self):
        count[0] += 1
        return replay(self)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counting_replay)
    return count


@pytest.mark.parametrize("name", ["flux", "wan21", "wan22_ti2v"])
def test_reduce_overhead_lossless_equals_eager(name, replays):
    model, kwargs = build(name, torch.bfloat16, "cuda")
    n0 = len(diffusion_fuse.process_report().graphs)
    before = counters.snapshot()
    compiled = torch.compile(model, backend="diffusion_fuse", mode="reduce-overhead", fullgraph=True)
    row = {"model": name}

    def check(kw, n_calls, phase):
        with torch.no_grad():
            ref = model(**kw)[0]
            r0 = replays[0]
            for i in range(n_calls):
                out = compiled(**kw)[0]
                # compare before the next call: the next replay overwrites this output
                assert torch.equal(_bits(ref), _bits(out)), f"{phase}: call {i} differs from eager"
        row[f"{phase}_replays"] = replays[0] - r0

    check(kwargs, 4, "res1")  # verification, tree warm-up, recording, replay
    assert row["res1_replays"] >= 1
    for k in ("hidden_states", "encoder_hidden_states"):
        kwargs[k].mul_(-0.5).add_(0.25)  # new values in the same tensors: copied into the graph's inputs
    check(kwargs, 2, "mutated")
    assert row["mutated_replays"] == 2
    kw2 = wider(name, kwargs)
    check(kw2, 4, "res2")  # a dynamic-shape graph: verified eagerly, then warm-up, recording, replay
    assert row["res2_replays"] >= 1
    # Dynamo may send the first resolution to the dynamic graph now: a new signature there is verified,
    # warmed up and recorded first.
    check(kwargs, 4, "back_to_res1")
    assert row["back_to_res1_replays"] >= 1

    graphs = diffusion_fuse.process_report().graphs[n0:]
    ctr = counters.diff(counters.snapshot(), before)
    row.update(graphs=len(graphs), cudagraphs=[g.cudagraphs for g in graphs],
               verifications=sum(len(g.verifications) for g in graphs),
               sites=sum(len(g.sites) for g in graphs),
               kept=sum(s.status == "kept" for g in graphs for s in g.sites.values()),
               kernel_hits=sum(ctr["kernel"].values()))
    SUMMARY.append(row)
    assert all(c == "on" for c in row["cudagraphs"]), row
    assert row["kept"] == row["sites"] > 0 and row["kernel_hits"] > 0, row
    assert all(v["end_to_end_equal"] for g in graphs for v in g.verifications)


def test_outputs_are_overwritten_by_the_next_replay_unless_cloned():
    """cudagraph trees' contract, as with Inductor's reduce-overhead: an output lives in the graph's memory
    until the next call; it then holds that call's values (or raises when read, where torch marked it)."""
    model, kwargs = build("flux", torch.bfloat16, "cuda")
    compiled = torch.compile(model, backend="diffusion_fuse", mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        ref = model(**kwargs)[0]
        for _ in range(3):  # verification, warm-up, recording
            kept = compiled(**kwargs)[0].clone()
        last = compiled(**kwargs)[0]  # a replay
        kwargs["hidden_states"].mul_(-1.0)
        new = compiled(**kwargs)[0].clone()
        try:
            overwritten = torch.equal(_bits(last), _bits(new))
        except RuntimeError as e:
            overwritten = "overwritten by a subsequent run" in str(e)
    assert torch.equal(_bits(ref), _bits(kept))
    assert not torch.equal(_bits(kept), _bits(new))  # the inputs changed, so did the output
    assert overwritten


def test_tier_high_with_cudagraphs_runs_inductors_trees_after_the_verifier(replays):
    from diffusion_fuse.verify.compare import compare_close

    model, kwargs = build("flux", torch.float32, "cuda")
    report = diffusion_fuse.Report()
    options = {"quality": "high", "cudagraphs": True}  # torch.compile takes mode= or options=, not both
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(options, report), fullgraph=True)
    with torch.no_grad():
        ref = model(**kwargs)[0]
        for i in range(4):
            out = compiled(**kwargs)[0]
            v = compare_close(ref, out, 2e-2, 1e-3)
            assert v, f"call {i}: {v.detail}"
    g = report.graphs[0]
    SUMMARY.append({"model": "flux fp32 tier high", "cudagraphs": g.cudagraphs, "replays": replays[0],
                    "notes": g.notes, "verifications": g.verifications})
    assert g.cudagraphs.startswith("on"), g.cudagraphs
    assert not any("outside tolerance" in n for n in g.notes), g.notes
    assert replays[0] >= 1


def teardown_module(module):
    print("\nreduce-overhead on CUDA (per model: replays per phase, graphs, CUDA graphs, sites kept, kernel hits):")
    for row in SUMMARY:
        print("  " + json.dumps(row, default=str))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "cudagraphs_gpu.json"), "w") as f:
            json.dump(SUMMARY, f, indent=2, default=str)
