"""The side stream on CUDA (fxpasses/side_stream.py): a FLUX model whose text branch (32 tokens) runs beside its
image branch (256 tokens) gives eager's output bit for bit, in the default mode and under CUDA graphs, also
when one stream is held back (a GPU sleep queued on it at every switch) so that the other runs far ahead: a
missing wait or ``record_stream`` would then read unfinished or reused memory. Writes
``$OUT/side_stream_gpu.json`` when ``OUT`` is set."""

import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import diffusion_fuse  # noqa: E402
from diffusion_fuse.fxpasses import side_stream as ss  # noqa: E402
from diffusion_fuse.testing.tiny_models import build  # noqa: E402

SUMMARY = []


def _bits(t):
    return t.view(torch.int16)


def _inputs(kw, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(16, 16, 3)
    ids[..., 1] = torch.arange(16)[:, None]
    ids[..., 2] = torch.arange(16)[None, :]
    return dict(kw, hidden_states=torch.randn(1, 256, 16, generator=g).to("cuda", torch.bfloat16),
                encoder_hidden_states=torch.randn(1, 32, 32, generator=g).to("cuda", torch.bfloat16),
                img_ids=ids.reshape(256, 3).cuda(), txt_ids=torch.zeros(32, 3, device="cuda"))


def _side_nodes(report):
    return sum(v.get("side_stream_nodes", 0) for g in report.graphs for v in g.verifications)


@pytest.fixture
def hold_back(monkeypatch, request):
    """Queue a ~0.1 ms GPU sleep on the stream that becomes current at every switch (request.param)."""
    which = request.param
    if which == "side":
        def use_side(s):
            torch.cuda.set_stream(s.side)
            torch.cuda._sleep(200_000)
        monkeypatch.setattr(ss, "use_side", use_side)
    elif which == "main":
        def use_main(s):
            torch.cuda.set_stream(s.main)
            torch.cuda._sleep(200_000)
        monkeypatch.setattr(ss, "use_main", use_main)
    return which


@pytest.mark.parametrize("hold_back", [None, "side", "main"], indirect=True)
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_flux_with_a_side_stream_equals_eager(hold_back, mode):
    torch._dynamo.reset()
    model, kw = build("flux", torch.bfloat16, "cuda")
    report = diffusion_fuse.Report()
    opts = {"cudagraphs": mode == "reduce-overhead", "side_stream": True}
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(opts, report))
    results = []
    with torch.no_grad():
        inputs = _inputs(kw, 0)
        for call in range(5):
            if call:  # new values in place: CUDA graphs copy non-static inputs before each replay
                inputs["hidden_states"].copy_(torch.randn_like(inputs["hidden_states"]))
                inputs["encoder_hidden_states"].copy_(torch.randn_like(inputs["encoder_hidden_states"]))
            ref = model(**inputs)[0]
            if mode:
                torch.compiler.cudagraph_mark_step_begin()
            out = compiled(**inputs)[0].clone()
            torch.cuda.synchronize()
            results.append(bool(torch.equal(_bits(ref), _bits(out))))
    nodes = _side_nodes(report)
    SUMMARY.append({"mode": mode, "hold_back": hold_back, "equal": results, "side_stream_nodes": nodes})
    assert nodes > 0, report.table()
    assert all(results), results


def test_side_stream_is_off_by_default():
    torch._dynamo.reset()
    model, kw = build("flux", torch.bfloat16, "cuda")
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
    inputs = _inputs(kw, 1)
    with torch.no_grad():
        ref, out = model(**inputs)[0], compiled(**inputs)[0]
    assert torch.equal(_bits(ref), _bits(out))
    assert _side_nodes(report) == 0


def teardown_module(module):
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "side_stream_gpu.json"), "w") as f:
            json.dump(SUMMARY, f, indent=1)
