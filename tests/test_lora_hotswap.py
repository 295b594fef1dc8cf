"""LoRA hot-swap on a transformer compiled with ``backend="diffusion_fuse"``: no recompile, eager's bits.

diffusers' recipe: ``enable_lora_hotswap(target_rank=...)``, load the first adapter, ``torch.compile``, then load
the next adapters with ``hotswap=True``. peft pads every adapter to ``target_rank`` and keeps the scalings as
tensors, so a swap changes the values of the compiled graph's inputs, not the graph. Here, on tiny FLUX (through
``FluxPipeline.load_lora_weights``) and tiny Wan 2.1 (through the transformer's ``load_lora_adapter``), with random
adapters on every linear saved with safetensors as diffusers saves them (rank and alpha in the file's
``lora_adapter_metadata``): adapter A (rank 4, alpha 8), then B (rank 8, alpha 4), then A again. Every swap runs
under ``torch._dynamo.config.error_on_recompile`` and the backend compiles one graph in all; each output is bitwise
equal to eager with the same adapter, and the adapters change the output (they are in the graph that runs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import bitwise_equal
from safetensors.torch import save_file

import diffusion_fuse
from diffusion_fuse.testing.tiny_models import build

DTYPE = torch.bfloat16
TARGET_RANK = 8
ADAPTERS = {"a": (4, 8.0), "b": (8, 4.0)}  # name -> (rank, alpha)


def save_lora(model: torch.nn.Module, path: Path, rank: int, alpha: float, seed: int) -> Path:
    """Random LoRA factors for every linear of ``model``, in diffusers' file layout (``transformer.`` keys)."""
    g = torch.Generator().manual_seed(seed)
    tensors, targets = {}, []
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            tensors[f"transformer.{name}.lora_A.weight"] = (torch.randn(rank, m.in_features, generator=g) / 4).to(DTYPE)
            tensors[f"transformer.{name}.lora_B.weight"] = (torch.randn(m.out_features, rank, generator=g) / 4).to(
                DTYPE)
            targets.append(name)
    config = {"transformer.r": rank, "transformer.lora_alpha": alpha, "transformer.target_modules": targets}
    save_file(tensors, str(path), metadata={"format": "pt", "lora_adapter_metadata": json.dumps(config)})
    return path


def flux_pipeline(transformer):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=None, text_encoder=None, tokenizer=None,
                        text_encoder_2=None, tokenizer_2=None, transformer=transformer)


def loader(name: str, model: torch.nn.Module):
    """(enable_lora_hotswap, load(path, hotswap)) through the pipeline (FLUX) or the transformer (Wan)."""
    if name == "flux":
        pipe = flux_pipeline(model)

        def load(path: Path, hotswap: bool) -> None:
            pipe.load_lora_weights(str(path.parent), weight_name=path.name, adapter_name="style", hotswap=hotswap)

        return pipe.enable_lora_hotswap, load

    def load(path: Path, hotswap: bool) -> None:
        model.load_lora_adapter(str(path.parent), weight_name=path.name, prefix="transformer", adapter_name="style",
                                hotswap=hotswap)

    return model.enable_lora_hotswap, load


def run(model, kwargs):
    with torch.no_grad():
        return model(**kwargs)


@pytest.mark.parametrize("name", ["flux", "wan21"])
def test_hotswapped_adapters_recompile_nothing_and_give_eagers_bits(name, tmp_path):
    model, kwargs = build(name, DTYPE)
    base = run(model, kwargs)
    files = {k: save_lora(model, tmp_path / f"{k}.safetensors", r, alpha, seed)
             for seed, (k, (r, alpha)) in enumerate(ADAPTERS.items(), 1)}
    enable_hotswap, load = loader(name, model)
    enable_hotswap(target_rank=TARGET_RANK)
    load(files["a"], hotswap=False)
    eager_a = run(model, kwargs)

    report = diffusion_fuse.process_report()  # every compile's graphs (last_report() is one compile's)
    n_graphs = len(report.graphs)
    compiled = torch.compile(model, backend="diffusion_fuse")
    got = {"a": run(compiled, kwargs)}
    with torch._dynamo.config.patch(error_on_recompile=True):
        load(files["b"], hotswap=True)
        got["b"] = run(compiled, kwargs)
        eager_b = run(model, kwargs)
        load(files["a"], hotswap=True)
        got["a again"] = run(compiled, kwargs)

    graphs = report.graphs[n_graphs:]
    assert len(graphs) == 1, f"{len(graphs)} graphs compiled"
    sites = list(graphs[0].sites.values())
    assert sites and all(s.status == "kept" for s in sites), report.table()
    # the adapters act, and the swap took
    assert not bitwise_equal(base, eager_a) and not bitwise_equal(eager_a, eager_b)
    assert bitwise_equal(eager_a, got["a"])
    assert bitwise_equal(eager_b, got["b"])
    assert bitwise_equal(eager_a, got["a again"])

