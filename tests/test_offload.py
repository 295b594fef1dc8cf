"""Offloading with a transformer compiled by ``backend="diffusion_fuse"``: eager's bits with the same offload.

diffusers' offload hooks are ``torch.compiler.disable``d (accelerate's pre-forward for model CPU offload, group
offloading's onload and offload), so Dynamo breaks the graph there and the backend compiles the pieces between
them. On the CPU both devices are the CPU: the hooks run but move nothing (tests/gpu/test_offload_gpu.py moves the
weights between the CPU and the GPU). Each case builds the same tiny model twice with the same seed and the same
offload, runs one eagerly and the other compiled, and compares the outputs bit for bit:

- model CPU offload (``pipe.enable_model_cpu_offload``, accelerate's hooks), set before and after compiling;
- group offloading per block through the pipeline (``pipe.enable_group_offload(offload_type="block_level")``);
- group offloading per leaf module on the transformer (``apply_group_offloading(offload_type="leaf_level")``): a
  graph per leaf, past Dynamo's recompile limit for the shared hook frames, which then run eagerly.
"""

from __future__ import annotations

import pytest
import torch
from helpers import bitwise_equal

import diffusion_fuse
from diffusion_fuse.testing.tiny_models import build

DTYPE = torch.bfloat16
CPU = torch.device("cpu")


def flux_pipeline():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    transformer, _ = build("flux", DTYPE)
    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=None, text_encoder=None, tokenizer=None,
                        text_encoder_2=None, tokenizer_2=None, transformer=transformer)


def generate(pipe) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    prompt_embeds = torch.randn(1, 8, 32, generator=g).to(DTYPE)
    pooled = torch.randn(1, 32, generator=g).to(DTYPE)
    with torch.no_grad():
        return pipe(prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled, height=32, width=32,
                    num_inference_steps=2, guidance_scale=3.5, output_type="latent",
                    generator=torch.Generator().manual_seed(1)).images


def compiled_graphs(run) -> tuple[object, list]:
    """``run()``'s result and the graphs the backend compiled meanwhile."""
    report = diffusion_fuse.process_report()  # every compile's graphs (last_report() is one compile's)
    n = len(report.graphs)
    out = run()
    return out, report.graphs[n:]


def check(graphs: list) -> None:
    sites = [s for g in graphs for s in g.sites.values()]
    assert graphs and sites, "nothing was compiled by diffusion_fuse"
    assert all(s.status == "kept" for s in sites), [(s.id, s.status, s.reason) for s in sites]


def model_cpu_offload(pipe) -> None:
    pipe.enable_model_cpu_offload(device="cpu")
    assert pipe._all_hooks


@pytest.mark.parametrize("order", ["offload_then_compile", "compile_then_offload"])
def test_model_cpu_offload(order):
    eager = flux_pipeline()
    model_cpu_offload(eager)
    ref = generate(eager)

    pipe = flux_pipeline()
    if order == "offload_then_compile":
        model_cpu_offload(pipe)
        pipe.transformer = torch.compile(pipe.transformer, backend="diffusion_fuse")
    else:
        pipe.transformer = torch.compile(pipe.transformer, backend="diffusion_fuse")
        model_cpu_offload(pipe)
    out, graphs = compiled_graphs(lambda: generate(pipe))
    check(graphs)
    assert bitwise_equal(ref, out)
    assert bitwise_equal(ref, generate(pipe))


def group_offload_blocks(pipe) -> None:
    from diffusers.hooks.group_offloading import _is_group_offload_enabled

    pipe.enable_group_offload(onload_device=CPU, offload_device=CPU, offload_type="block_level",
                              num_blocks_per_group=1)
    assert _is_group_offload_enabled(pipe.transformer)


def test_group_offload_per_block_through_the_pipeline():
    eager = flux_pipeline()
    group_offload_blocks(eager)
    ref = generate(eager)

    pipe = flux_pipeline()
    group_offload_blocks(pipe)
    pipe.transformer = torch.compile(pipe.transformer, backend="diffusion_fuse")
    out, graphs = compiled_graphs(lambda: generate(pipe))
    check(graphs)
    assert len(graphs) > 1  # the graph breaks at the onload / offload hooks
    assert bitwise_equal(ref, out)


def test_group_offload_per_leaf_on_the_transformer():
    from diffusers.hooks import apply_group_offloading

    def offloaded():
        model, kwargs = build("wan21", DTYPE)
        apply_group_offloading(model, onload_device=CPU, offload_device=CPU, offload_type="leaf_level")
        return model, kwargs

    model, kwargs = offloaded()
    with torch.no_grad():
        ref = model(**kwargs)
    model, kwargs = offloaded()
    compiled = torch.compile(model, backend="diffusion_fuse")
    with torch.no_grad():
        out, graphs = compiled_graphs(lambda: compiled(**kwargs))
        again = compiled(**kwargs)
    check(graphs)
    assert bitwise_equal(ref, out) and bitwise_equal(ref, again)
