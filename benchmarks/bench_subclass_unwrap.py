"""Host cost of unwrapping tensor-subclass weights per call: AOTAutograd's unwrap vs diffusion_fuse/subclass_params.py.

The tiny FLUX with torchao's static FP8 recipe (30 Float8 weights, CPU): µs per call of
``runtime_unwrap_tensor_subclasses`` (what AOTAutograd runs before every call of a graph with subclass inputs)
against ``SubclassParams.unwrap`` (one getattr per inner tensor, what the backend runs instead).

    PYTHONPATH=.venv/torchao:. python benchmarks/bench_subclass_unwrap.py
"""

from __future__ import annotations

import time

import torch
from torch._functorch._aot_autograd.subclass_utils import create_subclass_meta, runtime_unwrap_tensor_subclasses
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from diffusion_fuse.subclass_params import SubclassParams, SubclassSpec
from diffusion_fuse.testing.fp8 import quantize_linears_torchao
from diffusion_fuse.testing.tiny_models import build


def per_call_us(fn, n: int = 2000) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    model, kwargs = build("flux", torch.bfloat16, "cpu")
    quantize_linears_torchao(model, kwargs)
    weights = [p for p in model.parameters() if is_traceable_wrapper_subclass(p)]
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    metas = create_subclass_meta([fake_mode.from_tensor(w) for w in weights])
    ours = SubclassParams([SubclassSpec.of(w) for w in weights])
    aot = per_call_us(lambda: runtime_unwrap_tensor_subclasses(weights, subclass_metas=metas, append_symints=True))
    mine = per_call_us(lambda: ours.unwrap(weights))
    n = len(weights)
    print(f"{n} {type(weights[0]).__name__} weights: AOTAutograd's runtime unwrap {aot:.1f} us per call "
          f"({aot / n:.2f} us each); diffusion_fuse's {mine:.1f} us ({mine / n:.2f} us each)")


if __name__ == "__main__":
    main()
