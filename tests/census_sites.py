"""Census of LayerNorm / RMSNorm + AdaLN-modulate sites in the ATen graphs of the tiny diffusion transformers.

Traces every model of ``diffusion_fuse/testing/tiny_models.py`` the way the lossless backend sees it -- ``aot_autograd`` with NO
decomposition table, inference graph, ``fullgraph=True``, under ``torch.no_grad()`` -- and, for every
``aten.native_layer_norm`` node, walks the chain of ATen ops downstream of its output 0 (dtype casts, the multiply by
``1 + scale``, the ``+ shift``) and classifies it:

    (a) AdaLN norm+modulate site: LN output (possibly through ``_to_copy`` casts) multiplied by ``add(scale, 1)``
        (with or without ``+ shift``).
    (b) plain LN / other, with the reason.

RMSNorm chains (``pow -> mean -> add eps -> rsqrt -> mul``) and fused ``rms_norm`` ops are listed separately,
together with whether a ``* (1 + scale)`` follows them. Any ``mul(·, add(·, 1))`` not reached from a norm is listed
as an "orphan" so nothing is missed.

Usage::

    python tests/census_sites.py                    # print the markdown tables for all models, bf16 and fp32
    python tests/census_sites.py flux wan21         # only these models
    python tests/census_sites.py --out FILE.md      # also write the markdown to FILE.md
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
import torch.fx as fx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from diffusion_fuse.testing.tiny_models import MODEL_NAMES, build  # noqa: E402

aten = torch.ops.aten

DTYPE_SHORT = {
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.float32: "f32",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.bool: "b8",
}

CAST_OPS = {aten._to_copy.default}
# ops followed through when rendering the producer of a scale/shift operand
EXPR_OPS = {
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.add.Tensor,
    aten._to_copy.default,
    aten.split.Tensor,
    aten.split_with_sizes.default,
    aten.slice.Tensor,
    aten.view.default,
    aten.expand.default,
    aten.select.int,
    aten.clone.default,
}


# ----------------------------------------------------------------------------------------------------------------
# capture
# ----------------------------------------------------------------------------------------------------------------
def capture_graphs(model: torch.nn.Module, kwargs: dict) -> list[fx.GraphModule]:
    """Compile with an aot_autograd backend (no decompositions) and return the captured ATen inference graph(s)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs: list[fx.GraphModule] = []

    def capture(gm: fx.GraphModule, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=capture, inference_compiler=capture)
    torch._dynamo.reset()
    with torch.no_grad():
        ref = model(**kwargs)[0]
        out = torch.compile(model, backend=backend, fullgraph=True)(**kwargs)[0]
    torch._dynamo.reset()
    if not torch.equal(ref, out):
        print("WARNING: captured graph output differs from eager", file=sys.stderr)
    return graphs


# ----------------------------------------------------------------------------------------------------------------
# formatting helpers
# ----------------------------------------------------------------------------------------------------------------
def tval(n):
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def ty(n) -> str:
    v = tval(n)
    if isinstance(v, torch.Tensor):
        return f"{DTYPE_SHORT.get(v.dtype, str(v.dtype))}{list(v.shape)}"
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(ty_v(x) for x in v) + ")"
    return "?"


def ty_v(v) -> str:
    if isinstance(v, torch.Tensor):
        return f"{DTYPE_SHORT.get(v.dtype, str(v.dtype))}{list(v.shape)}"
    return repr(v)


def dt(n) -> str:
    v = tval(n)
    return DTYPE_SHORT.get(v.dtype, str(v.dtype)) if isinstance(v, torch.Tensor) else "?"


def opname(n: fx.Node) -> str:
    if n.op == "call_function":
        if n.target is __import__("operator").getitem:
            return "getitem"
        s = str(n.target)
        return s[len("aten.") :] if s.startswith("aten.") else s
    return n.op


def short_op(n: fx.Node) -> str:
    """``aten.mul.Tensor`` -> ``mul``, ``aten._to_copy.default`` -> ``_to_copy``."""
    name = opname(n)
    return name.split(".")[0]


def fmt_arg(a) -> str:
    if isinstance(a, fx.Node):
        return f"%{a.name}"
    if isinstance(a, (list, tuple)):
        inner = ", ".join(fmt_arg(x) for x in a)
        return f"[{inner}]"
    if isinstance(a, torch.dtype):
        return DTYPE_SHORT.get(a, str(a))
    return repr(a)


