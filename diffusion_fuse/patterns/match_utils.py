"""Matcher helpers shared by the pattern families.

They read ATen graphs as AOTAutograd emits them without decompositions (``aten._to_copy``
for dtype casts) and as Inductor's post-grad graph has them (``prims.convert_element_type``).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence

import torch
import torch.fx as fx

aten = torch.ops.aten
prims = torch.ops.prims


def is_op(node: object, *targets: object) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def arg(node: fx.Node, i: int, name: str, default=None):
    """Argument ``i`` of ``node``, given positionally or by ``name``."""
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def single_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def getitem_users(node: fx.Node) -> dict[int, fx.Node]:
    """Users of a tuple-valued node, by index; raises if a user is not ``getitem``."""
    out: dict[int, fx.Node] = {}
    for user in node.users:
        if not (user.op == "call_function" and user.target is operator.getitem):
            raise LookupError(f"{node.name} has a non-getitem user {user.name}")
        out[user.args[1]] = user
    return out


def val(node: object):
    """The fake/real tensor recorded for a node (``meta['val']``), or None."""
    if isinstance(node, fx.Node):
        return node.meta.get("val")
    return None


def cast_dtype(node: object) -> torch.dtype | None:
    """If ``node`` is a pure dtype cast (no layout/device/memory-format change), its dtype."""
    if is_op(node, aten._to_copy.default):
        kwargs = dict(node.kwargs)
        dtype = kwargs.pop("dtype", None)
        if dtype is None or len(node.args) != 1:
            return None
        src = val(node.args[0])
        if kwargs.pop("layout", torch.strided) != torch.strided:
            return None
        device = kwargs.pop("device", None)
        if device is not None and src is not None and torch.device(device) != src.device:
            return None
        if kwargs.pop("memory_format", None) not in (None, torch.preserve_format):
            return None
        kwargs.pop("pin_memory", None)
        kwargs.pop("non_blocking", None)
        return None if kwargs else dtype
    if is_op(node, prims.convert_element_type.default):
        return node.args[1]
    return None


# Casts that widen exactly: a value of these dtypes is unchanged by ``.float()``.
EXACT_TO_FP32 = (torch.bfloat16, torch.float16, torch.float32)


def fold_upcast(node: object, other_dtype: torch.dtype | None) -> tuple[object, fx.Node | None]:
    """``(src, cast)`` if ``node`` is ``src.float()`` and eager's type promotion with an operand of
    ``other_dtype`` would compute the same fp32 values from ``src`` itself; else ``(node, None)``.

    ``a.float() op b`` equals ``a op b`` bitwise when ``promote(a, b)`` is fp32 (TensorIterator
    widens ``a`` exactly, as the cast does): reading ``src`` spares the fp32 copy.
    """
    if cast_dtype(node) != torch.float32 or other_dtype is None:
        return node, None
    src = node.args[0]
    v = val(src)
    if v is None or v.dtype not in EXACT_TO_FP32 or torch.promote_types(v.dtype, other_dtype) != torch.float32:
        return node, None
    return src, node


def linear_of(y: object) -> tuple[fx.Node, fx.Node | None, fx.Node, fx.Node, fx.Node | None] | None:
    """``(mm, view, x2d, weight, bias)`` of ``[view](addmm(bias, x2d, t(w)))`` or ``[view](mm(x2d, t(w)))``
    (a 2-D input's linear has no view)."""
    view = y if is_op(y, aten.view.default, aten._unsafe_view.default) else None
    mm = view.args[0] if view is not None else y
    if is_op(mm, aten.addmm.default) and not mm.kwargs and len(mm.args) == 3:
        bias, x2d, wt = mm.args
    elif is_op(mm, aten.mm.default) and not mm.kwargs:
        bias, (x2d, wt) = None, mm.args
    else:
        return None
    if not is_op(wt, aten.t.default, aten.permute.default) or (
            is_op(wt, aten.permute.default) and list(wt.args[1]) != [1, 0]):
        return None
    return mm, view, x2d, wt.args[0], bias


def dtype_of(node: object) -> torch.dtype | None:
    v = val(node)
    return v.dtype if isinstance(v, torch.Tensor) else None


def is_scalar(value: object, expected: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and float(value) == expected


def add_scalar_operand(node: object, scalar: float) -> fx.Node | None:
    """``x`` if ``node`` is ``x + scalar`` (either operand order, alpha 1), else None."""
    if not is_op(node, aten.add.Tensor, aten.add.Scalar):
        return None
    if node.kwargs.get("alpha", 1) != 1 or len(node.args) != 2:
        return None
    a, b = node.args
    if isinstance(a, fx.Node) and is_scalar(b, scalar):
        return a
    if isinstance(b, fx.Node) and is_scalar(a, scalar) and node.target is aten.add.Tensor:
        return b
    return None


def other_operand(node: fx.Node, known: fx.Node) -> object:
    """The operand of a binary op that is not ``known``."""
    a, b = node.args[:2]
    if a is known and b is not known:
        return b
    if b is known and a is not known:
        return a
    raise LookupError(f"{known.name} is not exactly one operand of {node.name}")


def same_shape(a: object, b: object) -> bool:
    va, vb = val(a), val(b)
    return va is not None and vb is not None and tuple(va.shape) == tuple(vb.shape)


def depends_on(node: object, target: fx.Node, limit: int = 64) -> bool:
    """Whether ``node`` is computed from ``target`` (bounded backwards walk)."""
    if not isinstance(node, fx.Node):
        return False
    stack, seen = [node], set()
    while stack and len(seen) < limit:
        n = stack.pop()
        if n is target:
            return True
        if n in seen:
            continue
        seen.add(n)
        stack.extend(x for x in n.all_input_nodes)
    return False


# Frames skipped when a frame outside them exists: quantization libraries (a quantizer is named by
# the model line that called the linear) and torch itself (F.rms_norm calls torch.rms_norm inside
# torch/nn/functional.py: the site is named by the model line that called the norm).
LIBRARY_FRAMES = ("/torchao/", "/modelopt/", "diffusion_fuse/testing/fp8.py")
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def source_location(node: fx.Node) -> str:
    """``file:line`` of the innermost user frame in the node's stack trace (quantization libraries
    and torch skipped)."""
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip().startswith("File ")]
    lines = [ln for ln in lines if not any(f in ln for f in LIBRARY_FRAMES)] or lines
    lines = [ln for ln in lines if not ln.startswith(f'File "{_TORCH_DIR}')] or lines
    if not lines:
        return "?"
    last = lines[-1]  # 'File "/path/x.py", line 12, in forward'
    try:
        path = last.split('"')[1]
        lineno = last.split("line ")[1].split(",")[0]
    except IndexError:
        return last
    parts = path.split("/")
    short = "/".join(parts[-3:]) if len(parts) > 3 else path
    return f"{short}:{lineno}"


def describe(nodes: Sequence[fx.Node]) -> list[str]:
    """Short op names of nodes, e.g. ['native_layer_norm', 'getitem', 'mul.Tensor']."""
    names = []
    for n in nodes:
        t = n.target
        if t is operator.getitem:
            names.append("getitem")
        elif hasattr(t, "_overloadpacket"):
            overload = t._overloadname
            base = t._overloadpacket.__name__
            names.append(base if overload == "default" else f"{base}.{overload}")
        else:
            names.append(str(t))
    return names


def trim_defaults(*args: object, required: int) -> tuple:
    """An op call's ``args`` without trailing ``None`` beyond the first ``required``: the call a site emits
    names only the optional arguments it uses (a site with no timestep table keeps the short call)."""
    n = len(args)
    while n > required and args[n - 1] is None:
        n -= 1
    return args[:n]
