"""Pass: a call the graph makes again with the same arguments is made once.

A diffusers block recomputes what does not depend on its input. Qwen-Image's attention builds the joint mask
(``torch.ones`` over the image tokens, ``cat`` with the text mask) in each of its 60 blocks, and SDPA converts it
(``where``, ``scalar_tensor``) each time: 300 launches a forward that one block's five would do. Walking the graph
in order, a node with the target, arguments and keyword arguments of an earlier one gives its readers the
earlier one's result; chains of such nodes collapse one link after the other.

Exact by construction: a deterministic op on the same values gives the same bits. Left alone:

* ops torch tags ``nondeterministic_seeded`` (random) or ``nondeterministic_bitwise``, ops that write into an
  argument, and the ``empty`` family (its contents are undefined, not a value);
* anything but ATen ops and ``getitem`` (collectives, user ops, and this package's ops: each is a site the
  verifier judges on its own). ATen calls a site's replacement made are merged like any other: the ones of
  ungated residuals' unit gates (patterns/gated_residual.py) are made once;
* nodes the graph returns, even through views: two outputs must not become one tensor;
* graphs that write into anything but their inputs (an inference graph from AOTAutograd is functional).

Runs after the pointwise pass, so no family's or group's match sees a node with more readers than eager's graph
has; it takes what they left. Lossless tier only (Inductor does its own).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .base import (
    GraphPass,
    PassContext,
    call_key,
    is_fresh,
    note_rewrites,
    reaches_output,
    register_pass,
    writes_only_inputs,
)

_SKIPPED_TAGS = (torch.Tag.nondeterministic_seeded, torch.Tag.nondeterministic_bitwise)


def _same_value_each_call(n: fx.Node) -> bool:
    """Whether ``n`` computes a value from its arguments alone (the module docstring's conditions)."""
    if n.op != "call_function":
        return False
    if n.target is operator.getitem:
        return True
    target = n.target
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten" or target._schema.is_mutable:
        return False
    if "empty" in target._schema.name:  # empty, empty_like, empty_strided, new_empty...
        return False
    return not any(tag in target.tags for tag in _SKIPPED_TAGS)


@register_pass
class CommonSubexpressionsPass(GraphPass):
    name = "common_subexpressions"
    after = ("pointwise",)

    def __call__(self, graph: fx.Graph, ctx: PassContext) -> None:
        if ctx.options.quality != "lossless" or not writes_only_inputs(graph):
            return
        first: dict[tuple, fx.Node] = {}
        removed = []
        for n in list(graph.nodes):
            if not _same_value_each_call(n):
                continue
            key = call_key(n)  # its arguments are already the kept nodes: chains collapse in one walk
            if key is None:
                continue
            kept = first.setdefault(key, n)
            if kept is n or reaches_output(n):
                continue
            n.replace_all_uses_with(kept)
            graph.erase_node(n)
            if is_fresh(n):  # views and getitems collapse too (so chains through them do), but cost nothing
                removed.append(n.name)
        note_rewrites(ctx, self.name, removed, "op(s) repeating an earlier one's arguments read its result "
                      "(a block recomputing what does not depend on its input, or sites making the same constant)")