def fmt_node(n: fx.Node) -> str:
    """One line in the style of aten_pattern_excerpts.txt (kwargs other than dtype left out for brevity)."""
    args = [fmt_arg(a) for a in n.args]
    for k, v in n.kwargs.items():
        if k in ("dtype",):
            args.append(f"{k}={fmt_arg(v)}")
    tgt = "getitem" if opname(n) == "getitem" else f"aten.{opname(n)}"
    return f"%{n.name}: {ty(n)} = {tgt}({', '.join(args)})  # users={len(n.users)}"


def expr(a, depth: int = 3) -> str:
    """Render the producer of an operand: ``unsqueeze(getitem(split(%addmm,32,1),1),1)``."""
    if not isinstance(a, fx.Node):
        return repr(a)
    if a.op == "placeholder":
        return f"%{a.name}"
    if a.op != "call_function":
        return f"%{a.name}"
    if opname(a) == "getitem":
        if depth <= 0:
            return f"%{a.name}"
        return f"{expr(a.args[0], depth - 1)}[{a.args[1]}]"
    if a.target not in EXPR_OPS or depth <= 0:
        return f"%{a.name}<{short_op(a)}>"
    parts = []
    for x in a.args:
        if isinstance(x, fx.Node):
            parts.append(expr(x, depth - 1))
        elif isinstance(x, (list, tuple)):
            parts.append("[" + ",".join(fmt_arg(y) for y in x) + "]")
        else:
            parts.append(repr(x))
    if a.target is aten._to_copy.default:
        parts.append(fmt_arg(a.kwargs.get("dtype")))
    return f"{short_op(a)}({', '.join(parts)})"


_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s+(.*)')


def frames(n: fx.Node) -> list[tuple[str, int, str, str]]:
    st = n.meta.get("stack_trace") or ""
    out = []
    for m in _FRAME_RE.finditer(st):
        path, line, fn, code = m.group(1), int(m.group(2)), m.group(3), m.group(4).strip()
        out.append((path, line, fn, code))
    return out


def where(n: fx.Node, with_caller: bool = True) -> str:
    """Innermost diffusers frame (``normalization.py:169``), plus the calling model file when it is a helper."""
    fr = [f for f in frames(n) if "/diffusers/" in f[0]]
    if not fr:
        fr = frames(n)
    if not fr:
        return "?"

    def rel(p):
        i = p.find("diffusers/models/")
        return p[i + len("diffusers/models/") :] if i >= 0 else os.path.basename(p)

    path, line, fn, code = fr[-1]
    s = f"{rel(path)}:{line}"
    if with_caller and "transformers/" not in rel(path) and len(fr) > 1:
        # a helper module (normalization.py, attention.py): name its immediate caller too
        p2, l2 = fr[-2][0], fr[-2][1]
        s += f" ← {rel(p2).split('/')[-1]}:{l2}"
    return s


def code_line(n: fx.Node) -> str:
    fr = [f for f in frames(n) if "/diffusers/" in f[0]] or frames(n)
    return fr[-1][3] if fr else ""


# ----------------------------------------------------------------------------------------------------------------
# analysis
# ----------------------------------------------------------------------------------------------------------------
def is_add_one(n) -> bool:
    """``add.Tensor(x, 1)`` (or ``add.Tensor(1, x)``, or ``add.Scalar``) with the literal 1."""
    if not (isinstance(n, fx.Node) and n.op == "call_function"):
        return False
    if n.target not in (aten.add.Tensor, aten.add.Scalar):
        return False
    a, b = n.args[0], n.args[1]
    alpha = n.kwargs.get("alpha", 1)
    if alpha != 1:
        return False
    return (isinstance(b, (int, float)) and b == 1 and isinstance(a, fx.Node)) or (
        isinstance(a, (int, float)) and a == 1 and isinstance(b, fx.Node)
    )


