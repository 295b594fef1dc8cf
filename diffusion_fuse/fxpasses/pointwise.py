"""Pass: group connected pointwise ATen ops into ``diffusion_fuse::pointwise`` calls (family ``pointwise``).

Runs after ``fuse_patterns`` (the families take their sites first; their ops, and the nodes of
sites the verifier put back, are opaque here) and only in the lossless tier. What it groups:
the ops of kernels/pointwise_ops.py's table (each checked: dtypes bf16/fp16/fp32, scalars it
can reproduce), ``cat``/``stack``, ``repeat`` (GQA's keys repeated per query head), ``constant_pad_nd``
(non-negative pads, a finite fill: SANA pads its fp32 value with a row of ones), and the views (view, unsqueeze,
expand, permute, slice, select, unbind/split items, ...) between them. fp64 values join only on their way to
a narrowing cast (a complex128 RoPE's product: Lumina's). An RMSNorm's variance ``mean(pow(x, 2), [-1],
keepdim)`` joins its tail's group where the tail reads it on every element of rows a program can hold
(patterns/mean_square.py, ``tail_reads_rows``): the kernel sums the rows in eager's order (kernels/pointwise.py,
``_row_mean``).

Grouping, in graph order: each computed node joins the groups of the values it reads, looking
through views (a view joins the group whose value it views when a node of that group reads it;
a lone view of an outside value stays outside, and the kernel reads it at its strides), unless a
path would leave the merged group and come back through an outside node (the group becomes one
op call: that would be a cycle).

Then per group: the values read outside become outputs, computed by the kernel and written
once, when they are computed values of the group's largest element count; a view, or a smaller
value (``scale + 1`` of shape [B,1,D] next to [B,S,D]), read outside also stays in the graph,
and the kernel recomputes it where it needs it. A group that would replace fewer than two
computed ops is left alone (nothing to save), unless its one op is large and one eager runs with
TensorIterator's strided loop (``lone_op_worth_fusing``): an operand broadcast or laid out
unlike the output (SANA's bias adds after a ``mm`` on a transposed input), or a dtype
conversion of a non-contiguous input (its q/k/v ``.float()``). Measured on the H200 at SANA's
shapes, eager's loop runs those at a third of the copy bandwidth. A bf16 activation of at least
``LONE_LOOKUP_MIN_NUMEL`` elements (an MLP's gelu) is one too: its table lookup runs at the copy
speed where eager's arithmetic falls behind it on the H200.

A biased ``convolution`` on CUDA whose output only the group reads (directly or through views) is taken
into the site (``absorb_conv_biases``): the site runs the convolution without its bias and the kernel adds
the bias as its first op. ATen's cuDNN path does the same (Convolution.cpp: ``cudnn_convolution``, then
``output.add_(bias)``, a bf16 add in fp32 opmath), so the bits are eager's; what goes is that add's own pass
over the output (SANA's GLUMBConv: two per block, [2, 11200, 32, 32] each). A backend that adds the bias
inside the convolution gives other bits. ATen's own depthwise kernels do, and run a depthwise convolution
unless its input or filter is channels-last: such a convolution keeps its bias (``_adds_bias_inside``). Any other
backend that does the same is caught by the verifier, which puts the site back.

Each group is a ``Site`` (pattern ``pointwise``) the verifier judges like the others; its program
(the group's own subgraph, also the reference impl) is registered under the key the op call
carries. A site the verifier rejects is diagnosed: the report names the first op whose kernel
differs from eager.
"""

from __future__ import annotations

import dataclasses
import operator
import sys

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..kernels.pointwise import (
    COMPLEX_DTYPES,
    COMPLEX_VIEWS,
    MULTI_VIEW_OPS,
    STRUCTURAL_OPS,
    VIEW_OPS,
    WIDE_DTYPES,
    Unsupported,
    component_dtype,
    pad_fill,
)
from ..kernels.pointwise_ops import FLOAT_DTYPES, LUT16_OPS, RECIPES, lookup_only
from ..lowering.pointwise import (
    PROGRAMS,
    SPEC,
    can_use_pointwise,
    launch_once,
    node_values,
    prepared_discard,
    register_program,
)
from ..patterns.match_utils import describe
from ..patterns.mean_square import tail_reads_rows
from ..patterns.registry import Site
from ..verify.compare import compare_bitwise
from .base import GraphPass, PassContext, register_pass, source_digest
from .fuse_patterns import apply_sites, has_reference

