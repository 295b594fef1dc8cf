"""CUDA graphs for the lossless tier: verify eagerly first, then capture and replay.

``mode="reduce-overhead"`` (or ``"max-autotune"``, as in Inductor) or ``options={"cudagraphs": True}``
(torch.compile takes ``mode`` or ``options``, not both) hands each verified ATen graph to
cudagraph trees (``torch._inductor.cudagraph_trees``) through Inductor's own lazy
``compile_fx.cudagraphify``: the path Inductor's reduce-overhead takes for its compiled graphs
and torch's ``cudagraphs`` dynamo backend (torch/_dynamo/backends/cudagraphs.py) for AOT graphs.

- Verification first: the first call of a new input signature runs the verifier eagerly,
  outside the tree (``VerifiedGraph``); the tree never sees that call, so nothing is ever
  verified during a capture. Later calls of that signature go to the tree: one warm-up run
  (eager, in the tree's memory pool: the Triton kernels of those layouts get compiled there),
  one recording, then replays. A new signature of a dynamic-shape graph (a resolution change)
  is verified eagerly, then recorded as another graph of the tree.
- Static inputs are the parameters and buffers: AOTAutograd's ``static_input_indices``, what
  Inductor passes. (torch's ``cudagraphs`` backend passes ``range(num_fixed)``, which is empty
  when Dynamo inlines nn modules and would copy every weight before each replay.) A static
  input found at a new address re-records. Every other input is copied into the graph's own
  input buffers before each replay: inputs changed in place between calls are seen.
- Outputs live in the tree's memory pool and are overwritten by the next run: each call of a
  ``torch.compile``'d function starts a new generation. Clone what you keep across calls. An
  overwritten output then holds the later call's values, or raises when read where torch marked
  it (after a recording). This is ``torch.compile(mode="reduce-overhead")``'s contract, unchanged.
- Not applied, logged, noted in the report and counted in torch's ``cudagraph_skips`` (the
  graph then runs as without CUDA graphs): CPU tensors anywhere in the graph (so CPU models
  run plainly), several devices, ops torch marks cudagraph-unsafe or with data-dependent
  shapes, inputs other than parameters and buffers that the graph writes in place (torch's
  ``cudagraphs`` backend skips those too), and grad-enabled (training) graphs.

The ``diffusion_fuse`` ops are capture-safe: ``kernels/launch.CachedLaunch`` launches on the
current stream (Triton's driver asks torch for it), outputs come from ``torch.empty`` (the
graph's pool during a capture), a planned launch never synchronizes with the host, and the
kernels need no Triton scratch memory (tests/kernels/test_compile_sm90.py). Planning a new
layout may compile the kernel or probe the device (the FP8 NaN-sign check reads a value back):
the warm-up run plans every layout, and one first seen inside a capture takes the reference
path there (``lowering/dispatch.py``, counted as a fallback). The Python-side counters (kernel
hits, fallbacks) count the calls that ran Python: verification, warm-up, recording, not replays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.fx as fx
from torch._functorch.aot_autograd import make_boxed_func

from .log import get_logger
from .verify.report import GraphReport
from .verify.verifier import VerifiedGraph

_log = get_logger("backend")


def static_input_indices(n_dynamo_inputs: int, n_graph_inputs: int) -> list[int]:
    """Indices of the AOT graph's inputs with fixed addresses (parameters, buffers), as Inductor picks them."""
    from torch._inductor.compile_fx import get_static_input_idxs
    from torch._inductor.utils import num_fw_fixed_arguments

    return list(get_static_input_idxs(num_fw_fixed_arguments(n_dynamo_inputs, n_graph_inputs)))


def skip_reason(gm: fx.GraphModule, static_idxs: Sequence[int]) -> str | None:
    """Why ``gm`` cannot run under CUDA graphs (torch's own checks and wording), or None."""
    from torch._dynamo.backends.cudagraphs import find_input_mutations, get_device_node_mapping
    from torch._inductor.cudagraph_utils import (
        check_multiple_devices_or_any_cpu_nodes,
        format_default_skip_message,
        get_mutation_stack_trace,
        get_placeholder_info,
    )
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    mutated = find_input_mutations(gm.graph) - set(static_idxs)
    if mutated:
        return get_mutation_stack_trace(get_placeholder_info(gm.graph), mutated)
    reason = check_multiple_devices_or_any_cpu_nodes(get_device_node_mapping(gm))
    if reason:
        return reason
    node = get_first_incompatible_cudagraph_node(gm)
    return format_default_skip_message(f"incompatible op ({node.name})") if node is not None else None


class CudaGraphedGraph:
    """The boxed callable of one lossless graph under CUDA graphs: verifier first, then the tree."""

    _boxed_call = True

    def __init__(self, vg: VerifiedGraph, gm: fx.GraphModule, static_idxs: Sequence[int]) -> None:
        from torch._dynamo.backends.cudagraphs import find_input_mutations, get_device_index, get_stack_traces
        from torch._inductor.compile_fx import cudagraphify
        from torch._inductor.cudagraph_utils import get_placeholder_info

        self.vg = vg
        # Lazy, as in Inductor: the tree is made on its first call, from real inputs.
        self.tree = cudagraphify(self._run_verified, list(static_idxs), device_index=get_device_index(gm),
                                 stack_traces=get_stack_traces(gm), is_backward=False, is_inference=True,
                                 placeholders=get_placeholder_info(gm.graph),
                                 mutated_input_idxs=tuple(sorted(find_input_mutations(gm.graph))))

    def _run_verified(self, args: list[Any]) -> Any:
        # Boxed calling convention: the callee takes the inputs out of the caller's list (the
        # tree checks that it did), so they can be freed as the graph runs.
        inputs = list(args)
        args.clear()
        return self.vg(*inputs)

    def __call__(self, args: list[Any]) -> Any:
        if self.vg.needs_verification(args):
            return self._run_verified(args)
        return self.tree(args)


def with_cuda_graphs(vg: VerifiedGraph, gm: fx.GraphModule, n_dynamo_inputs: int, graph_inputs: Sequence[Any],
                     greport: GraphReport):
    """``vg`` under CUDA graphs when ``gm`` allows it; else ``vg`` as it is, with the reason logged and reported."""
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    static_idxs = static_input_indices(n_dynamo_inputs, len(graph_inputs))
    reason = skip_reason(gm, static_idxs)
    if reason is not None:
        log_cudagraph_skip_and_bump_counter(reason)  # torch's counter; raises under cudagraph_or_error
        first_line = reason.split(". Found from")[0].splitlines()[0]
        _log.info("graph %d: CUDA graphs not applied (%s); running without", greport.graph_id, first_line)
        greport.cudagraphs = f"not applied: {first_line}"
        greport.notes.append(f"CUDA graphs not applied ({first_line}); the graph runs without")
        return make_boxed_func(vg)
    greport.cudagraphs = "on"
    greport.notes.append(f"CUDA graphs on: verified eagerly per input signature, then run by cudagraph trees "
                         f"({len(static_idxs)} static inputs: parameters and buffers)")
    _log.info("graph %d: CUDA graphs on (%d static inputs)", greport.graph_id, len(static_idxs))
    return CudaGraphedGraph(vg, gm, static_idxs)