def one_plus_scale(n):
    """If n is ``add(s, 1)`` / ``unsqueeze(add(s, 1))`` / casts thereof, return a description dict, else None."""
    steps = []
    cur = n
    while isinstance(cur, fx.Node) and cur.op == "call_function":
        if is_add_one(cur):
            a, b = cur.args[0], cur.args[1]
            s = a if isinstance(a, fx.Node) else b
            lit = b if isinstance(a, fx.Node) else a
            order = "add(s, 1)" if isinstance(a, fx.Node) else "add(1, s)"
            return dict(
                add=cur,
                scale=s,
                literal=lit,
                order=order,
                outer=list(reversed(steps)),  # ops applied AFTER the +1 (outermost first)
            )
        if cur.target in (aten.unsqueeze.default, aten._to_copy.default, aten.view.default, aten.expand.default):
            steps.append(cur)
            cur = cur.args[0]
            continue
        return None
    return None


def scale_form(ops: dict) -> str:
    """'add-after-unsqueeze' when the +1 is applied to an unsqueezed scale, 'add-before-unsqueeze' otherwise."""
    outer = [short_op(x) for x in ops["outer"]]
    s = ops["scale"]
    inner = []
    cur = s
    while isinstance(cur, fx.Node) and cur.op == "call_function" and cur.target in (
        aten.unsqueeze.default,
        aten.squeeze.dim,
        aten._to_copy.default,
        aten.view.default,
    ):
        inner.append(short_op(cur))
        cur = cur.args[0]
    if "unsqueeze" in outer:
        where_ = "add-before-unsqueeze"
    elif "unsqueeze" in inner:
        where_ = "add-after-unsqueeze"
    elif "squeeze" in inner:
        where_ = "add-after-squeeze (no unsqueeze)"
    else:
        where_ = "no unsqueeze (scale already broadcastable)"
    return where_


@dataclass
class Modulate:
    kind: str  # "adaln" | "mul-no-plus-one" | "none"
    chain: list = field(default_factory=list)  # fx nodes in order after the norm output
    mul: fx.Node | None = None
    ln_operand_pos: int | None = None  # 0: mul(ln, t); 1: mul(t, ln)
    ops: dict | None = None
    shift_add: fx.Node | None = None
    shift: fx.Node | None = None
    shift_pos: int | None = None  # 0: add(shift, ·); 1: add(·, shift)
    stop: str = ""  # what ends the chain


def walk_modulate(start: fx.Node) -> list[Modulate]:
    """From the norm output ``start`` follow casts, then mul by (1+scale), then + shift, then casts.

    Branches when an intermediate has several users (each branch is one Modulate).
    """
    results = []

    def users_desc(n):
        return ", ".join(f"{short_op(u)}" for u in n.users)

    def rec(cur: fx.Node, chain: list):
        # casts before the mul
        us = list(cur.users)
        if len(us) == 0:
            results.append(Modulate("none", chain, stop="no users"))
            return
        if len(us) > 1:
            for u in us:
                rec_one(cur, u, chain)
            return
        rec_one(cur, us[0], chain)

    def rec_one(cur, u, chain):
        if u.op == "call_function" and u.target in CAST_OPS:
            rec(u, chain + [u])
            return
        if u.op == "call_function" and u.target is aten.mul.Tensor:
            pos = 0 if u.args[0] is cur else 1
            other = u.args[1 - pos]
            ops = one_plus_scale(other)
            m = Modulate("adaln" if ops else "mul-no-plus-one", chain + [u], mul=u, ln_operand_pos=pos, ops=ops)
            # after the mul: casts, then + shift, then casts
            tail(m, u)
            results.append(m)
            return
        results.append(Modulate("none", chain, stop=f"{short_op(u)} ({where(u, False)})"))

    def tail(m: Modulate, cur: fx.Node):
        while True:
            us = list(cur.users)
            if len(us) != 1:
                m.stop = f"{len(us)} users of %{cur.name}: {users_desc(cur)}"
                return
            u = us[0]
            if u.op == "call_function" and u.target in CAST_OPS:
                m.chain.append(u)
                cur = u
                continue
            if u.op == "call_function" and u.target is aten.add.Tensor and m.shift_add is None:
                pos = 1 if u.args[0] is cur else 0
                m.shift_add, m.shift, m.shift_pos = u, u.args[pos], pos
                m.chain.append(u)
                cur = u
                continue
            m.stop = short_op(u) if u.op == "call_function" else u.op
            return

    rec(start, [])
    return results


@dataclass
class Site:
    idx: int
    norm: fx.Node  # native_layer_norm or rsqrt/rms node
    out: fx.Node  # normalized output (getitem 0 / final mul of RMS)
    kind: str  # "LN" | "RMS"
    info: dict
    mods: list


