"""fxpasses/cat_of_slices.py: a cat that rebuilds the tensor its inputs were sliced from is that tensor."""

from __future__ import annotations

import pytest
import torch
from helpers import bitwise_equal, compile_and_run

from diffusion_fuse.config import Options
from diffusion_fuse.fxpasses.base import PassContext
from diffusion_fuse.fxpasses.cat_of_slices import CatOfSlicesPass, covered_base
from diffusion_fuse.testing.pointwise import trace

aten = torch.ops.aten


def _cats(gm) -> int:
    return sum(n.target is aten.cat.default for n in gm.graph.nodes)


def _run_pass(fn, *args):
    gm = trace(fn, *args)
    ctx = PassContext(options=Options())
    before = _cats(gm)
    CatOfSlicesPass()(gm.graph, ctx)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm, before, ctx


def split_then_cat(x, gate):  # a FLUX single block's end, then the next block's start
    h = x * gate
    txt, img = h[:, :3], h[:, 3:]
    return torch.cat([txt, img], dim=1) + 1


def three_way(x):
    h = x.exp()
    return torch.cat([h[..., :2], h[..., 2:5], h[..., 5:]], dim=-1) * 2


CASES = {
    "gap": lambda x: (lambda h: torch.cat([h[:, :2], h[:, 3:]], 1) + 1)(x * 2),
    "overlap": lambda x: (lambda h: torch.cat([h[:, :4], h[:, 3:]], 1) + 1)(x * 2),
    "out of order": lambda x: (lambda h: torch.cat([h[:, 3:], h[:, :3]], 1) + 1)(x * 2),
    "short of the end": lambda x: (lambda h: torch.cat([h[:, :3], h[:, 3:6]], 1) + 1)(x * 2),
    "other dim": lambda x: (lambda h: torch.cat([h[:, :, :4], h[:, :, 4:]], 1) + 1)(x * 2),
    "two bases": lambda x: torch.cat([(x * 2)[:, :3], (x * 3)[:, 3:]], 1) + 1,
    "step 2": lambda x: (lambda h: torch.cat([h[:, 0::2], h[:, 1::2]], 1) + 1)(x * 2),
    "graph input": lambda x: torch.cat([x[:, :3], x[:, 3:]], 1) + 1,
    "cat is the output": lambda x: (lambda h: torch.cat([h[:, :3], h[:, 3:]], 1))(x * 2),
    "a view of the cat is the output": lambda x: (lambda h: torch.cat([h[:, :3], h[:, 3:]], 1).view(2, 64))(x * 2),
    "base is a view of the input": lambda x: (lambda h: torch.cat([h[:, :3], h[:, 3:]], 1) + 1)(x.view(2, 8, 8)),
    "non-contiguous base": lambda x: (lambda h: torch.cat([h[:, :3], h[:, 3:]], 1) + 1)((x * 2).transpose(1, 2)),
}


def test_a_cat_of_the_halves_is_the_tensor():
    x, gate = torch.randn(2, 8, 5), torch.randn(2, 1, 5)
    gm, before, ctx = _run_pass(split_then_cat, x, gate)
    assert before == 1 and _cats(gm) == 0
    assert len(ctx.notes) == 1 and "cat_of_slices" in ctx.notes[0]
    assert bitwise_equal(gm(x, gate), split_then_cat(x, gate))


def test_three_slices_along_the_last_dim():
    x = torch.randn(3, 4, 9)
    gm, before, _ = _run_pass(three_way, x)
    assert before == 1 and _cats(gm) == 0
    assert bitwise_equal(gm(x), three_way(x))


@pytest.mark.parametrize("name", list(CASES))
def test_anything_else_keeps_its_cat(name):
    fn = CASES[name]
    x = torch.randn(2, 8, 8)
    gm, before, ctx = _run_pass(fn, x)
    assert before == 1 and _cats(gm) == 1 and not ctx.notes, name
    assert bitwise_equal(gm(x), fn(x))


def test_covered_base_ignores_other_nodes():
    gm = trace(split_then_cat, torch.randn(2, 8, 5), torch.randn(2, 1, 5))
    assert [covered_base(n) for n in gm.graph.nodes if n.target is not aten.cat.default] == \
        [None] * (len(gm.graph.nodes) - 1)


def test_two_flux_single_blocks_in_one_graph_lose_the_cat_and_fuse_across_the_boundary(monkeypatch):
    # The next single block's cat rebuilds the previous one's output: the pass drops it, and the previous
    # block's gated residual and the next block's LayerNorm + modulate become one gated_residual_ln site.
    from diffusion_fuse.testing.tiny_models import build

    model, make_kwargs = build("flux")
    blocks = torch.nn.ModuleList([type(model.single_transformer_blocks[0])(dim=32, num_attention_heads=2,
                                                                           attention_head_dim=16)
                                  for _ in range(2)])

    class TwoSingleBlocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = blocks

        def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb):
            for b in self.blocks:
                encoder_hidden_states, hidden_states = b(hidden_states, encoder_hidden_states, temb,
                                                         image_rotary_emb)
            return encoder_hidden_states, hidden_states

    g = torch.Generator().manual_seed(0)
    pos = torch.randn(12, 8, generator=g)
    kwargs = dict(hidden_states=torch.randn(1, 8, 32, generator=g), encoder_hidden_states=torch.randn(1, 4, 32,
                                                                                                       generator=g),
                  temb=torch.randn(1, 32, generator=g),
                  image_rotary_emb=(pos.cos().repeat_interleave(2, 1), pos.sin().repeat_interleave(2, 1)))
    del model, make_kwargs

    def kept_patterns():
        torch._dynamo.reset()
        ref, out, report = compile_and_run(TwoSingleBlocks().eval(), kwargs)
        assert bitwise_equal(ref, out)
        (graph,) = report.graphs
        return graph, [rec.pattern for rec in graph.sites.values() if rec.status == "kept"]

    graph, patterns = kept_patterns()
    assert any("cat_of_slices" in n for n in graph.notes), graph.notes
    assert patterns.count("gated_residual_norm_modulate") == 1, patterns
    monkeypatch.setattr(CatOfSlicesPass, "__call__", lambda self, graph, ctx: None)  # without the pass: no such site
    graph, patterns = kept_patterns()
    assert not any("cat_of_slices" in n for n in graph.notes)
    assert "gated_residual_norm_modulate" not in patterns, patterns