PATTERN = "pointwise"
_WHERE = torch.ops.aten.where.self
_COPY = torch.ops.aten.copy.default


def _numel(v) -> object:
    """An element count usable as a dict key: an int, or the printed symbolic expression."""
    n = v.numel()
    return n if isinstance(n, int) else str(n)


def _tensor(v, dtypes=FLOAT_DTYPES) -> bool:
    return isinstance(v, torch.Tensor) and v.dtype in dtypes


def _only_tensor_nodes(n: fx.Node) -> bool:
    """Every fx.Node argument is a tensor, or tensors (no SymInt nodes: shapes must be constants)."""
    def ok(v) -> bool:
        return isinstance(v, torch.Tensor) or (isinstance(v, (list, tuple)) and all(ok(x) for x in v))

    return all(ok(a.meta.get("val")) for a in n.all_input_nodes)


def classify(n: fx.Node) -> str | None:
    """'compute' (materializes a value), 'view', 'multi' (unbind/split), or None (not groupable)."""
    if n.op != "call_function" or not _only_tensor_nodes(n):
        return None
    v = n.meta.get("val")
    t = n.target
    if t is operator.getitem:
        p = n.args[0]
        ok = isinstance(p, fx.Node) and p.op == "call_function" and p.target in MULTI_VIEW_OPS and _tensor(v)
        return "view" if ok else None
    if t in MULTI_VIEW_OPS:
        ok = isinstance(v, (list, tuple)) and all(_tensor(x) for x in v) and _tensor(n.args[0].meta.get("val"))
        return "multi" if ok else None
    if _tensor(v, COMPLEX_DTYPES) or t in COMPLEX_VIEWS:
        return _classify_complex(n)
    ins = n.all_input_nodes
    if _tensor(v, WIDE_DTYPES):  # fp64 values are only viewed, on their way to a narrowing copy
        return "view" if t in VIEW_OPS and all(_tensor(a.meta.get("val"), WIDE_DTYPES) for a in ins) else None
    if t is torch.ops.aten._to_copy.default and _tensor(ins[0].meta.get("val"), WIDE_DTYPES):
        ok = _tensor(v) and ins[0].meta["val"].device == v.device and len(ins) == 1
        return "compute" if ok and not n.kwargs.keys() - {"dtype", "layout", "device", "memory_format"} else None
    if not _tensor(v):
        return None
    if t in VIEW_OPS:
        return "view" if all(_tensor(a.meta.get("val")) for a in ins) else None
    if t is torch.ops.aten.constant_pad_nd.default and pad_fill(n, v.dtype) is None:
        return None  # a crop (negative pad) or a non-finite fill: eager's op
    if t in STRUCTURAL_OPS:
        return "compute" if all(_tensor(a.meta.get("val")) for a in ins) and ins else None
    if t is torch.ops.aten.mean.dim:
        return "compute" if tail_reads_rows(n) else None  # an RMSNorm's variance, with its tail: a row mean
    r = RECIPES.get(t)
    if r is None or (r.check(n) and not _looked_up(n, v)):
        return None
    for i, a in enumerate(n.args):
        if isinstance(a, fx.Node) and not (t is _COPY and i == 0):  # copy's destination: its shape and dtype only
            allowed = FLOAT_DTYPES + (torch.bool,) if (t is _WHERE and i == 0) else FLOAT_DTYPES
            if i not in r.tensor_args or not _tensor(a.meta.get("val"), allowed):
                return None
            if a.meta["val"].device != v.device:
                return None
    return "compute"


def _classify_complex(n: fx.Node) -> str | None:
    """Complex values join a group only as the code generator keeps them (pairs of their component dtype): in
    through ``view_as_complex`` of an fp32 or fp64 value (or a complex input), through views, ``mul`` of two complex
    tensors, and out through ``view_as_real`` (Qwen-Image's and Lumina's RoPE)."""
    v, t = n.meta.get("val"), n.target
    ins = [a.meta.get("val") for a in n.all_input_nodes]
    if t is torch.ops.aten.view_as_complex.default:
        ok = _tensor(v, COMPLEX_DTYPES) and _tensor(ins[0], (component_dtype(v.dtype),))
        return "view" if ok else None
    if t is torch.ops.aten.view_as_real.default:
        ok = _tensor(ins[0], COMPLEX_DTYPES) and _tensor(v, (component_dtype(ins[0].dtype),))
        return "view" if ok else None
    if t in VIEW_OPS:
        return "view" if all(_tensor(a, COMPLEX_DTYPES) for a in ins) else None
    if t is torch.ops.aten.mul.Tensor and len(n.args) == 2 and not n.kwargs and len(ins) == 2:
        ok = all(_tensor(a, COMPLEX_DTYPES) and a.device == v.device for a in ins)
        return "compute" if ok and all(isinstance(a, fx.Node) for a in n.args) else None
    return None