def analyze_ln(gm: fx.GraphModule) -> list[Site]:
    sites = []
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is aten.native_layer_norm.default:
            x, shape, w, b, eps = n.args
            outs = {u.args[1]: u for u in n.users if opname(u) == "getitem"}
            y = outs.get(0)
            info = dict(
                input=ty(x),
                input_expr=expr(x, 1),
                shape=list(shape),
                weight=w is not None,
                bias=b is not None,
                eps=eps,
                out_dtype=dt(y) if y is not None else "?",
                other_outputs_used=sorted(k for k in outs if k != 0),
                ln_users=len(n.users),
                y_users=len(y.users) if y is not None else 0,
            )
            mods = walk_modulate(y) if y is not None else []
            sites.append(Site(len(sites), n, y, "LN", info, mods))
    return sites


def analyze_rms(gm: fx.GraphModule) -> list[Site]:
    """``rsqrt(add(mean(pow(x, 2), [-1], True), eps))`` then ``mul(x, rsqrt)`` [``mul(·, w)``] [casts]."""
    sites = []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is aten.rsqrt.default:
            a = n.args[0]
            if not (isinstance(a, fx.Node) and a.target in (aten.add.Scalar, aten.add.Tensor)):
                continue
            mean = a.args[0]
            if not (isinstance(mean, fx.Node) and mean.target is aten.mean.dim):
                continue
            pw = mean.args[0]
            if not (isinstance(pw, fx.Node) and pw.target in (aten.pow.Tensor_Scalar,) and pw.args[1] == 2):
                continue
            x = pw.args[0]
            # torch.nn.RMSNorm multiplies the f32 copy; diffusers' RMSNorm multiplies the original (bf16) tensor
            cands = {x}
            if isinstance(x, fx.Node) and x.target in CAST_OPS:
                cands.add(x.args[0])
            normed = [u for u in n.users if u.target is aten.mul.Tensor and any(c in u.args for c in cands)]
            if not normed:
                continue
            y = normed[0]
            chain = [y]
            weighted = False
            # optional weight multiply / casts (diffusers RMSNorm casts to weight dtype before * weight)
            cur = y
            while len(cur.users) == 1:
                u = next(iter(cur.users))
                if u.target in CAST_OPS and not weighted:
                    chain.append(u)
                    cur = u
                    continue
                if u.target is aten.mul.Tensor and not weighted:
                    other = u.args[1] if u.args[0] is cur else u.args[0]
                    if isinstance(other, fx.Node) and other.op in ("placeholder", "get_attr"):
                        weighted = True
                        chain.append(u)
                        cur = u
                        continue
                break
            info = dict(
                input=ty(x),
                input_expr=expr(x, 1),
                shape=list(mean.args[1]),
                weight=weighted,
                bias=False,
                eps=a.args[1],
                out_dtype=dt(cur),
                chain=[short_op(c) for c in chain],
                y_users=len(cur.users),
            )
            mods = walk_modulate(cur)
            sites.append(Site(len(sites), n, cur, "RMS", info, mods))
        elif "rms_norm" in str(n.target):
            info = dict(input=ty(n.args[0]), input_expr=expr(n.args[0], 1), shape=list(n.args[1]), weight=len(n.args) > 2 and n.args[2] is not None, bias=False, eps=n.args[3] if len(n.args) > 3 else None, out_dtype="?", chain=[opname(n)], y_users=len(n.users))
            outs = [u for u in n.users if opname(u) == "getitem" and u.args[1] == 0] or [n]
            sites.append(Site(len(sites), n, outs[0], "RMS", info, walk_modulate(outs[0])))
    return sites


def orphans(gm: fx.GraphModule, claimed: set) -> list[fx.Node]:
    """``mul(·, 1 + scale)`` nodes not reached from any norm."""
    res = []
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is aten.mul.Tensor and n not in claimed:
            if any(one_plus_scale(a) for a in n.args if isinstance(a, fx.Node)):
                res.append(n)
    return res


# ----------------------------------------------------------------------------------------------------------------
# descriptions
# ----------------------------------------------------------------------------------------------------------------
def cast_desc(nodes) -> str:
    return "→".join(f"_to_copy({dt(c)})" for c in nodes if c.target in CAST_OPS)


