"""CPU checks of the pointwise pass's generated kernels (kernels/pointwise_codegen.py), in Triton's interpreter.

Each case is a small function diffusers-style code writes; it is traced to ATen (make_fx, no
decompositions), grouped by the pointwise pass, and run: the op calls go through the
generated kernel (the interpreter runs it on CPU tensors), the result is compared with eager.
Values, dtypes and strides must match; bitwise for fp32 cases whose ops CPU and CUDA eager
compute alike (the interpreter's fp32 -> bf16 cast truncates, and libdevice functions are
stood in for by tl.math: tolerance there). Bit-exactness on the GPU is tests/gpu/test_pointwise_gpu.py's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

import pytest
import torch
from _interp import run_worker, worker_main

bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32


def _fp32_chain(a, b, c):
    return ((a * b + c) - a / c).clamp(-1.5, 1.5).neg() + torch.where(a > 0, b, c)


def _where_mask(m, a, b):
    return torch.where(m, a * 2, b - 1)


def _strided_in(x, y):
    return x.transpose(1, 2) * y + 1


def _permuted_out(x):
    return x.permute(0, 2, 1) * 2 + 1


def _stack_split(x):
    a, b, c = x.split([2, 3, 3], dim=-1)
    return torch.stack([a * 2, (b + c)[..., :2].exp()], dim=1)


def _modulate(x, s):
    return x * (1 + s)[:, None] + s[:, None]


def _zero_dim(x, t):
    return x * t + t


def _two_outputs(x):
    xf = x.float()
    return xf.pow(2), (xf * 3).to(x.dtype)


def _silu_sigmoid_tanh(x):
    return torch.nn.functional.silu(x) + torch.sigmoid(x) * torch.tanh(x) - torch.rsqrt(x.abs() + 1)


def make(name, seed=0):
    from diffusion_fuse.testing import pointwise as pw

    g = torch.Generator().manual_seed(seed)
    rn = lambda *s, dtype=bf16: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return {
        "rope": (pw.rope, (rn(1, 24, 2, 16), rn(24, 1, 16, dtype=f32), rn(24, 1, 16, dtype=f32))),
        "rope_cat": (pw.rope_double, (rn(1, 8, 2, 16), rn(1, 16, 2, 16), rn(24, 1, 16, dtype=f32),
                                      rn(24, 1, 16, dtype=f32))),
        "gated_residual": (pw.gated_residual, (rn(2, 40, 64), rn(2, 64), rn(2, 40, 64))),
        "gelu_cat": (pw.gelu_cat, (rn(1, 24, 32), rn(1, 24, 96))),
        "swiglu": (pw.swiglu, (rn(3, 7, 96),)),
        "wan_residual": (pw.wan_residual, (rn(1, 50, 48), rn(1, 50, 48), rn(1, 1, 48, dtype=f32))),
        "fp32_chain": (_fp32_chain, (rn(33, 65, dtype=f32), rn(33, 65, dtype=f32), rn(33, 65, dtype=f32).abs() + 0.5)),
        "where_mask": (_where_mask, (rn(9, 31, dtype=f32) > 0, rn(9, 31, dtype=f32), rn(9, 31, dtype=f32))),
        "strided_in": (_strided_in, (rn(2, 16, 12, dtype=f32), rn(2, 12, 16, dtype=f32))),
        "permuted_out": (_permuted_out, (rn(2, 16, 12, dtype=f32),)),
        "stack_split": (_stack_split, (rn(4, 5, 8, dtype=f32),)),
        "modulate_fp16": (_modulate, (rn(2, 30, 40, dtype=f16), rn(2, 40, dtype=f16))),
        "zero_dim": (_zero_dim, (rn(5, 64), torch.tensor(1.37, dtype=f32))),
        "two_outputs": (_two_outputs, (rn(6, 2, 16),)),
        "gelu_clone": (pw.gelu_clone, (rn(4, 128),)),
        "activations": (_silu_sigmoid_tanh, (rn(3, 100, dtype=f32),)),
    }[name]


CASES = ["rope", "rope_cat", "gated_residual", "gelu_cat", "swiglu", "wan_residual", "fp32_chain", "where_mask",
         "strided_in", "permuted_out", "stack_split", "modulate_fp16", "zero_dim", "two_outputs", "gelu_clone",
         "activations"]
# fp32 cases whose ops eager computes alike on CPU and CUDA, and the interpreter exactly: bitwise
EXACT = {"fp32_chain", "where_mask", "strided_in", "permuted_out"}


def worker() -> dict:
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.testing.pointwise import fuse, site_ops

    res = {}
    for name in CASES:
        fn, args = make(name)
        gm, sites = fuse(fn, *args)
        counters.reset()
        ref = fn(*args)
        got = gm(*args)
        refs, gots = (list(ref), list(got)) if isinstance(ref, tuple) else ([ref], [got])
        res[name] = {
            "sites": [",".join(site_ops(s)) for s in sites],
            "counters": counters.snapshot(),
            "dtypes": [[str(r.dtype), str(g.dtype)] for r, g in zip(refs, gots)],
            "strides": [[list(r.stride()), list(g.stride())] for r, g in zip(refs, gots)],
            "rel_err": max(float((r.double() - g.double()).norm() / max(r.double().norm(), 1e-30))
                           for r, g in zip(refs, gots)),
            "equal": all(torch.equal(r, g) for r, g in zip(refs, gots)),
        }
    # Through the backend: the interpreter's fp32 -> bf16 cast truncates, so the verifier rejects
    # this bf16 group, and the report names the first op whose kernel differs from eager.
    import diffusion_fuse
    from diffusion_fuse.testing.pointwise import gated_residual

    report = diffusion_fuse.Report()
    compiled = torch.compile(gated_residual, backend=diffusion_fuse.DiffusionFuseBackend(None, report))
    args = make("gated_residual")[1]
    res["rejected"] = {"equal": bool(torch.equal(gated_residual(*args), compiled(*args))),
                       "reasons": [s.reason for s in report.sites()]}
    return res


@pytest.fixture(scope="module")
def results():
    return run_worker(__file__)


@pytest.mark.parametrize("case", CASES)
def test_generated_kernel_matches_eager(results, case):
    r = results[case]
    assert len(r["sites"]) == 1, r["sites"]
    assert r["counters"]["kernel"] == {"pointwise": 1} and not r["counters"]["fallback"], r["counters"]
    assert all(a == b for a, b in r["dtypes"]), r["dtypes"]
    assert all(a == b for a, b in r["strides"]), r["strides"]
    if case in EXACT:
        assert r["equal"], r
    else:
        assert r["rel_err"] < 1e-2, r


@pytest.mark.parametrize("case, ops", [
    ("rope", "neg,stack,_to_copy,mul,_to_copy,mul,add,_to_copy"),
    ("rope_cat", "cat,neg,stack,_to_copy,mul,_to_copy,mul,add,_to_copy"),
    ("gelu_cat", "gelu,cat"),
    ("gelu_clone", "gelu,clone"),
])
def test_whole_chain_is_one_site(results, case, ops):
    assert results[case]["sites"] == [ops]



def test_a_rejected_group_names_the_op_that_differs(results):
    r = results["rejected"]
    assert r["equal"]  # the verifier put the group back
    (reason,) = r["reasons"]
    assert "elements differ" in reason and "; first op to differ from eager: mul.Tensor (" in reason, reason


if __name__ == "__main__":
    worker_main(worker)
