"""diffusion_fuse::gated_residual_norm_modulate on CUDA: bitwise equal to eager's ATen chain.

Both outputs (the new residual r and the modulated LN of r) are compared as int views with
``gated_residual_norm_modulate`` (the chain eager runs), over D in {64, 1000, 1536,
2240, 3072, 5120, 6144}, rows 1..4096 (and FLUX's 4608 at D=3072), batch 1 and 2, amplitudes
1e-4/1/100, gates and scales with exact -1, 0, 1 and -0.0, bf16/fp16/fp32, affine or not.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from diffusion_fuse.lowering.gated_residual_norm_modulate import (  # noqa: E402
    SPEC,
    can_use_gated_residual_norm_modulate,
    gated_residual_norm_modulate,
)

DIMS = (64, 1000, 1536, 2240, 3072, 5120, 6144)


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def make(B, S, D, dtype, amp, seed, affine=False, special=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
    res = (rn(B, S, D) * amp * 4).to(dtype)
    x = (rn(B, S, D) * amp).to(dtype)
    gate, sc, sh = (rn(B, 1, D).to(dtype) for _ in range(3))
    if special:
        vals = torch.tensor([-1.0, 0.0, 1.0, -0.0], device="cuda", dtype=dtype)
        gate[..., :4] = vals
        sc[..., 4:8] = vals
        sh[..., 8:12] = vals
    w = (1 + 0.3 * rn(D)).to(dtype) if affine else None
    b = (0.1 * rn(D)).to(dtype) if affine else None
    return res, x, gate, w, b, 1e-6, sc, sh, None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("D", DIMS)
def test_bit_exact_matrix(D, dtype):
    bad = []
    for B, S in ((1, 1), (2, 7), (1, 4096)):
        for amp in (1e-4, 1.0, 100.0):
            for affine in (False, True):
                for special in (False, True):
                    args = make(B, S, D, dtype, amp, seed=D + S, affine=affine, special=special)
                    assert can_use_gated_residual_norm_modulate(SPEC.bind(args))[0]
                    ref = gated_residual_norm_modulate(*args)
                    got = SPEC.run_kernel(*args)
                    nd = [int((_bits(a) != _bits(b)).sum()) for a, b in zip(ref, got)]
                    if any(nd):
                        bad.append((B, S, amp, affine, special, nd))
    assert not bad, f"D={D} {dtype}: (B, S, amp, affine, special, [r, out] ndiff) {bad[:6]}"


def test_flux_shape_and_repeated_op_calls():
    for seed in range(3):
        args = make(1, 4608, 3072, torch.bfloat16, 1.0, seed)
        ref = gated_residual_norm_modulate(*args)
        got = torch.ops.diffusion_fuse.gated_residual_norm_modulate(*args)
        assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(ref, got))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_unit_gate_gives_the_ungated_residual(dtype):
    """patterns/gated_residual.py's UnitGate: ``residual + x`` (signed zeros and subnormals in x), then an fp32
    LayerNorm and modulate cast back (Wan's cross-attention residual and norm3), against the eager chain."""
    for D in (1536, 3072, 5120):
        res, x, _, _, _, eps, sc, sh, _ = make(2, 4096, D, dtype, 1.0, seed=D)  # a [1, 1, D] gate over batch 2
        # eager's sums -0.0, +0.0 and the subnormal itself: a kernel losing a zero's sign or flushing would differ
        res[..., :3] = torch.tensor([-0.0, 0.0, 0.0], dtype=dtype)
        x[..., :3] = torch.tensor([-0.0, -0.0, torch.finfo(dtype).smallest_normal / 4], dtype=dtype)
        w, b, sc, sh = (1 + 0.3 * torch.randn(D, device="cuda")), 0.1 * torch.randn(D, device="cuda"), sc.float(), \
            sh.float()
        r_eager = res + x
        ln = torch.nn.functional.layer_norm(r_eager.float(), (D,), w, b, eps)
        out_eager = (ln * (1 + sc) + sh).to(dtype)
        args = (res, x, torch.ones(1, 1, D, dtype=dtype, device="cuda"), w, b, eps, sc, sh, dtype,
                None, None, None, None, torch.float32)
        assert can_use_gated_residual_norm_modulate(SPEC.bind(args))[0]
        r, out = SPEC.run_kernel(*args)
        assert torch.equal(_bits(r), _bits(r_eager)) and torch.equal(_bits(out), _bits(out_eager)), (D, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_d_major_residual_takes_the_tile_kernel_and_keeps_eagers_layout(dtype):
    """A patch embedding's ``flatten(2).transpose(1, 2)`` tokens as the residual: the op and the standalone
    ``gated_residual``, through the dispatcher, give eager's bits and eager's ``r`` layout (D-major, or row-major
    when ``gate * x`` comes first), with one gate row or one gate per token, and the kernels run. S of 1000 and D of
    1000 leave partial tiles (and S unspecialized: scalar token-major accesses)."""
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.lowering.gated_residual import gated_residual

    bad = []
    for D, S in ((3072, 4096), (1152, 1000), (1000, 256)):
        res, x, gate, _, _, eps, sc, sh, _ = make(2, S, D, dtype, 1.0, seed=S)
        res = res.transpose(1, 2).contiguous().transpose(1, 2)
        for gate_t in (gate, torch.randn_like(x)):
            for mul_first in (False, True):
                args = (res, x, gate_t, None, None, eps, sc, sh, None, None, None, None, None, None, mul_first)
                counters.reset()
                ref = gated_residual_norm_modulate(*args)
                got = torch.ops.diffusion_fuse.gated_residual_norm_modulate(*args)
                ref_r = gated_residual(res, x, gate_t, None, None, mul_first)
                got_r = torch.ops.diffusion_fuse.gated_residual(res, x, gate_t, None, None, mul_first)
                assert counters.snapshot()["kernel"] == {"gated_residual_norm_modulate": 1, "gated_residual": 1}, \
                    counters.snapshot()
                assert [t.stride() for t in got] == [t.stride() for t in ref], (D, mul_first)
                assert got_r.stride() == ref_r.stride() == ref[0].stride(), (D, mul_first)
                if not all(torch.equal(_bits(a), _bits(b)) for a, b in zip((*ref, ref_r), (*got, got_r))):
                    bad.append((D, S, gate_t.shape, mul_first))
    assert not bad, bad