def mod_chain_str(site: Site, m: Modulate) -> str:
    """Compact op sequence after the norm: ``_to_copy(f32) → mul(ln, t) → add(·, shift) → _to_copy(bf16)``."""
    parts = []
    for c in m.chain:
        if c.target in CAST_OPS:
            parts.append(f"_to_copy({dt(c)})")
        elif c is m.mul:
            parts.append("mul(ln, t)" if m.ln_operand_pos == 0 else "mul(t, ln)")
        elif c is m.shift_add:
            parts.append("add(·, shift)" if m.shift_pos == 1 else "add(shift, ·)")
        else:
            parts.append(short_op(c))
    return " → ".join(parts) if parts else "–"


def classify(site: Site, m: Modulate) -> tuple[str, str]:
    if m.kind == "adaln":
        note = "" if m.shift_add is not None else " (NO shift)"
        dts = {dt(m.mul.args[m.ln_operand_pos]), dt(m.ops["add"]), dt(m.mul)}
        if m.shift is not None:
            dts.add(dt(m.shift))
        if len(dts) > 1:
            note += f" (MIXED dtypes {sorted(dts)})"
        lit = m.ops["literal"]
        if not (lit == 1 and type(lit) is int):
            note += f" (literal {lit!r})"
        return "a", "AdaLN norm+modulate" + note
    if m.kind == "mul-no-plus-one":
        other = m.mul.args[1 - m.ln_operand_pos]
        return "b", f"norm × {expr(other, 2)} without +1"
    return "b", f"plain norm → {m.stop}"


def site_signature(site: Site, m: Modulate) -> str:
    """Canonical ATen form used to group sites into the variants the matcher must accept."""
    i = site.info
    if site.kind == "LN":
        norm = (
            f"native_layer_norm[in {i['input'].split('[')[0]} → out {i['out_dtype']}, "
            f"{'w' if i['weight'] else 'no w'}/{'b' if i['bias'] else 'no b'}, eps={i['eps']}]"
        )
        pre = site.norm.args[0]
        if isinstance(pre, fx.Node) and pre.target in CAST_OPS:
            norm = f"_to_copy(x:{dt(pre.args[0])}→{dt(pre)}) → " + norm
    else:
        norm = f"RMS[{'→'.join(i['chain'])}, out {i['out_dtype']}]"
    s = norm + " → " + mod_chain_str(site, m)
    if m.ops:
        o = m.ops
        s += f" ; t = {scale_form(o)} {o['order'].replace('1', repr(o['literal']))}, scale {dt(o['scale'])}"
        if m.shift is not None:
            s += f" ; shift {dt(m.shift)} via {shift_form(m.shift)}"
    return s


def shift_form(sh) -> str:
    if isinstance(sh, fx.Node) and sh.target is aten.unsqueeze.default:
        return "unsqueeze"
    if isinstance(sh, fx.Node) and sh.target is aten.squeeze.dim:
        return "squeeze"
    if isinstance(sh, fx.Node) and sh.target in CAST_OPS:
        return "_to_copy"
    return "direct"


def excerpt_nodes(site: Site, m: Modulate) -> list[fx.Node]:
    """Nodes to print for one site: scale/shift producers (2 levels), the norm, its chain."""
    nodes = set()

    def up(n, depth):
        if not isinstance(n, fx.Node) or n.op != "call_function" or depth < 0:
            return
        nodes.add(n)
        if n.target in (aten.split.Tensor, aten.split_with_sizes.default):
            if isinstance(n.args[0], fx.Node) and n.args[0].op == "call_function":
                nodes.add(n.args[0])  # show what was chunked, not further
            return
        for a in n.args:
            if isinstance(a, fx.Node):
                up(a, depth - 1)

    if site.kind == "LN":
        nodes.add(site.norm)
        nodes.add(site.out)
        pre = site.norm.args[0]
        if isinstance(pre, fx.Node) and pre.target in CAST_OPS:
            nodes.add(pre)
    else:
        up(site.out, 5)
    for c in m.chain:
        nodes.add(c)
    if m.ops:
        up(m.mul.args[1 - m.ln_operand_pos], 3)
    if m.shift is not None:
        up(m.shift, 2)
    order = {n: k for k, n in enumerate(site.norm.graph.nodes)}
    return sorted(nodes, key=lambda n: order[n])


