"""fxpasses/fuse_patterns.py: the order repair after sites are applied."""

import operator
import random

import torch
import torch.fx as fx

from diffusion_fuse.fxpasses.fuse_patterns import in_order, stable_topological_sort


def _graph() -> tuple[fx.Graph, fx.Node, fx.Node]:
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(operator.add, (x, 1))
    b = g.call_function(operator.mul, (a, 2))
    g.output(b)
    return g, a, b


def test_an_ordered_graph_is_left_as_it_is():
    g, _, _ = _graph()
    before = [n.name for n in g.nodes]
    assert in_order(g)
    stable_topological_sort(g)
    assert [n.name for n in g.nodes] == before


def test_a_node_before_its_input_moves_after_it():
    # a site's replacement goes before the site's last node, so a reader of an earlier output can end up before it
    g, _, b = _graph()
    x = next(iter(g.nodes))
    with g.inserting_after(x):
        c = g.call_function(operator.neg, (b,))  # reads b, placed before it
    b.replace_all_uses_with(c, delete_user_cb=lambda n: n.op == "output")
    assert not in_order(g)
    stable_topological_sort(g)
    assert in_order(g)
    assert [n.name for n in g.nodes] == ["x", "add", "mul", "neg", "output"]
    g.lint()


def test_scrambled_graphs_sort_back_to_the_same_function():
    rng = random.Random(0)
    for _graph_no in range(20):
        g = fx.Graph()
        nodes = [g.placeholder("x")]
        for _ in range(30):
            a, b = rng.choice(nodes), rng.choice(nodes)
            nodes.append(g.call_function(rng.choice([operator.add, operator.sub, operator.mul]), (a, b)))
        g.output(nodes[-1])
        gm = fx.GraphModule(torch.nn.Module(), g)
        want = gm(torch.tensor(0.5, dtype=torch.float64))
        calls = [n for n in g.nodes if n.op == "call_function"]
        for n in rng.sample(calls, 8):  # move some nodes before their inputs
            nodes[0].append(n)
        assert not in_order(g)
        stable_topological_sort(g)
        assert in_order(g)
        g.lint()
        gm.recompile()
        assert torch.equal(gm(torch.tensor(0.5, dtype=torch.float64)), want)


def test_a_user_pattern_holding_a_tensor_constant_is_found_in_the_passes_copy():
    # the passes run on a copy of the traced graph; torch's SubgraphMatcher compares a get_attr constant through the
    # graph's owning module, so the copy must have one
    from torch.fx.experimental.proxy_tensor import make_fx

    import diffusion_fuse
    from diffusion_fuse.config import Options
    from diffusion_fuse.fxpasses.pass_manager import PassManager

    def scaled(x):
        return x * torch.tensor([2.0, 3.0])

    example = [torch.randn(4, 2)]
    diffusion_fuse.register_pattern("scaled_by_constant", scaled, scaled, example)
    try:
        ref = make_fx(lambda x: scaled(x).sin())(*example)
        assert any(n.op == "get_attr" for n in ref.graph.nodes)
        gm, ctx = PassManager(Options()).rewrite(ref)
        assert [s.pattern for s in ctx.sites] == ["scaled_by_constant"], (ctx.notes, ctx.near_misses)
        assert torch.equal(gm(*example), ref(*example))
    finally:
        diffusion_fuse.unregister_pattern("scaled_by_constant")
