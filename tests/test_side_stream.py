"""fxpasses/side_stream.py: which nodes go to the side stream, where the rewrite orders them, and the waits and
``record_stream`` marks it adds. The rewrite applies to CUDA graphs only: here the graph of a FLUX double block
(text 32 rows, image 256) is traced on the CPU and rewritten as if it ran on ``cuda:0``; executing it uses
CPU stand-ins for the stream helpers (the GPU test runs the real ones, tests/gpu/test_side_stream_gpu.py)."""

import pytest
import torch
import torch.fx as fx

import diffusion_fuse
from diffusion_fuse.fxpasses import pass_manager as pm
from diffusion_fuse.fxpasses import side_stream as ss
from diffusion_fuse.fxpasses.recompose_linear import recompose_linear
from helpers import bitwise_equal

HELPERS = (ss.streams_begin, ss.use_side, ss.use_main, ss.side_waits_main, ss.main_waits_side, ss.record_on)


def _double_block(txt=32, img=256):
    from diffusers.models.transformers.transformer_flux import FluxTransformerBlock

    torch.manual_seed(0)
    blk = FluxTransformerBlock(64, 2, 32).to(torch.bfloat16)
    kw = dict(hidden_states=torch.randn(1, img, 64, dtype=torch.bfloat16),
              encoder_hidden_states=torch.randn(1, txt, 64, dtype=torch.bfloat16),
              temb=torch.randn(1, 64, dtype=torch.bfloat16),
              image_rotary_emb=(torch.randn(txt + img, 32), torch.randn(txt + img, 32)))
    return blk, kw


def _runtime_graph(monkeypatch, txt=32, img=256):
    """The ATen graph the lossless tier hands to its runtime rewrites, the inputs it then runs on, and the
    block's eager output."""
    seen = []
    orig = pm.PassManager.runtime

    def spy(gm, rewrite=True, side=True):
        run, counts = orig(gm, rewrite, side)

        def recording(*args):
            seen.append((gm, list(args)))
            return run(*args)

        return recording, counts

    monkeypatch.setattr(pm.PassManager, "runtime", staticmethod(spy))
    blk, kw = _double_block(txt, img)
    # linear_cat off: it would run the text value projection inside its op, with the image one (main stream)
    compiled = torch.compile(blk, backend="diffusion_fuse", options={"patterns": {"linear_cat": False}})
    with torch.no_grad():
        ref = blk(**kw)
        out = compiled(**kw)
    assert all(bitwise_equal(r, o) for r, o in zip(ref, out))
    gm, args = seen[-1]
    return recompose_linear(gm)[0], args, ref


@pytest.fixture
def traced(monkeypatch):
    torch._dynamo.reset()
    return _runtime_graph(monkeypatch)


@pytest.fixture
def graph(traced):
    return traced[0]


def _rows(n):
    return ss._rows(n)