# ----------------------------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------------------------
def census_model(name: str, dtype: torch.dtype):
    model, kwargs = build(name, dtype)
    graphs = capture_graphs(model, kwargs)
    rows, forms, rms_rows, orphan_rows = [], OrderedDict(), [], []
    n_a_ln, n_a_mod = 0, 0
    claimed = set()
    for gi, gm in enumerate(graphs):
        for site in analyze_ln(gm):
            ln_is_a = False
            for bi, m in enumerate(site.mods):
                cls, reason = classify(site, m)
                if m.mul is not None:
                    claimed.add(m.mul)
                if cls == "a":
                    n_a_mod += 1
                    ln_is_a = True
                    sig = site_signature(site, m)
                    forms.setdefault(sig, []).append((site, m))
                rows.append(row_for(name, site, m, cls, reason, bi, len(site.mods)))
            n_a_ln += ln_is_a
        for site in analyze_rms(gm):
            rms_rows.append(rms_row_for(site, forms, claimed))
        for o in orphans(gm, claimed):
            orphan_rows.append(f"%{o.name} {ty(o)} at {where(o)} `{code_line(o)}`")
    return dict(
        rows=rows,
        rms=rms_rows,
        orphans=orphan_rows,
        forms=forms,
        n_ln=sum(1 for r in rows if r["branch"] == 0),
        n_a_ln=n_a_ln,
        n_a_mod=n_a_mod,
        n_graphs=len(graphs),
    )


def row_for(name, site, m, cls, reason, bi, nb, rms=False):
    i = site.info
    o = m.ops
    r = dict(
        branch=bi,
        site=f"{'rms' if rms else 'ln'}{site.idx}" + (f".{bi}" if nb > 1 else ""),
        node=f"%{site.norm.name}",
        src=where(m.mul if m.mul is not None else site.norm),
        norm_src=where(site.norm),
        input=f"{i['input']} ← {i['input_expr']}",
        wb=("w" if i["weight"] else "–") + "/" + ("b" if i["bias"] else "–"),
        eps=i["eps"],
        chain=mod_chain_str(site, m),
        cls=cls,
        reason=reason,
        scale="–",
        scale_form="–",
        shift="–",
        users="",
        code=code_line(m.mul if m.mul is not None else site.norm),
    )
    if o:
        r["scale"] = f"{ty(o['scale'])} = {expr(o['scale'], 2)}"
        lit = o["literal"]
        r["scale_form"] = f"{scale_form(o)}; {o['order']}" + ("" if (lit == 1 and type(lit) is int) else f" literal={lit!r}")
    if m.shift is not None:
        r["shift"] = f"{ty(m.shift)} = {expr(m.shift, 2)}"
    elif m.kind == "adaln":
        r["shift"] = "**none**"
    # users of each intermediate
    u = ([f"ln:{i['ln_users']}"] if "ln_users" in i else []) + [f"y:{i['y_users']}"]
    if o:
        u.append(f"t:{len(o['add'].users)}")
        for x in o["outer"]:
            u.append(f"{short_op(x)}(t):{len(x.users)}")
    for c in m.chain:
        lab = "mul" if c is m.mul else ("add" if c is m.shift_add else short_op(c))
        u.append(f"{lab}:{len(c.users)}")
    r["users"] = " ".join(u)
    r["stop"] = m.stop
    return r


def rms_row_for(site: Site, forms: dict, claimed: set) -> dict:
    """One row per RMSNorm: (a) if some branch of its output is multiplied by (1 + scale)."""
    i = site.info
    ends, cls, reason = [], "b", "plain RMSNorm"
    for m in site.mods:
        if m.mul is not None:
            claimed.add(m.mul)
        c, rsn = classify(site, m)
        if c == "a":
            cls, reason = "a", "RMSNorm + AdaLN modulate"
            forms.setdefault(site_signature(site, m), []).append((site, m))
            ends.append(mod_chain_str(site, m))
        elif m.kind == "mul-no-plus-one":
            ends.append(f"mul by {expr(m.mul.args[1 - m.ln_operand_pos], 2)} (no +1; {where(m.mul, False)})")
        else:
            ends.append(m.stop)
    return dict(
        site=f"rms{site.idx}",
        node=f"%{site.norm.name}",
        cls=cls,
        reason=reason,
        norm_src=where(site.norm),
        input=f"{i['input']} ← {i['input_expr']}",
        weight="w" if i["weight"] else "–",
        eps=i["eps"],
        chain="rsqrt → " + " → ".join(i["chain"]) + f" (out {i['out_dtype']})",
        users=str(i["y_users"]),
        ends="; ".join(ends),
    )


