"""The pattern registry: what the backend looks for.

A pattern family is a small class that registers itself (``@register_family``): a name,
a tier ("lossless" families are bit-exact with eager; "high" ones are not), the anchor
ops a match starts from, the ATen variants it covers (documentation that tests read),
and ``match(node)`` returning a ``Site`` (what to replace and how), a ``NearMiss``
(an anchor it recognised but could not take, with the reason), or None.

Users add their own through ``diffusion_fuse.register_pattern`` (see ``patterns/user.py``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

import torch
import torch.fx as fx

TIERS = ("lossless", "high")

# Emits the replacement into the graph at its current insertion point, given the nodes
# that stand for the site's inputs; returns one node per site output.
EmitFn = Callable[[fx.Graph, Sequence[fx.Node]], Sequence[fx.Node]]
# A plain-PyTorch callable (a function or a module) and inputs that hold the family's form: what the conformance
# test (tests/test_families.py) compiles for every registered family, and what docs show.
Example = tuple[Callable[..., Any], tuple[Any, ...]]


def example_tensor(*shape: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    """A seeded random tensor for a family's ``example``."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@dataclasses.dataclass
class Site:
    """One match: the ATen nodes a pattern replaces and what replaces them."""

    pattern: str
    anchor: fx.Node
    nodes: list[fx.Node]  # matched nodes, all replaced (dead after the rewrite)
    inputs: list[fx.Node]  # values flowing in, in the order ``emit`` takes them
    outputs: list[fx.Node]  # matched nodes whose values flow out of the site
    emit: EmitFn
    op: str  # the op the site becomes, for the report
    exact: bool = True  # False: the replacement is not bit-exact (tier high only)
    key: str | None = None  # set by the fuse pass: pattern@source-line#ordinal
    n_ops: int | None = None  # op calls the site becomes (default: one per output)
    where: fx.Node | None = None  # the node whose source line names the site (default: the last output)
    # For a site the verifier rejects: given the site's input values, what went wrong (e.g. which
    # of the ops a fused group replaced first differs from eager), added to the verdict.
    diagnose: Callable[[Sequence[object]], str] | None = None
    # Where the replacement goes (default: before the site's last node). A site whose members are spread over
    # the graph (grouped_gemv) goes before its first, so that its outputs precede every reader.
    insert_before: fx.Node | None = None
    # A user pattern's site (patterns/user.py): (replacement, reference) as callables of the site's inputs; the
    # fuse pass emits the replacement guarded, the reference answering when it raises (lowering/user_ops.py).
    user: tuple[Callable[..., Any], Callable[..., Any]] | None = None

    @property
    def located_at(self) -> fx.Node:
        return self.where if self.where is not None else self.outputs[-1]

    @property
    def id(self) -> str:
        """Stable across re-traces of the same model: pattern, source line, ordinal there.

        Falls back to the anchor node's name when the graph carries no stack traces.
        """
        return self.key or f"{self.pattern}@{self.anchor.name}"


@dataclasses.dataclass(frozen=True)
class NearMiss:
    """An anchor a pattern recognised but did not take, and why."""

    pattern: str
    anchor: fx.Node
    reason: str


class PatternFamily:
    """Base class of a pattern family. Subclasses set the class attributes and ``match``."""

    name: ClassVar[str]
    tier: ClassVar[str] = "lossless"
    priority: ClassVar[int] = 0  # families sharing an anchor are tried highest first (larger patterns first)
    anchors: ClassVar[tuple[Callable, ...]] = ()
    variants: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = ""
    # A family whose sites a pass of its own finds (fxpasses/<name>.py) instead of ``match``
    # on anchors: it has no anchors, and is listed here for options, reports and docs.
    found_by_pass: ClassVar[bool] = False
    # True: searched in tier lossless only (a part of a chain that a tier-high family takes whole)
    lossless_only: ClassVar[bool] = False
    # The kernels/ module whose kernel the family's op launches: its own (kernels/<name>.py) by default, another
    # family's when it runs that kernel with another epilogue, None when its op calls ATen (cuBLAS) only.
    kernel: ClassVar[str | None] = ""
    # The family whose pass takes the anchors ``yields(node)`` selects, while that family is searched (the fuse pass
    # then does not try this one there): mean_square leaves a variance its tail's pointwise kernel sums
    yields_to: ClassVar[str | None] = None
    # True for a family added by ``diffusion_fuse.register_pattern``: the report says when it goes unused
    user: bool = False
    # False: searched only where ``options["patterns"]`` turns it on (a family that does not pay in a whole model)
    on_by_default: ClassVar[bool] = True

    @classmethod
    def kernel_module(cls) -> str | None:
        return cls.name if cls.kernel == "" else cls.kernel

    def match(self, node: fx.Node) -> Site | NearMiss | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def yields(self, node: fx.Node) -> bool:
        """Whether ``yields_to``'s pass takes this anchor."""
        return False

    def example(self) -> Example | None:
        """One of the family's forms: compiled, it holds at least one of the family's sites."""
        return None

    def near_miss_example(self) -> Example | None:
        """A form the family recognises but cannot take: compiled, it gives the family a near miss."""
        return None


class Registry:
    """The pattern families by name (``REGISTRY``); users add theirs with ``register_family``."""

    def __init__(self) -> None:
        self._families: dict[str, PatternFamily] = {}
        self._lock = threading.Lock()

    def add(self, family: PatternFamily, *, replace: bool = False) -> PatternFamily:
        if family.tier not in TIERS:
            raise ValueError(f"pattern {family.name!r}: tier={family.tier!r} is not allowed; allowed: {list(TIERS)}")
        if not family.anchors and not family.found_by_pass:
            raise ValueError(f"pattern {family.name!r} has no anchor ops")
        with self._lock:
            if family.name in self._families and not replace:
                raise ValueError(f"a pattern named {family.name!r} is already registered (pass replace=True)")
            self._families[family.name] = family
        return family

    def remove(self, name: str) -> None:
        with self._lock:
            self._families.pop(name, None)

    def get(self, name: str) -> PatternFamily:
        return self._families[name]

    def names(self) -> set[str]:
        return set(self._families)

    def families(self) -> list[PatternFamily]:
        return list(self._families.values())

    def enabled(self, pattern_enabled: Callable[..., bool]) -> list[PatternFamily]:
        return [f for f in self.families() if pattern_enabled(f.name, f.tier, f.on_by_default)]

    def searched(self, options) -> list[PatternFamily]:
        """The families the fuse pass looks for under ``options`` (an ``Options``): the enabled ones; in tier
        lossless only the exact ones, in tier high all but the ``lossless_only`` ones."""
        fams = self.enabled(options.pattern_enabled)
        if options.quality == "lossless":
            return [f for f in fams if f.tier == "lossless"]
        return [f for f in fams if not f.lossless_only]

    def by_anchor(self, families: Iterable[PatternFamily]) -> dict[object, list[PatternFamily]]:
        table: dict[object, list[PatternFamily]] = {}
        for fam in sorted(families, key=lambda f: -getattr(f, "priority", 0)):
            for anchor in fam.anchors:
                table.setdefault(anchor, []).append(fam)
        return table


REGISTRY = Registry()


def register_family(cls: type[PatternFamily]) -> type[PatternFamily]:
    """Class decorator: instantiate a built-in family and add it to the registry."""
    REGISTRY.add(cls())
    return cls