def test_the_text_branch_and_only_it_goes_to_the_side_stream(graph):
    side = ss.plan(graph)
    gemms = [n for n in graph.graph.nodes if n.op == "call_function" and n.target in ss.GEMMS]
    side_gemms = [n for n in gemms if n in side]
    # the text stream's q, k, v, output projection and feed-forward (2): 32 rows each
    assert len(side_gemms) == 6 and all(_rows(n) == 32 for n in side_gemms), [(n.name, _rows(n)) for n in side_gemms]
    # the image stream's GEMMs and the timestep-embedding GEMVs (1 row) stay on the main stream
    assert all(_rows(n) in (1, 256) for n in gemms if n not in side)
    # no computing node of more rows, no op that writes an input
    assert all(_rows(n) <= 256 // ss.SMALL_FRACTION for n in side if n.target not in ss.VIEWS)


def test_no_side_stream_without_a_small_gemm_branch(monkeypatch):
    torch._dynamo.reset()
    gm = _runtime_graph(monkeypatch, txt=128, img=256)[0]  # 128 > 256 / 4: one stream
    assert ss.plan(gm) == set()
    monkeypatch.setattr(ss, "_cuda_device", lambda g: torch.device("cuda:0"))
    assert ss.side_stream(gm)[1] == 0


def test_a_graph_that_writes_in_place_stays_on_one_stream(graph):
    last = next(n for n in graph.graph.nodes if n.op == "output")
    x = next(n for n in graph.graph.nodes if n.op == "placeholder")
    with graph.graph.inserting_before(last):
        graph.graph.call_function(torch.ops.aten.add_.Tensor, (x, x))
    assert ss.plan(graph) == set()


def test_cpu_graphs_are_left_alone(graph):
    assert ss.side_stream(graph) == (graph, 0, -1)


def _rewrite(graph, monkeypatch):
    monkeypatch.setattr(ss, "_cuda_device", lambda g: torch.device("cuda:0"))
    out, moved, index = ss.side_stream(graph)
    assert moved > 0 and index == 0
    out.graph.lint()  # a valid topological order
    return out


def test_every_cross_stream_read_waits_and_is_recorded(graph, monkeypatch):
    out = _rewrite(graph, monkeypatch)
    side_names = {n.name for n in ss.plan(graph)}
    stream, last_wait = "main", {"main": -1, "side": -1}
    made: dict[str, tuple[str, int]] = {}
    nodes = list(out.graph.nodes)
    for i, n in enumerate(nodes):
        if n.op == "placeholder":
            made[n.name] = ("input", -1)
            continue
        if n.op == "call_function" and n.target in HELPERS:
            if n.target is ss.use_side:
                stream = "side"
            elif n.target is ss.use_main:
                stream = "main"
            elif n.target is ss.side_waits_main:
                last_wait["side"] = i
            elif n.target is ss.main_waits_side:
                last_wait["main"] = i
            continue
        if n.op == "output":
            assert stream == "main"
            last_side = max(j for j, m in enumerate(nodes) if m.name in side_names)
            assert last_wait["main"] > last_side, "the graph returns before the main stream waits for the side"
            continue
        expect = "side" if n.name in side_names else "main"
        if n.target not in ss.VIEWS:
            assert stream == expect, n.name
        for a in n.all_input_nodes:
            if a.op == "placeholder" or a.name not in made or a.target in HELPERS:
                continue
            src, at = made[a.name]
            if src != expect and n.target not in ss.VIEWS:
                assert at < last_wait[expect], f"{n.name} ({expect}) reads {a.name} ({src}) with no wait after it"
                assert _recorded_later(nodes, i, a, expect), f"{a.name} read on {expect} is not recorded"
        made[n.name] = (expect, made[n.args[0].name][1] if n.target in ss.VIEWS and isinstance(n.args[0], fx.Node)
                        and n.args[0].name in made and made[n.args[0].name][0] == expect else i)


def _recorded_later(nodes, i, a, stream):
    return any(m.op == "call_function" and m.target is ss.record_on and m.args[1] == stream and a in m.args[2:]
               for m in nodes[i:])


def test_the_text_branch_is_issued_before_the_image_projections(graph, monkeypatch):
    """Side work goes right after what it reads: the text q/k/v before the image q/k/v, the text feed-forward
    before the image output projection, so that the GPU has both streams' kernels queued at once."""
    out = _rewrite(graph, monkeypatch)
    side_names = {n.name for n in ss.plan(graph)}
    gemms = [n for n in out.graph.nodes if n.op == "call_function" and n.target in ss.GEMMS and _rows(n) > 1]
    first_img = next(i for i, n in enumerate(gemms) if n.name not in side_names)
    assert [n.name in side_names for n in gemms[:first_img]] == [True] * 3  # text q, k, v
    after_attention = [n.name in side_names for n in gemms[first_img + 3:]]
    assert after_attention[:3] == [True] * 3, after_attention  # text out proj, ff up, ff down


def test_the_rewritten_graph_computes_the_same(traced, monkeypatch):
    """The reordered graph, with CPU stand-ins for the stream helpers, gives the block's output bit for bit."""
    graph, args, ref = traced
    out = _rewrite(graph, monkeypatch)
    for n in out.graph.nodes:
        if n.op == "call_function" and n.target in HELPERS:
            n.target = _noop
    out.recompile()
    with torch.no_grad():
        got = out(*args)
    assert len(got) == len(ref) and all(bitwise_equal(r, g) for r, g in zip(ref, got))


def _noop(*args):
    return None


def test_option_is_checked():
    with pytest.raises(ValueError, match="side_stream"):
        diffusion_fuse.DiffusionFuseBackend({"side_stream": "yes"})
    assert diffusion_fuse.config.parse_options({"side_stream": False}).side_stream is False

