"""fxpasses/scalar_fill.py: the traced graph's fills from 0-dim CPU constants are fills with their values."""

from __future__ import annotations

import pytest
import torch
from helpers import bitwise_equal, compile_and_run

aten = torch.ops.aten


class PositionIds(torch.nn.Module):
    """Lumina-Image-2.0's position ids: Python numbers written into slices of an int32 tensor, then used."""

    def forward(self, x: torch.Tensor, cap_len: int) -> torch.Tensor:
        ids = torch.zeros(x.shape[0], x.shape[1], 3, dtype=torch.int32, device=x.device)
        ids[:, cap_len:, 0] = cap_len
        ids[:, :cap_len, 1] = -3
        return x * ids.sum(-1, keepdim=True).to(x.dtype)


def _fills(gm) -> dict:
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    return {"tensor": sum(n.target is aten.fill.Tensor for n in nodes),
            "scalar": sum(n.target is aten.fill.Scalar for n in nodes),
            "constants": sum(n.op == "get_attr" for n in gm.graph.nodes)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fills_from_python_numbers_take_no_cpu_constant_and_equal_eager(dtype):
    captured = {}

    def keep(gm, _inputs):  # the traced graph, as the backend gets it
        captured.setdefault("traced", _fills(gm))
        return gm.forward

    from torch._dynamo.backends.common import aot_autograd

    x = torch.randn(2, 6, 4).to(dtype)
    with torch.no_grad():
        torch.compile(PositionIds(), backend=aot_autograd(fw_compiler=keep), fullgraph=True)(x, 2)
    assert captured["traced"]["tensor"] == 2 and captured["traced"]["constants"] == 2, captured  # the form

    torch._dynamo.reset()
    ref, out, report = compile_and_run(PositionIds(), {"x": x, "cap_len": 2})
    assert bitwise_equal(ref, out)
    notes = [n for g in report.graphs for n in g.notes if n.startswith("scalar_fill:")]
    assert len(notes) == 1 and "2 fill(s)" in notes[0], [n for g in report.graphs for n in g.notes]
    code = "\n".join(g.final_code for g in report.graphs)
    assert "fill.Tensor" not in code and "_tensor_constant" not in code and "lift_fresh_copy" not in code, code



def test_a_rewrite_that_raises_leaves_the_fills_as_traced(monkeypatch):
    import diffusion_fuse.backend as backend

    def broken(gm):
        raise RuntimeError("boom")

    monkeypatch.setattr(backend, "fill_scalars", broken)
    torch._dynamo.reset()
    ref, out, report = compile_and_run(PositionIds(), {"x": torch.randn(2, 6, 4), "cap_len": 2})
    assert bitwise_equal(ref, out)
    notes = [n for g in report.graphs for n in g.notes]
    assert any(n.startswith("scalar_fill raised RuntimeError: boom") for n in notes), notes


def test_a_constant_something_else_reads_stays():
    from diffusion_fuse.fxpasses.scalar_fill import fill_scalars

    c = torch.tensor(5, dtype=torch.int32)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c", c)

        def forward(self, x):
            return torch.ops.aten.fill.Tensor(x, self.c) + self.c

    gm = torch.fx.symbolic_trace(M())
    x = torch.zeros(3, dtype=torch.int32)
    assert fill_scalars(gm) and _fills(gm) == {"tensor": 0, "scalar": 1, "constants": 1}
    assert torch.equal(gm(x), M()(x))