def md_escape(s) -> str:
    return str(s).replace("|", "\\|")


def render(results: dict, names: list[str]) -> str:
    L = []
    L.append("| model | (a) LN sites bf16 | (a) modulate branches bf16 | (a) LN sites fp32 | (a) modulate branches fp32 | LN total | RMSNorm chains (bf16) | RMS+modulate |")
    L.append("|---|---|---|---|---|---|---|---|")
    for name in names:
        b, f = results[(name, torch.bfloat16)], results[(name, torch.float32)]
        n_rms_mod = sum(1 for r in b["rms"] if r["cls"] == "a")
        L.append(
            f"| {name} | {b['n_a_ln']} | {b['n_a_mod']} | {f['n_a_ln']} | {f['n_a_mod']} | {b['n_ln']} | "
            f"{len(b['rms'])} | {n_rms_mod} |"
        )
    L.append("")
    for name in names:
        for dtype in (torch.bfloat16, torch.float32):
            res = results[(name, dtype)]
            dn = DTYPE_SHORT[dtype]
            L.append(f"### {name} — {dn}  ({res['n_graphs']} graph; (a) sites: {res['n_a_ln']} LNs, {res['n_a_mod']} modulate branches)")
            L.append("")
            L.append("| site | class | source (modulate / norm) | LN input | w/b | eps | chain after LN | scale operand | +1 form | shift operand | users | ends at |")
            L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for r in res["rows"]:
                src = r["src"] if r["src"] == r["norm_src"] else f"{r['src']} / {r['norm_src']}"
                L.append(
                    "| "
                    + " | ".join(
                        md_escape(x)
                        for x in (
                            r["site"],
                            f"({r['cls']}) {r['reason']}",
                            src,
                            r["input"],
                            r["wb"],
                            r["eps"],
                            r["chain"],
                            r["scale"],
                            r["scale_form"],
                            r["shift"],
                            r["users"],
                            r["stop"],
                        )
                    )
                    + " |"
                )
            L.append("")
            if res["rms"]:
                L.append(f"RMSNorm chains ({dn}):")
                L.append("")
                L.append("| site | class | source | input | weight | eps | chain | users of output | consumers |")
                L.append("|---|---|---|---|---|---|---|---|---|")
                for r in res["rms"]:
                    L.append(
                        "| "
                        + " | ".join(
                            md_escape(x)
                            for x in (
                                r["site"],
                                f"({r['cls']}) {r['reason']}",
                                r["norm_src"],
                                r["input"],
                                r["weight"],
                                r["eps"],
                                r["chain"],
                                r["users"],
                                r["ends"],
                            )
                        )
                        + " |"
                    )
                L.append("")
            if res["orphans"]:
                L.append(f"`mul(·, 1 + scale)` not fed by a norm ({dn}):")
                L.append("")
                for o in res["orphans"]:
                    L.append(f"- {o}")
                L.append("")
        # forms, merged over dtypes
        L.append(f"#### {name} — ATen forms seen")
        L.append("")
        for dtype in (torch.bfloat16, torch.float32):
            res = results[(name, dtype)]
            for sig, lst in res["forms"].items():
                site, m = lst[0]
                srcs = sorted({where(mm.mul, False) for _, mm in lst})
                L.append(f"- **{DTYPE_SHORT[dtype]}**, {len(lst)}× ({', '.join(srcs)}): `{sig}`")
                L.append("")
                L.append("```")
                for n in excerpt_nodes(site, m):
                    L.append(fmt_node(n))
                L.append("```")
        L.append("")
    return "\n".join(L)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", default=MODEL_NAMES)
    ap.add_argument("--out", default=None, help="also write the markdown to this file")
    args = ap.parse_args(argv)
    torch._dynamo.config.cache_size_limit = 64
    results = {}
    for name in args.models:
        for dtype in (torch.bfloat16, torch.float32):
            results[(name, dtype)] = census_model(name, dtype)
    text = render(results, args.models)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