LONE_OP_MIN_NUMEL = 1 << 16  # below this a lone op's kernel is launch-bound either way
# A lone bf16 activation this large is looked up (kernels/lut16.py) rather than left to eager's arithmetic, which
# the H200's bandwidth outruns: Wan2.2-TI2V-5B's MLP gelu-tanh ([1, 27280, 14336]) takes 15.4 ms for 30 calls
# against an 11.1 ms floor (the profile view), where the lookup runs at 1.04x its floor (bench_pointwise.py)
LONE_LOOKUP_MIN_NUMEL = 1 << 24
LOOKUP_DEVICES = {"cuda"}  # where the lookup's tables are built (the interpreter on the CPU computes the recipe)


def lone_op_worth_fusing(n: fx.Node) -> bool:
    """Whether one op alone is worth a generated kernel: large, and run by eager's strided (unvectorized) loop,
    a ``cat``/``stack`` of inputs that are not contiguous, or a very large bf16 activation (looked up)."""
    v = n.meta.get("val")
    if not isinstance(v, torch.Tensor) or not _static(v) or v.numel() < LONE_OP_MIN_NUMEL:
        return False
    ins = [a.meta["val"] for a in n.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
    if not all(_static(a) for a in ins):
        return False  # symbolic sizes or strides: comparing them would add guards
    if n.target in (torch.ops.aten.cat.default, torch.ops.aten.stack.default):
        # eager's batched copy runs at copy speed on contiguous inputs only; strided ones (a joint attention's
        # value cat of [B, S, H, D] projections viewed as [B, H, S, D], SD3's) take its slow indexed path: at
        # SD3.5-large's shapes 4.8x the bytes' floor on an H100, where a generated kernel reads runs of D
        return any(not a.is_contiguous() for a in ins)
    if n.target in STRUCTURAL_OPS:
        return False
    if n.target in LUT16_OPS and v.numel() >= LONE_LOOKUP_MIN_NUMEL and _bf16_lookup(n, v):
        return True
    if any(_layout(a.expand(v.shape)) != _layout(v) for a in ins):
        return True  # broadcast, or laid out unlike the output
    return n.target is torch.ops.aten._to_copy.default and any(a.dtype != v.dtype and not a.is_contiguous()
                                                              for a in ins)


def _bf16_lookup(n: fx.Node, v: torch.Tensor) -> bool:
    """The generated kernel can look ``n`` (output ``v``) up: bf16 from bf16, where the tables are built."""
    a = n.args[0].meta.get("val") if isinstance(n.args[0], fx.Node) else None
    return (v.device.type in LOOKUP_DEVICES and v.dtype == torch.bfloat16 and isinstance(a, torch.Tensor)
            and a.dtype == torch.bfloat16)


def _looked_up(n: fx.Node, v: torch.Tensor) -> bool:
    """``n`` is exact as the generated kernel's table lookup only, and the kernel will look it up."""
    return lookup_only(n) and _bf16_lookup(n, v)


def _static(t: torch.Tensor) -> bool:
    return all(isinstance(d, int) for d in (*t.shape, *t.stride()))


def _layout(t: torch.Tensor) -> tuple:
    """Strides of the dims that have more than one element (a size-1 dim's stride says nothing)."""
    return tuple(st for n, st in zip(t.shape, t.stride()) if n != 1)


@dataclasses.dataclass
class _Group:
    nodes: set[fx.Node]  # computed nodes and the views between them
    lo: int  # smallest graph position of its nodes


@register_pass
class PointwiseFusionPass(GraphPass):
    name = "pointwise"
    after = ("interleave_scatter",)

    def config_key(self) -> str:
        # The grouping rules live in this module's functions, the op table and which variances the tails take
        # (patterns/mean_square.py): all key the uuid.
        from ..kernels import pointwise_ops
        from ..patterns import mean_square

        return "\0".join(source_digest(m) for m in (sys.modules[__name__], pointwise_ops, mean_square))

    def __call__(self, graph: fx.Graph, ctx: PassContext) -> None:
        if ctx.options.quality != "lossless" or not ctx.options.pattern_enabled(PATTERN, "lossless"):
            return
        # What the families left dead (a consumer that now reads the values it was computed from)
        # goes first: a group of dead ops would be a site whose op never runs.
        graph.eliminate_dead_code()
        opaque = {n for s in ctx.skipped for n in s.nodes}  # sites the verifier put back stay as they are
        sites = (group_site(g, opaque) for g in find_groups(graph, opaque))
        apply_sites(graph, ctx, [s for s in sites if s is not None])


# ---------------------------------------------------------------------------------------------
# grouping
# ---------------------------------------------------------------------------------------------
def find_groups(graph: fx.Graph, opaque: set[fx.Node] = frozenset()) -> list[list[fx.Node]]:
    """The groups of connected groupable nodes (graph order), before choosing outputs.

    Computed nodes are grouped; a view joins a group when a computed node of that group reads
    it and the value it views is computed in that group too, or is an outside value the group
    also reads directly or through another view (a lone view of an outside value, or a view
    whose readers are elsewhere, stays outside).
    """
    nodes = list(graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    kind = {n: k for n in nodes if n not in opaque for k in [classify(n)] if k is not None}
    group_of: dict[fx.Node, _Group] = {}

    def chain(a: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
        """(root, views): the value ``a`` views through groupable views, and those views."""
        views = []
        while kind.get(a) in ("view", "multi"):
            views.append(a)
            a = a.args[0]
        return a, views

    def creates_cycle(members: set[fx.Node], lo: int) -> bool:
        """Whether an outside node between two members would make the merged group a cycle."""
        clear: set[fx.Node] = set()  # outside nodes known not to depend on a member
        for m in members:
            for a in m.all_input_nodes:
                if a in members or index[a] < lo or a in clear:
                    continue
                stack, seen = [a], {a}
                while stack:
                    x = stack.pop()
                    for y in x.all_input_nodes:
                        if y in members:
                            return True
                        if y not in seen and y not in clear and index[y] >= lo:
                            seen.add(y)
                            stack.append(y)
                clear |= seen
        return False

    for n in nodes:
        if kind.get(n) != "compute":
            continue
        g = _Group({n}, index[n])
        candidates: dict[int, tuple[_Group, list[fx.Node]]] = {}
        for a in n.all_input_nodes:
            root, views = chain(a)
            ga = group_of.get(root)
            if ga is not None:
                prev = candidates.get(id(ga))
                candidates[id(ga)] = (ga, views + (prev[1] if prev else []))
        for ga, views in sorted(candidates.values(), key=lambda c: -len(c[0].nodes)):
            members = g.nodes | ga.nodes | set(views)
            lo = min(g.lo, ga.lo)
            if not creates_cycle(members, lo):
                g = _Group(members, lo)
        for m in g.nodes:
            group_of[m] = g
    seen, groups = set(), []
    for n in nodes:
        g = group_of.get(n)
        if g is not None and id(g) not in seen:
            seen.add(id(g))
            groups.append(g)
    # Views of an outside value the group also reads directly, or through two or more views, join the group: the
    # kernel then reads that value once, at the views' indices, instead of each view as an input of its own.
    # FLUX's RoPE reads x and, through reshape + unbind, x's pair elements; Wan's reads only the two elements.
    # Inside the group the codegen reads each pair once (kernels/pointwise.py, _paired).
    claimed: dict[fx.Node, _Group] = {}  # view -> the group that took it (one group each)
    for g in groups:
        direct = {a for m in g.nodes for a in m.all_input_nodes if a not in g.nodes and a not in kind}
        viewed: dict[fx.Node, set[fx.Node]] = {}  # outside value -> the views of it the group reads
        for m in g.nodes:
            for a in m.all_input_nodes:
                root, views = chain(a)
                # (a value a family made inside its site, e.g. the one output its getitems split, has no value in the
                # reference graph the verifier runs: it cannot become an input)
                if views and a not in g.nodes and root not in kind and has_reference(root):
                    viewed.setdefault(root, set()).add(a)
        shared = direct | {r for r, vs in viewed.items() if len(vs) > 1}
        for m in list(g.nodes):
            for a in m.all_input_nodes:
                if a in g.nodes:
                    continue
                root, views = chain(a)
                if views and root in shared and not any(v in group_of or claimed.get(v, g) is not g for v in views):
                    g.nodes |= set(views)
                    claimed.update(dict.fromkeys(views, g))
    return [sorted(g.nodes, key=index.__getitem__) for g in groups]


def group_site(group: list[fx.Node], opaque: set[fx.Node] = frozenset()) -> Site | None:
    """The site of one group: outputs, the nodes it replaces, its program; None if not worth it."""
    members = set(group)
    kinds = {n: classify(n) for n in group}
    ext = {n for n in group if any(u not in members for u in n.users)}
    # The computed values read outside, directly or through views (which stay in the graph).
    computed, stack, seen = set(), list(ext), set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if kinds[n] == "compute":
            computed.add(n)
        else:
            stack.extend(a for a in n.all_input_nodes if a in members)
    if not computed:
        return None
    counts = {_numel(n.meta["val"]) for n in computed}
    ints = [c for c in counts if isinstance(c, int)]
    if len(counts) > 1 and len(ints) != len(counts):
        return None  # symbolic counts that may differ: leave it
    domain = max(ints) if ints else next(iter(counts))
    outputs: list[fx.Node] = []
    kept: set[fx.Node] = set()  # stay in the graph (views, other element counts) and are recomputed inside
    work = sorted(ext, key=group.index)
    while work:
        n = work.pop()
        if n in kept or n in outputs:
            continue
        if kinds[n] == "compute" and _numel(n.meta["val"]) == domain and not n.meta["val"].is_complex():
            outputs.append(n)
        else:
            kept.add(n)
            work.extend(a for a in n.all_input_nodes if a in members)
    outputs.sort(key=group.index)
    # What the kernel computes: the outputs and what they read inside the group.
    live: set[fx.Node] = set()
    stack = list(outputs)
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(a for a in n.all_input_nodes if a in members)
    # a row mean is computed on lanes that hold its rows, its tail's products: they must be the group's (a product
    # left outside would make ``+ eps`` or ``rsqrt`` an output of one value a row, a kernel the generator refuses)
    tails = [r for n in group if n.target is torch.ops.aten.mean.dim for a in n.users for r in a.users]
    if any(u not in members or u in kept for r in tails for u in (r, *r.users)):
        return None
    replaced = [n for n in group if n not in kept]
    compute = [n for n in replaced if kinds[n] == "compute"]
    body = [n for n in group if n in live]
    inputs: list[fx.Node] = []
    for n in body:
        for a in n.all_input_nodes:
            if a not in members and a not in inputs:
                inputs.append(a)
    convs = absorb_conv_biases(inputs, members - kept, kept | opaque)
    if len(compute) + len(convs) < 2 and not (len(compute) == 1 and lone_op_worth_fusing(compute[0])):
        return None
    if not inputs:
        return None  # nothing read from outside (constants only): leave it to eager
    absorbed = [v for c in convs for v in c.views]
    others = [a for a in inputs if a not in absorbed and all(a is not c.conv for c in convs)]
    ops = describe([c.conv for c in convs] + [n for n in replaced if kinds[n] == "compute"])
    key = register_program(_program(body, others, outputs, convs), ops)
    op = torch.ops.diffusion_fuse.pointwise.default
    site_inputs = [a for c in convs for a in c.conv.args[:3]] + others

    def program_inputs(graph_or_none, ins):
        """The program's inputs from the site's: each absorbed convolution run without its bias, and the bias."""
        vals = []
        for k, c in enumerate(convs):
            x, w, b = ins[3 * k:3 * k + 3]
            args = (x, w, None, *c.conv.args[3:])
            vals += [graph_or_none.call_function(_CONV, args) if graph_or_none is not None else _CONV(*args), b]
        return vals + list(ins[3 * len(convs):])

    def emit(graph: fx.Graph, ins):
        call = graph.call_function(op, (program_inputs(graph, ins), key))
        return [graph.call_function(operator.getitem, (call, i)) for i in range(len(outputs))]

    return Site(
        pattern=PATTERN,
        anchor=outputs[-1],
        nodes=[c.conv for c in convs] + [v for c in convs for v in c.views if v not in members] + replaced,
        inputs=site_inputs,
        outputs=outputs,
        emit=emit,
        op="diffusion_fuse::pointwise",  # the report lists the ATen ops it replaced
        n_ops=1 + len(convs),
        diagnose=lambda ins: diagnose(key, program_inputs(None, ins)),
    )


_CONV = torch.ops.aten.convolution.default
# Devices whose convolutions add their bias after the fact (ATen's cuDNN path); tests add "cpu" to check the
# grouping on CPU, where the bits then differ (oneDNN adds the bias inside) and only closeness is checked.
CONV_BIAS_DEVICES = {"cuda"}


@dataclasses.dataclass
class _AbsorbedConv:
    conv: fx.Node  # aten.convolution with a bias
    views: list[fx.Node]  # the views of its output the group reads through (graph order)


def absorb_conv_biases(inputs: list[fx.Node], inside: set[fx.Node], blocked: set[fx.Node]) -> list[_AbsorbedConv]:
    """The biased convolutions among the group's inputs (or what they view) that only ``inside`` reads, with the
    views of their outputs it reads them through. ``blocked``: nodes that stay in the graph (a group's kept
    views, sites the verifier put back); one of them reading the output keeps the bias where it is."""
    found: dict[fx.Node, _AbsorbedConv] = {}
    for a in inputs:
        root = a
        while classify(root) in ("view", "multi") and root not in blocked:
            root = root.args[0]
        if root in found or not _absorbable(root, blocked):
            continue
        # every reader of the output, through views, is in the group
        closure, stack, ok = [], [root], True
        while stack and ok:
            n = stack.pop()
            for u in n.users:
                if u in inside:
                    continue
                if u not in blocked and classify(u) in ("view", "multi"):
                    closure.append(u)
                    stack.append(u)
                else:
                    ok = False
                    break
        if ok:
            found[root] = _AbsorbedConv(root, closure)
    order = {n: i for i, n in enumerate(inputs[0].graph.nodes)} if found else {}
    for c in found.values():
        c.views.sort(key=order.__getitem__)
    return sorted(found.values(), key=lambda c: order[c.conv])


def _absorbable(n: fx.Node, blocked: set[fx.Node]) -> bool:
    if n.op != "call_function" or n.target is not _CONV or n in blocked or len(n.args) != 9:
        return False
    x, w, b, transposed = n.args[0], n.args[1], n.args[2], n.args[6]
    v = n.meta.get("val")
    if not isinstance(b, fx.Node) or transposed or not _tensor(v) or v.device.type not in CONV_BIAS_DEVICES:
        return False
    if not all(_tensor(t.meta.get("val")) and t.meta["val"].dtype == v.dtype for t in (x, w, b)):
        return False
    return not _adds_bias_inside(x.meta["val"], w.meta["val"], n.args[8])


def _adds_bias_inside(x: torch.Tensor, w: torch.Tensor, groups) -> bool:
    """Whether ATen runs a convolution in its own depthwise kernel (``conv_depthwise2d`` / ``3d``), which starts
    each sum from the bias, so the output is rounded once, not twice as cuDNN's ``add_`` after it rounds it.
    ATen picks cuDNN for a depthwise convolution whose input or filter is channels-last. It may pick cuDNN for
    some others too (fp16 ones, under conditions on the shape): those keep their bias here as well, which costs a
    pass over the output, never bits."""
    depthwise = x.dim() in (4, 5) and isinstance(groups, int) and groups > 1 and x.shape[1] == groups
    if not depthwise:
        return False
    return not (_strides_like_channels_last(x) or _strides_like_channels_last(w))


def _strides_like_channels_last(t: torch.Tensor) -> bool:
    """ATen's ``suggest_memory_format() == channels_last`` (c10's ``is_channels_last_strides_2d`` / ``3d``), which
    picks the convolution's backend; a stride not known statically counts against (the bias then stays put).
    Not torch's ``are_strides_like_channels_last_or_false``, whose ``guard_or_true`` may add a guard on a
    symbolic stride; this reads only what is known statically."""
    order = {4: (1, 3, 2, 0), 5: (1, 4, 3, 2, 0)}.get(t.dim())
    shape, strides = t.shape, t.stride()
    if order is None or not statically_known_true(strides[1] != 0):
        return False
    low = 0
    for d in order:
        if not (statically_known_true(shape[d] != 0) and statically_known_true(strides[d] >= low)):
            return False
        if d == 0 and not statically_known_true(low != strides[1]):
            return False  # c10 calls N111-like strides contiguous
        low = strides[d] * shape[d]
    return True


def _program(body: list[fx.Node], inputs: list[fx.Node], outputs: list[fx.Node],
             convs: list[_AbsorbedConv] = ()) -> fx.GraphModule:
    """The group as its own graph, with canonical names (equal groups give equal code and keys).

    An absorbed convolution's output comes in as two inputs, the output without bias and the bias, and its
    first nodes add them as eager's cuDNN path does (``output.add_(bias.reshape(1, -1, 1, ...))``); the views
    the group read of the output follow."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    k = 0
    for i, c in enumerate(convs):
        conv = g.placeholder(f"conv_{i}")
        bias = g.placeholder(f"bias_{i}")
        shape = [1, -1] + [1] * (c.conv.meta["val"].dim() - 2)
        bview = g.call_function(torch.ops.aten.view.default, (bias, shape), name=f"v{k}")
        env[c.conv] = g.call_function(torch.ops.aten.add.Tensor, (conv, bview), name=f"v{k + 1}")
        k += 2
    for i, a in enumerate(inputs):
        env[a] = g.placeholder(f"in_{i}")
    views = [v for c in convs for v in c.views]
    needed, stack = set(), [a for n in body for a in n.all_input_nodes]
    while stack:  # the views the body reads, and the views they read
        n = stack.pop()
        if n in views and n not in needed:
            needed.add(n)
            stack.extend(n.all_input_nodes)
    for n in [v for v in views if v in needed] + body:
        args, kwargs = fx.node.map_arg((n.args, n.kwargs), env.__getitem__)
        env[n] = g.create_node(n.op, n.target, args, kwargs, name=f"v{k}")
        k += 1
    g.output(tuple(env[o] for o in outputs))
    return fx.GraphModule(torch.nn.Module(), g)


def _prefix_program(gm: fx.GraphModule, node: fx.Node) -> fx.GraphModule:
    """``gm`` cut down to what ``node`` reads, with ``node`` as its one output (same placeholders)."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    needed, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n not in needed:
            needed.add(n)
            stack.extend(n.all_input_nodes)
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            env[n] = g.placeholder(n.name)
        elif n in needed:
            env[n] = g.node_copy(n, env.__getitem__)
    g.output((env[node],))
    return fx.GraphModule(torch.nn.Module(), g)


def diagnose(key: str, inputs) -> str:
    """For a rejected group: the first of its ops whose generated kernel differs from eager on ``inputs``."""
    ok, why = can_use_pointwise(SPEC.bind((list(inputs), key)))
    prepared_discard(inputs, key)
    gm = PROGRAMS[key].gm
    # with the ops after it exact, what is left is where the convolution's backend adds the bias
    bias = ("; the site adds a convolution's bias after it, and this convolution's backend adds it inside"
            if any(n.op == "placeholder" and n.name.startswith("conv_") for n in gm.graph.nodes) else "")
    if not ok:
        return f"the reference path ran ({why}): the difference is not the kernel's{bias}"
    # a row mean is never a kernel's output alone: an op that reads one, directly or not, may differ through it
    reads_mean, stack = set(), [n for n in gm.graph.nodes if n.target is torch.ops.aten.mean.dim]
    while stack:
        for u in stack.pop().users:
            if u not in reads_mean:
                reads_mean.add(u)
                stack.append(u)
    for n, value in node_values(gm, inputs):
        if (n.op != "call_function" or not isinstance(value, torch.Tensor) or value.dtype not in FLOAT_DTYPES
                or n.target in VIEW_OPS or n.target is operator.getitem or n.target is torch.ops.aten.mean.dim):
            continue  # an input, a view or a row mean (computed on its tail's lanes): judged through its readers
        try:
            (got,) = launch_once(register_program(_prefix_program(gm, n), describe([n])), list(inputs))
        except Unsupported:
            continue  # not a kernel's output alone (a value on a row mean's rows): judged through its readers
        v = compare_bitwise(value, got)
        if not v:
            mean = "; it reads a row mean the kernel sums (mean.dim)" if n in reads_mean else ""
            return f"first op to differ from eager: {describe([n])[0]} ({v.detail}){mean}"
    return "each op alone equals eager" + bias
