"""``diffusion_fuse::pointwise``: a group of pointwise ATen ops as one op call.

``pointwise(Tensor[] inputs, str key) -> Tensor[]``. ``key`` names a ``PointwiseProgram``
registered by the pointwise pass (fxpasses/pointwise.py) when it built the group: the ATen
subgraph itself, as a small GraphModule whose placeholders are the group's inputs and whose
outputs are the values the rest of the graph reads. Semantics are that subgraph's:

* the reference impl runs it (CPU, and every input a guard rejects): exact by construction;
* the fake impl runs it on fake tensors (shapes, dtypes and strides are eager's);
* on CUDA, the first call with a new input layout generates a Triton kernel for the group
  (kernels/pointwise.py; numerics contract in kernels/pointwise_ops.py), with outputs
  allocated at the strides eager gives them; later calls with that layout launch it directly
  (``GuardedKernel`` caches the plan per layout).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import threading

import torch
import torch.fx as fx

from ..kernels import triton_interpret
from ..kernels.launch import CachedLaunch
from ..kernels.pointwise import (
    BLOCK,
    COMPLEX_DTYPES,
    LUT_BLOCK,
    WIDE_DTYPES,
    Generator,
    KernelSource,
    TensorSpec,
    Unsupported,
    choose_layout,
    load_kernel,
    source_path,
)
from ..kernels.pointwise_ops import DEFAULT_VARIANTS, FLOAT_DTYPES, Variants
from ..log import error_message
from .spec import OpSpec, register_op

_INT32_LIMIT = 2**31 - 2 * max(BLOCK, LUT_BLOCK)


@dataclasses.dataclass
class PointwiseProgram:
    key: str
    gm: fx.GraphModule  # placeholders: the group's inputs; output: the tuple of its outputs
    ops: list[str]  # short op names, for reports

    def reference(self, inputs) -> list[torch.Tensor]:
        return list(self.gm(*inputs))


PROGRAMS: dict[str, PointwiseProgram] = {}
_programs_lock = threading.Lock()


def register_program(gm: fx.GraphModule, ops: list[str]) -> str:
    """Register a group's subgraph; returns its key (the hash of its code: equal groups share one)."""
    key = hashlib.sha256(gm.code.encode()).hexdigest()[:24]
    with _programs_lock:
        PROGRAMS.setdefault(key, PointwiseProgram(key, gm, ops))
    return key


def pointwise(inputs: list[torch.Tensor], key: str) -> list[torch.Tensor]:
    return PROGRAMS[key].reference(inputs)


def _spec(v) -> object:
    if isinstance(v, torch.Tensor):
        return TensorSpec(tuple(v.shape), tuple(v.stride()), v.dtype)
    if isinstance(v, (list, tuple)):
        return [_spec(x) for x in v]
    return None


def node_values(gm: fx.GraphModule, inputs):
    """Run ``gm`` node by node on ``inputs``: yields (node, value) for its placeholders and calls."""
    env: dict[fx.Node, object] = {}
    it = iter(inputs)
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            env[n] = next(it)
        elif n.op == "call_function":
            args, kwargs = fx.node.map_arg((n.args, n.kwargs), env.__getitem__)
            env[n] = n.target(*args, **kwargs)
        else:
            continue
        yield n, env[n]


