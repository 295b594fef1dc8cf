"""Property-based tests: random shapes, strides, dtypes and ATen spellings through the backend.

Whatever the input, the compiled model equals eager bitwise (on the CPU every op runs its
reference path, so a mismatch here is a matcher or rewrite bug), and every site the
matcher takes is kept. Fixed example budget and a derandomized seed, so CI is deterministic.
"""

from __future__ import annotations

import pytest
import torch
from helpers import bitwise_equal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import diffusion_fuse

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


class Modulated(torch.nn.Module):
    def __init__(self, form: dict) -> None:
        super().__init__()
        self.form = form
        D = form["D"]
        self.norm = torch.nn.LayerNorm(D, elementwise_affine=form["affine"], eps=form["eps"])
        if form["affine"]:
            with torch.no_grad():
                self.norm.weight.normal_()
                self.norm.bias.normal_()
            self.norm.to(torch.float32 if form["wan"] else form["dtype"])

    def forward(self, x, scale, shift, residual, gate):
        f = self.form
        if f["gated"]:
            x = residual + gate.unsqueeze(1) * x if f["gate_unsqueeze"] else residual + x * gate
        y = self.norm(x.float()) if f["wan"] else self.norm(x)
        if f["scale_form"] == "add_before_unsqueeze":
            t = (scale + 1).unsqueeze(1)
        elif f["scale_form"] == "add_after_unsqueeze":
            t = 1 + scale.unsqueeze(1)
        else:  # per_token or already [B,1,D]
            t = 1 + scale
        y = t * y if f["swapped"] else y * t
        if f["shift"]:
            y = y + (shift.unsqueeze(1) if f["scale_form"] in ("add_before_unsqueeze", "add_after_unsqueeze")
                     else shift)
        return y.type_as(x) if f["wan"] else y


@st.composite
def forms(draw):
    dtype = draw(st.sampled_from(DTYPES))
    f = dict(
        B=draw(st.sampled_from([1, 2])), S=draw(st.sampled_from([0, 1, 3, 17])), D=draw(st.sampled_from([4, 30, 64])),
        dtype=dtype, eps=draw(st.sampled_from([1e-6, 1e-5])), affine=draw(st.booleans()),
        wan=draw(st.booleans()), gated=draw(st.booleans()), gate_unsqueeze=draw(st.booleans()),
        scale_form=draw(st.sampled_from(["add_before_unsqueeze", "add_after_unsqueeze", "b1d", "per_token"])),
        swapped=draw(st.booleans()), shift=draw(st.booleans()),
        layout=draw(st.sampled_from(["contiguous", "strided_rows", "transposed"])),
        amp=draw(st.sampled_from([1e-4, 1.0, 100.0])),
    )
    return f


def make_inputs(f, seed=0):
    g = torch.Generator().manual_seed(seed)
    B, S, D, dt = f["B"], f["S"], f["D"], f["dtype"]
    mod_dt = torch.float32 if f["wan"] else dt

    def rn(*shape, dtype=dt):
        return (torch.randn(*shape, generator=g) * f["amp"]).to(dtype)

    if f["layout"] == "strided_rows":
        x = rn(B, S, D + 3)[..., 1:D + 1]
    elif f["layout"] == "transposed":
        x = rn(B, D, S).transpose(1, 2)
    else:
        x = rn(B, S, D)
    shape = {"add_before_unsqueeze": (B, D), "add_after_unsqueeze": (B, D), "b1d": (B, 1, D),
             "per_token": (B, S, D)}[f["scale_form"]]
    scale, shift = rn(*shape, dtype=mod_dt), rn(*shape, dtype=mod_dt)
    residual = rn(B, S, D)
    gate = rn(B, D) if f["gate_unsqueeze"] else rn(B, 1, D)
    return x, scale, shift, residual, gate


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(forms())
def test_compiled_equals_eager_for_any_form(form):
    torch._dynamo.reset()
    model = Modulated(form)
    args = make_inputs(form)
    report = diffusion_fuse.Report()
    c = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)
    with torch.no_grad():
        ref = model(*args)
        out = c(*args)
    assert bitwise_equal(ref, out), form
    assert all(s.status == "kept" for s in report.sites()), report.table()


@pytest.mark.parametrize("scale_form", ["add_before_unsqueeze", "add_after_unsqueeze", "b1d", "per_token"])
@pytest.mark.parametrize("gated", [False, True])
def test_every_supported_spelling_is_matched(scale_form, gated):
    form = dict(B=2, S=5, D=64, dtype=torch.bfloat16, eps=1e-6, affine=False, wan=False, gated=gated,
                gate_unsqueeze=True, scale_form=scale_form, swapped=scale_form == "b1d", shift=True,
                layout="contiguous", amp=1.0)
    torch._dynamo.reset()
    model = Modulated(form)
    report = diffusion_fuse.Report()
    c = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)
    args = make_inputs(form)
    with torch.no_grad():
        assert bitwise_equal(model(*args), c(*args))
    family = "gated_residual_norm_modulate" if gated else "norm_modulate"
    assert report.count(family, status="kept") == 1, report.table()
