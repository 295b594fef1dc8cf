"""The graph that runs, readable: its code with, per rewritten site, the source files of the kernels its op launches.

``publish(gm, greport)`` is called once the graph that runs is chosen (after the verifier's first call, or at
compile time when nothing is verified). It records ``greport.kernel_sources`` ({site id: files}), logs the graph to
the ``diffusion_fuse_graphs`` artifact, writes it as a ``TORCH_TRACE`` artifact (``diffusion_fuse_graph_final``,
beside ``diffusion_fuse_report``) and, where ``DIFFUSION_FUSE_DUMP_DIR`` is set, as
``<dir>/graph_<compile id>_<graph id>.py``, a Python file whose comments name each op's kernel sources.

An op's kernel sources are the ``diffusion_fuse/kernels/`` modules its lowering module uses; a ``pointwise`` op's
are the files its generated kernels were written to (``kernels/pointwise.py``, one per input layout it ran with).
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import types

import torch.fx as fx

from ..log import artifact_logger, trace_artifact
from ..lowering import pointwise
from ..lowering.spec import BY_OVERLOAD, OpSpec
from .report import GraphReport

DUMP_ENV_VAR = "DIFFUSION_FUSE_DUMP_DIR"
_graphs = artifact_logger("verify", "diffusion_fuse_graphs")
_SKIP = {"diffusion_fuse.kernels", "diffusion_fuse.kernels.optional_triton", "diffusion_fuse.kernels.launch"}


def spec_kernel_files(spec: OpSpec) -> list[str]:
    """The files of the ``diffusion_fuse.kernels`` modules ``spec``'s lowering module uses."""
    module = sys.modules.get(spec.reference.__module__)
    names = set()
    for value in vars(module).values() if module is not None else ():
        name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
        if isinstance(name, str) and name.startswith("diffusion_fuse.kernels") and name not in _SKIP:
            names.add(name)
    files = []
    for name in sorted(names):
        try:
            files.append(inspect.getfile(sys.modules[name]))
        except (KeyError, TypeError):
            continue
    return files


def node_kernel_files(node: fx.Node) -> list[str]:
    spec = BY_OVERLOAD.get(node.target)
    if spec is None:
        return []
    if spec.name == "pointwise":
        key = node.args[1] if len(node.args) > 1 else node.kwargs.get("key")
        return sorted(pointwise.GENERATED.get(key, ()))
    return spec_kernel_files(spec)


def kernel_sources(gm: fx.GraphModule) -> dict[str, list[str]]:
    """{site id: the source files of the kernels its nodes' ops launch}, for the rewritten sites in ``gm``."""
    out: dict[str, list[str]] = {}
    for n in gm.graph.nodes:
        site = n.meta.get("diffusion_fuse_site")
        if n.op == "call_function" and site is not None and n.target in BY_OVERLOAD:
            files = out.setdefault(site, [])
            files.extend(f for f in node_kernel_files(n) if f not in files)
    return out


def graph_source(gm: fx.GraphModule, greport: GraphReport) -> str:
    """``gm``'s code as a Python file: a header naming the graph, then per site the kernel source files."""
    lines = [f'"""diffusion_fuse: the graph that runs, graph {greport.graph_id} (compile id '
             f'{greport.compile_id or "-"}, tier {greport.quality}).', "",
             "Rewritten sites (kept by the verifier) and the source files of their kernels:"]
    kept = {sid for sid, rec in greport.sites.items() if rec.status in ("kept", "unverified", "matched")}
    for sid, files in greport.kernel_sources.items():
        if sid not in kept:
            continue
        rec = greport.sites[sid]
        where = ", ".join(files) if files else "no kernel generated in this process (reference path)"
        lines.append(f"  {sid} -> {rec.after}: {where}")
    rejected = sorted(sid for sid, rec in greport.sites.items() if rec.status == "rejected")
    if rejected:
        lines.append("Put back by the verifier: " + ", ".join(rejected))
    lines.append('"""')
    by_name = {n.name: n for n in gm.graph.nodes}
    body = []
    for line in gm.code.splitlines():
        body.append(line)
        lhs = line.strip().split(" = ", 1)[0]
        node = by_name.get(lhs)
        if node is not None and node.op == "call_function" and node.target in BY_OVERLOAD:
            files = node_kernel_files(node)
            if files:
                indent = line[: len(line) - len(line.lstrip())]
                body.append(f"{indent}# kernel: {', '.join(files)}")
    return "\n".join(lines) + "\n\nimport torch\n" + "\n".join(body) + "\n"


def publish(gm: fx.GraphModule, greport: GraphReport) -> None:
    """Record, log, trace and (with ``DIFFUSION_FUSE_DUMP_DIR``) write the graph that runs (module docstring)."""
    greport.kernel_sources = kernel_sources(gm)
    source = None
    if _graphs.isEnabledFor(logging.DEBUG):
        source = graph_source(gm, greport)
        _graphs.debug("graph %d: the graph that runs:\n%s", greport.graph_id, source)
    trace_artifact("diffusion_fuse_graph_final", lambda: source or graph_source(gm, greport))
    directory = os.environ.get(DUMP_ENV_VAR)
    if directory:
        os.makedirs(directory, exist_ok=True)
        cid = (greport.compile_id or "none").replace("/", "_")
        path = os.path.join(directory, f"graph_{cid}_{greport.graph_id}.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(source or graph_source(gm, greport))
        greport.graph_file = path