def propagate_specs(gm: fx.GraphModule, inputs) -> dict[fx.Node, object]:
    """Shape, strides and dtype of every node of ``gm`` for these inputs (fake tensors: no GPU work)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        return {n: _spec(v) for n, v in node_values(gm, [mode.from_tensor(t) for t in inputs])}


def _extent(shape, stride) -> int:
    """One past the largest element offset of a tensor."""
    return 1 + sum((s - 1) * abs(st) for s, st in zip(shape, stride))


def generate_source(inputs, key, variants: Variants = DEFAULT_VARIANTS) -> KernelSource:
    """The kernel for ``PROGRAMS[key]`` and this input layout; raises ``Unsupported``."""
    prog = PROGRAMS[key]
    in_specs = [TensorSpec(tuple(t.shape), tuple(t.stride()), t.dtype) for t in inputs]
    specs = propagate_specs(prog.gm, inputs)
    outs = [specs[o] for o in next(n for n in prog.gm.graph.nodes if n.op == "output").args[0]]
    big = max([math.prod(o.shape) for o in outs] + [_extent(s.shape, s.stride) for s in in_specs + outs])
    index_dtype = "int32" if big < _INT32_LIMIT else "int64"
    device = inputs[0].device
    return choose_layout(lambda: Generator(prog.gm, specs, in_specs, variants, index_dtype, device),
                         title=f"diffusion_fuse::pointwise {key}: {' '.join(prog.ops)}")


_prepared: dict[tuple, KernelSource] = {}
# program key -> the files of the kernels generated for it in this process (a key has one per input layout)
GENERATED: dict[str, set[str]] = {}


def _source_key(inputs, key) -> tuple:
    return (key, tuple((t.device, t.dtype, t.shape, t.stride(), t.data_ptr() & 15) for t in inputs))


def can_use_pointwise(a) -> tuple[bool, str]:
    """Whether a generated kernel reproduces the group for these inputs; else the reason."""
    inputs, key = a.inputs, a.key
    if not inputs:
        return False, "no tensor inputs"
    dev = inputs[0].device
    if dev.type != "cuda" and not (dev.type == "cpu" and triton_interpret()):
        return False, f"device is {dev.type}"
    if any(t.device != dev for t in inputs):
        return False, "inputs on different devices"
    bad = [t.dtype for t in inputs if t.dtype not in FLOAT_DTYPES + COMPLEX_DTYPES + WIDE_DTYPES + (torch.bool,)]
    if bad:
        return False, f"unsupported dtype {bad[0]}"
    if key not in PROGRAMS:
        return False, "unknown program"
    try:
        src = generate_source(inputs, key)
    except Unsupported as e:
        return False, f"not generated: {e}"
    except Exception as e:  # noqa: BLE001 - a codegen bug must fall back, not break the forward
        return False, f"not generated: {error_message(e)}"
    _prepared[_source_key(inputs, key)] = src
    return True, ""


def kernel_args(inputs) -> list[torch.Tensor]:
    """The kernel's tensor arguments: a complex64 input as its ``view_as_real`` (fp32 pairs; Triton takes no
    complex pointers, and the generated code indexes the pairs: pointwise_codegen.COMPLEX_DTYPES)."""
    return [torch.view_as_real(t) if t.is_complex() else t for t in inputs]


def _plan(a):
    inputs, key = a.inputs, a.key
    src = _prepared.pop(_source_key(inputs, key), None) or generate_source(inputs, key)
    kernel = CachedLaunch(load_kernel(src), src.grid, src.constexprs, num_warps=src.num_warps)
    GENERATED.setdefault(key, set()).add(source_path(src))
    outs, numel, tables = src.outputs, src.numel, src.tables
    device = inputs[0].device
    complex_inputs = any(t.is_complex() for t in inputs)

    def launch(a):
        res = [torch.empty_strided(o.shape, o.stride, dtype=o.dtype, device=device) for o in outs]
        kernel(*(kernel_args(a.inputs) if complex_inputs else a.inputs), *res, numel, *tables)
        return res

    return launch


def launch_once(key: str, inputs, variants: Variants = DEFAULT_VARIANTS) -> list[torch.Tensor]:
    """Generate ``key``'s kernel for ``inputs`` and launch it through Triton's JIT (no guard, no plan cache)."""
    src = generate_source(inputs, key, variants)
    outs = [torch.empty_strided(o.shape, o.stride, dtype=o.dtype, device=inputs[0].device) for o in src.outputs]
    load_kernel(src)[src.grid](*kernel_args(inputs), *outs, src.numel, *src.tables, **src.constexprs,
                               num_warps=src.num_warps,
                               enable_fp_fusion=variants.fp_fusion, enable_reflect_ftz=variants.reflect_ftz)
    return outs


def prepared_discard(inputs, key) -> None:
    """Forget a source ``can_use_pointwise`` generated for a call that will not be planned (a diagnosis)."""
    _prepared.pop(_source_key(list(inputs), key), None)


SPEC = register_op(OpSpec("pointwise", pointwise, guard=can_use_pointwise, plan=_plan))
