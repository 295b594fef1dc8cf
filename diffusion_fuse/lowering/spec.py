"""One declaration per op: ``OpSpec``, and the ``torch.library`` registration generated from it.

An op is declared by its reference implementation: a typed function whose signature is the op's schema
(``torch.library.infer_schema``) and whose body is the ATen composition the op replaces. From that one
signature come

- the schema ``diffusion_fuse::<name>(...)`` (a trailing argument with a default may be left out of a call);
- the fake impl: the reference run on fake tensors, so the op's output shapes, dtypes and strides are the
  reference's by construction (and the verifier holds the kernel to them);
- ``Args``, a named tuple of the op's arguments: the guard, the plan and the launch read ``a.x``, ``a.eps``, ...
  instead of spelling the argument list again;
- the layout key a launch plan is cached under: every tensor's device, dtype, shape, strides and 16-byte
  alignment (Triton specializes on it), every other argument as it is.

The rest of a spec is the family's: ``guard(a) -> (ok, reason)`` (``can_use_<op>``), whether the kernel
reproduces the reference for these arguments; ``plan(a) -> launch`` and ``launch(a) -> output``, the kernel for
one layout; and, optionally, ``static_guard(a) -> reason``, the part of the guard that shapes and dtypes alone
decide, which the fuse pass checks on fake values when it rewrites a site (a site whose kernel could never run is
then a near miss with that reason instead of a site that always takes the reference path).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from .dispatch import GuardedKernel, impl

NAMESPACE = "diffusion_fuse"
_lib = torch.library.Library(NAMESPACE, "FRAGMENT")

Launch = Callable[[Any], Any]


def tensor_key(t: torch.Tensor) -> tuple:
    return (t.device, t.dtype, t.shape, t.stride(), t.data_ptr() & 15)


def value_key(v: object) -> Hashable:
    """What a launch plan depends on for one argument."""
    if isinstance(v, torch.Tensor):
        return tensor_key(v)
    if isinstance(v, (list, tuple)):
        return tuple(value_key(x) for x in v)
    return v


def default_layout_key(args: tuple) -> tuple:
    return tuple(value_key(v) for v in args)


@dataclasses.dataclass
class OpSpec:
    """An op: its reference (signature and semantics), guard, plan and optional static guard."""

    name: str
    reference: Callable[..., Any]
    guard: Callable[[Any], tuple[bool, str]]
    plan: Callable[[Any], Launch]
    static_guard: Callable[[Any], str] | None = None
    layout_key: Callable[[tuple], Hashable] = default_layout_key
    needs_triton: bool = True  # False where the kernel is not Triton's (linear_cat: cuBLAS)
    compute_bound: bool = False  # its kernel is a GEMM (linear_cat): the profile view gives it no bytes floor
    # set by ``register_op``
    schema: str = ""
    Args: type = tuple
    dispatch: GuardedKernel | None = None

    @property
    def overload(self) -> torch._ops.OpOverload:
        return getattr(getattr(torch.ops, NAMESPACE), self.name).default

    def bind(self, args: Sequence[Any]) -> Any:
        return self.Args(*args)

    def run_kernel(self, *args: Any) -> Any:
        """Plan and launch the kernel once, with no guard and no plan cache (tests, benchmarks)."""
        a = self.bind(args)
        return self.plan(a)(a)


SPECS: dict[str, OpSpec] = {}
# op overload -> its spec, for the passes (static guards) and the conformance test
BY_OVERLOAD: dict[Any, OpSpec] = {}


def _args_type(name: str, reference: Callable[..., Any]) -> type:
    params = list(inspect.signature(reference).parameters.values())
    for p in params:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise TypeError(f"{name}: the reference's parameters are the op's arguments, all positional "
                            f"({p.name} is not)")
    defaults = [p.default for p in params if p.default is not inspect.Parameter.empty]
    return collections.namedtuple(f"{name}_args", [p.name for p in params], defaults=defaults)


def register_op(spec: OpSpec) -> OpSpec:
    """Define ``diffusion_fuse::<spec.name>`` from ``spec``: schema, dispatch (kernel or reference) and fake impl."""
    if spec.name in SPECS:
        raise ValueError(f"op {NAMESPACE}::{spec.name} is already registered")
    spec.Args = _args_type(spec.name, spec.reference)
    spec.schema = torch.library.infer_schema(spec.reference, mutates_args=())
    _lib.define(spec.name + spec.schema)
    spec.dispatch = GuardedKernel(spec.name, spec.layout_key, spec.guard, spec.plan, spec.reference, spec.bind,
                                  spec.needs_triton)
    impl(_lib, spec.name, spec.dispatch)
    reference = spec.reference
    torch.library.register_fake(f"{NAMESPACE}::{spec.name}", lib=_lib)(
        lambda *args: reference(*args))
    SPECS[spec.name] = spec
    BY_OVERLOAD[spec.overload] = spec
    return spec


def static_check(target: object, args: Sequence[Any]) -> str:
    """Why a call of ``target`` on these (fake) values could never run its kernel, or ''."""
    spec = BY_OVERLOAD.get(target)
    if spec is None or spec.static_guard is None:
        return ""
    return spec.static_guard(spec.bind(args))
