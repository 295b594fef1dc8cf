"""A small FP8-static linear layer, for examples and tests (no torchao needed).

``FP8StaticLinear`` is what a static FP8 recipe (ModelOpt-style, or torchao's
``Float8StaticActivationFloat8WeightConfig``) turns ``nn.Linear`` into: e4m3 weights with a
per-tensor weight scale, and a per-tensor *static* activation scale found by calibration.
Its forward quantizes the input the way those recipes write it::

    q = (x.float() / input_scale).clamp(-448, 448).to(torch.float8_e4m3fn)      # reciprocal=False
    q = (x.float() * (1 / input_scale)).clamp(-448, 448).to(torch.float8_e4m3fn) # reciprocal=True
    y = torch._scaled_mm(q.reshape(-1, K), weight.t(), scale_a=input_scale, scale_b=weight_scale,
                         bias=bias, out_dtype=x.dtype).reshape(*x.shape[:-1], N)

``torch._scaled_mm`` runs on CUDA with compute capability >= 8.9 and, in torch >= 2.13, on the
CPU too (CI). On CUDA it needs K and N to be multiples of 16; ``quantize_linears_fp8`` leaves
other linears as they are there.

    model, kwargs = tiny_models.build("flux")
    quantize_linears_fp8(model, kwargs)        # calibrate on one call, then swap in place
"""

from __future__ import annotations

from collections.abc import Callable

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448

__all__ = ["FP8StaticLinear", "quantize_linears_fp8", "quantize_linears_torchao", "FP8", "FP8_MAX"]


class FP8StaticLinear(torch.nn.Module):
    """``nn.Linear`` with e4m3 weights and a static per-tensor activation scale (see module docstring)."""

    def __init__(self, weight_fp8: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor,
                 bias: torch.Tensor | None, reciprocal: bool = False) -> None:
        super().__init__()
        self.out_features, self.in_features = weight_fp8.shape
        self.register_buffer("weight", weight_fp8)
        self.register_buffer("weight_scale", weight_scale)
        self.register_buffer("input_scale", input_scale)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        self.reciprocal = reciprocal

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, input_amax: float, reciprocal: bool = False) -> FP8StaticLinear:
        """Quantize ``linear``'s weight per tensor; the input scale maps ``input_amax`` to 448."""
        w = linear.weight.detach()
        w_scale = (w.float().abs().max() / FP8_MAX).clamp(min=1e-12).reshape(())
        w_fp8 = (w.float() / w_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        in_scale = torch.tensor(max(float(input_amax), 1e-6) / FP8_MAX, dtype=torch.float32, device=w.device)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(w_fp8, w_scale.to(torch.float32), in_scale, bias, reciprocal)

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        if self.reciprocal:
            return (x.float() * (1 / self.input_scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        return (x.float() / self.input_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.quantize_input(x)
        y = torch._scaled_mm(q.reshape(-1, self.in_features), self.weight.t(), scale_a=self.input_scale,
                             scale_b=self.weight_scale, bias=self.bias, out_dtype=x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"reciprocal={self.reciprocal}")


def _fits_scaled_mm(linear: torch.nn.Linear) -> bool:
    """cuBLASLt's FP8 GEMM takes K and N that are multiples of 16 (the CPU kernel takes any)."""
    return linear.weight.device.type != "cuda" or (linear.in_features % 16 == 0 and linear.out_features % 16 == 0)


def quantize_linears_fp8(model: torch.nn.Module, calibration_kwargs: dict, *, reciprocal: bool = False,
                         include: Callable[[str, torch.nn.Linear], bool] | None = None) -> list[str]:
    """Swap, in place, every ``nn.Linear`` of ``model`` for an ``FP8StaticLinear``; return the names swapped.

    Static calibration: one ``model(**calibration_kwargs)`` call records each linear's input
    amax. Linears with fp32 weights (Wan's ``_keep_in_fp32_modules``), those ``include(name,
    linear)`` refuses and, on CUDA, those whose K or N is not a multiple of 16 stay as they are.
    """
    chosen = {name: m for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and m.weight.dtype in (torch.bfloat16, torch.float16)
              and _fits_scaled_mm(m) and (include is None or include(name, m))}
    amax: dict[str, float] = {}

    def hook(name):
        def record(_mod, args):
            amax[name] = max(amax.get(name, 0.0), float(args[0].detach().float().abs().max()))
        return record

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in chosen.items()]
    try:
        with torch.no_grad():
            model(**calibration_kwargs)
    finally:
        for h in handles:
            h.remove()
    swapped = []
    for name, lin in chosen.items():
        if name not in amax:  # never called
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, FP8StaticLinear.from_linear(lin, amax[name], reciprocal))
        swapped.append(name)
    return swapped


def quantize_linears_torchao(model: torch.nn.Module, calibration_kwargs: dict) -> int:
    """torchao's own static FP8 recipe on ``model`` (torchao >= 0.18, its prototype observer flow): every
    ``nn.Linear`` ``torch._scaled_mm`` takes (K, N multiples of 16) gets a per-tensor activation observer,
    one calibration call, then e4m3 weights and a static activation scale. Returns how many were converted."""
    from torchao.prototype.quantization.quant_api import Float8StaticActivationFloat8WeightConfig
    from torchao.quantization import quantize_

    quantize_(model, Float8StaticActivationFloat8WeightConfig(step="prepare", set_inductor_config=False),
              filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and _fits_scaled_mm(m))
    with torch.no_grad():
        model(**calibration_kwargs)
    observed = sum(type(m).__name__ == "Float8ObservedLinear" for m in model.modules())
    quantize_(model, Float8StaticActivationFloat8WeightConfig(step="convert", set_inductor_config=False),
              filter_fn=lambda m, fqn: type(m).__name__ == "Float8ObservedLinear")
    return observed


def run_torchao_model(name: str, device: str = "cpu", calls: int = 1):
    """Tiny model ``name`` in bf16 with torchao's static FP8 recipe, eager and compiled (lossless):
    returns (linears quantized, eager output, compiled outputs of ``calls`` calls, report)."""
    import diffusion_fuse

    from .tiny_models import build

    model, kwargs = build(name, torch.bfloat16, device)
    n = quantize_linears_torchao(model, kwargs)
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
    with torch.no_grad():
        ref = model(**kwargs)[0]
        outs = [compiled(**kwargs)[0] for _ in range(calls)]
    return n, ref, outs, report


def torchao_check(name: str, device: str = "cpu") -> dict:
    """``run_torchao_model`` summarized as plain data (tests run it in a subprocess that can import torchao)."""
    n, ref, outs, report = run_torchao_model(name, device)
    kept = [s for s in report.sites() if s.status == "kept"]
    bits = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[ref.dtype]
    return {"linears": n, "equal": all(torch.equal(ref.view(bits), o.view(bits)) for o in outs),
            "sites": len(report.sites()), "kept": len(kept),
            "quantizers_fused": sum(s.before.count("clamp") for s in kept),
            "subclass_params_flattened": subclass_params_flattened(report)}


def subclass_params_flattened(report) -> int:
    """Tensor-subclass parameters the backend flattened at compile time (diffusion_fuse/subclass_params.py)."""
    import re

    return sum(int(m.group(1)) for g in report.graphs for note in g.notes
               if (m := re.match(r"(\d+) tensor-subclass parameters flattened", note)))
