"""The census: what the lossless tier makes of each model of the diffusers zoo (testing/zoo.py).

    python -m diffusion_fuse census [--models a,b] [--dtype bf16|fp32] [--json F]

Per model: the sites each family (``diffusion_fuse.patterns.REGISTRY``) rewrote and the verifier kept, and the
eager ATen ops left unfused: the calls of the graph that runs after verification (``GraphReport.final_ops``) that
are no GEMM, attention or convolution and none of this package's ops, grouped by op. Views (ops whose output
aliases an input: no kernel, no data moved) are counted apart from the ops that compute.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from tabulate import tabulate

from .log import error_message, get_logger

__all__ = ["ModelCensus", "census", "classify", "format_table", "run_model"]

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
_log = get_logger("census")

_GEMM = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv", "dot", "_scaled_mm"}
_NO_COPY = {"_unsafe_view"}  # a view its schema does not annotate as one (the output of a reshape's copy)


def _overload(name: str) -> Any:
    """The op object of ``aten.view.default``-style names, or None."""
    obj: Any = torch.ops
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def classify(name: str) -> str:
    """``ours`` | ``gemm`` | ``attention`` | ``convolution`` | ``view`` | ``eager`` (an ATen op that computes a
    tensor) | ``other`` (no tensor computed: getitem, size queries, symbolic arithmetic) for an op's
    ``target_name``."""
    namespace, _, rest = name.partition(".")
    base = rest.split(".")[0]
    if namespace == "diffusion_fuse":
        return "ours"
    if "attention" in name:
        return "attention"
    schema = getattr(_overload(name), "_schema", None) if namespace in ("aten", "prims") else None
    if schema is None or not any("Tensor" in str(r.type) for r in schema.returns):
        return "other"
    if base in _GEMM:
        return "gemm"
    if "convolution" in base or base.startswith("conv"):
        return "convolution"
    if base in _NO_COPY or any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        return "view"
    return "eager"


@dataclasses.dataclass
class ModelCensus:
    name: str
    dtype: str
    bitwise: bool  # the compiled output equals eager's
    graphs: int
    kept: dict[str, int]  # family: sites kept
    rejected: int  # sites the verifier put back
    eager_ops: dict[str, int]  # op: calls, ops that compute
    views: dict[str, int]  # op: calls, views
    classes: dict[str, int]  # classify(op): calls, every call of the graphs that run
    error: str = ""  # what raised where the model did not run ("eager raised ..." | "compiled raised ...")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def from_report(name: str, dtype: str, report: Any, bitwise: bool) -> ModelCensus:
    """The census of one model from the ``Report`` of its compiled call."""
    kept = Counter(s.pattern for s in report.sites("kept"))
    calls: Counter[str] = Counter()
    for g in report.graphs:
        calls.update(g.final_ops)
    by_class: Counter[str] = Counter()
    eager: Counter[str] = Counter()
    views: Counter[str] = Counter()
    for op, n in calls.items():
        c = classify(op)
        by_class[c] += n
        if c == "eager":
            eager[op] += n
        elif c == "view":
            views[op] += n
    return ModelCensus(name, dtype, bitwise, len(report.graphs), dict(kept), len(report.sites("rejected")),
                       dict(eager.most_common()), dict(views.most_common()), dict(by_class))


def run_model(name: str, dtype: str = "bf16", seed: int = 0) -> tuple[ModelCensus, Any]:
    """Build zoo model ``name``, run it eagerly and compiled (lossless, verified); its census and the Report."""
    from . import DiffusionFuseBackend, Report
    from .testing.zoo import ZOO
    from .verify.compare import compare_bitwise

    entry = ZOO[name]
    model, kwargs = entry.build(DTYPES[dtype], seed=seed)
    report = Report()
    compiled = torch.compile(model, backend=DiffusionFuseBackend(None, report), fullgraph=entry.fullgraph)
    with torch.no_grad():
        try:
            ref = model(**kwargs)
        except Exception as e:  # noqa: BLE001 - the model itself does not run: a row that says so
            return _failed(name, dtype, f"eager raised {error_message(e)}"), report
        try:
            out = compiled(**kwargs)
        except Exception as e:  # noqa: BLE001 - a row that says so, and a failed exit status
            return _failed(name, dtype, f"compiled raised {error_message(e)}"), report
    bitwise = bool(compare_bitwise(list(ref) if isinstance(ref, tuple) else ref,
                                   list(out) if isinstance(out, tuple) else out))
    return from_report(name, dtype, report, bitwise), report


def _failed(name: str, dtype: str, error: str) -> ModelCensus:
    _log.warning("census: %s (%s): %s", name, dtype, error)
    return ModelCensus(name, dtype, False, 0, {}, 0, {}, {}, {}, error)


def census(names: Iterable[str], dtype: str = "bf16") -> list[ModelCensus]:
    """``run_model`` for each name, Dynamo's caches reset between models."""
    rows = []
    for name in names:
        torch._dynamo.reset()
        rows.append(run_model(name, dtype)[0])
    torch._dynamo.reset()
    return rows


def _families(rows: Sequence[ModelCensus]) -> list[str]:
    """Registry families that kept a site in some model, in registry order, then any other family."""
    from .patterns import REGISTRY

    used = {f for r in rows for f in r.kept}
    order = [f.name for f in REGISTRY.families() if f.name in used]
    return order + sorted(used - set(order))


def format_table(rows: Sequence[ModelCensus]) -> str:
    """The census as tabulate tables: sites kept per family per model, then each model's unfused eager ops."""
    fams = _families(rows)
    head = ["model", "bitwise", *fams, "rejected", "eager ops left", "views"]
    body = [[r.name, "-" if r.error else "yes" if r.bitwise else "NO", *(r.kept.get(f, 0) for f in fams),
             r.rejected, sum(r.eager_ops.values()), sum(r.views.values())] for r in rows]
    out = [tabulate(body, headers=head)]
    failed = [f"{r.name}: {r.error}" for r in rows if r.error]
    if failed:
        out.append("not run:\n" + "\n".join(failed))
    for r in rows:
        if r.error:
            continue
        ops = [[op, n] for op, n in r.eager_ops.items()]
        title = (f"{r.name} ({r.dtype}): {sum(r.eager_ops.values())} eager op calls left unfused, "
                 f"{len(r.eager_ops)} kinds (and {sum(r.views.values())} view calls)")
        out.append(title + ("\n" + tabulate(ops, headers=["ATen op", "calls"]) if ops else ""))
    return "\n\n".join(out)


def save_json(rows: Sequence[ModelCensus], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"models": [r.to_dict() for r in rows]}, f, indent=2)
        f.write("\n")
