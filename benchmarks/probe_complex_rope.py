"""Probe: which fp32 formula gives eager's complex multiply on CUDA, and what fusing Qwen-Image's RoPE would save.

Why: Qwen-Image applies RoPE in complex numbers (diffusers ``apply_rotary_emb_qwen(use_real=False)``)::

    x_rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    x_out = torch.view_as_real(x_rotated * freqs_cis.unsqueeze(1)).flatten(3)
    return x_out.type_as(x)

The pointwise pass does not take complex tensors, so each q/k RoPE is three passes over an fp32 copy of the
tensor: the cast to fp32 (written), the complex multiply (read, written), the cast back (read). Qwen-Image at
1024² runs four per block (image and text, q and k) in 60 blocks. One kernel would read x once and write the
result once; it can only be lossless if it computes eager's bits.

Eager's kernel is ``MulFunctor<c10::complex<float>>``: ``real = a*c - b*d``, ``imag = a*d + b*c``
(``c10/util/complex.h``), compiled by nvcc with FMA contraction on. Which product the compiler fuses is not
written anywhere. The candidates, computed by the Triton kernel below with ``tl.fma`` and no other contraction
(``launch.EAGER_NUMERICS``)::

    real: fma(a, c, -(b*d)) | fma(-b, d, a*c) | a*c - b*d
    imag: fma(a, d, b*c)    | fma(b, c, a*d)  | a*d + b*c

Writes $OUT/probe_complex_rope.json and prints, per candidate, the elements that differ from eager over several
draws (bf16-rounded inputs as the RoPE sees them, and full fp32 ones), then the steady-state µs (CUDA graph,
inputs cycled past the L2) at Qwen-Image's image q shape of eager's three ops against one kernel doing all three
with the first exact candidate (bits checked), and the HBM floor of that kernel.

    python benchmarks/probe_complex_rope.py

Not yet run (written in session 15, when the device time was spent); the next GPU session runs it
(``BENCHES=probe_complex_rope bash benchmarks/run_gpu.sh bench``).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl
from tabulate import tabulate

from diffusion_fuse.kernels.launch import EAGER_NUMERICS

try:
    from steady import input_sets, steady_us
except ImportError:  # imported as benchmarks.<module>
    from benchmarks.steady import input_sets, steady_us

HBM_TBS = 4.1
BLOCK = 1024
# (name, real form, imag form): 0 fuses the first product, 1 the second, 2 none
CANDIDATES = [(f"re{r}_im{i}", r, i) for r in range(3) for i in range(3)]


@triton.jit
def _neg(x):
    # C++'s -x, a sign flip (-0 for +0); Triton's unary minus is 0 - x (+0 for +0)
    return (x.to(tl.int32, bitcast=True) ^ -2147483648).to(tl.float32, bitcast=True)


@triton.jit
def _cmul(a, b, c, d, RE: tl.constexpr, IM: tl.constexpr):
    if RE == 0:
        re = tl.fma(a, c, _neg(b * d))
    elif RE == 1:
        re = tl.fma(_neg(b), d, a * c)
    else:
        re = a * c - b * d
    if IM == 0:
        im = tl.fma(a, d, b * c)
    elif IM == 1:
        im = tl.fma(b, c, a * d)
    else:
        im = a * d + b * c
    return re, im


@triton.jit
def cmul_kernel(X, F, OUT, n_pairs, pairs_per_row_f, rows_per_f, RE: tl.constexpr, IM: tl.constexpr,
                BLOCK: tl.constexpr):
    """``x * f`` for x [n_pairs] complex (as fp32 pairs) and f broadcast over ``rows_per_f`` rows of
    ``pairs_per_row_f`` pairs (the RoPE table [S, D/2] over heads): fp32 pairs out."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = p < n_pairs
    q = (p // (pairs_per_row_f * rows_per_f)) * pairs_per_row_f + p % pairs_per_row_f
    a = tl.load(X + 2 * p, mask=m)
    b = tl.load(X + 2 * p + 1, mask=m)
    c = tl.load(F + 2 * q, mask=m)
    d = tl.load(F + 2 * q + 1, mask=m)
    re, im = _cmul(a, b, c, d, RE, IM)
    tl.store(OUT + 2 * p, re, mask=m)
    tl.store(OUT + 2 * p + 1, im, mask=m)


@triton.jit
def rope_kernel(X, F, OUT, n_pairs, pairs_per_row_f, rows_per_f, RE: tl.constexpr, IM: tl.constexpr,
                BLOCK: tl.constexpr):
    """The whole RoPE: bf16 x -> fp32 (exact) -> complex multiply -> bf16, in one pass."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = p < n_pairs
    q = (p // (pairs_per_row_f * rows_per_f)) * pairs_per_row_f + p % pairs_per_row_f
    a = tl.load(X + 2 * p, mask=m).to(tl.float32)
    b = tl.load(X + 2 * p + 1, mask=m).to(tl.float32)
    c = tl.load(F + 2 * q, mask=m)
    d = tl.load(F + 2 * q + 1, mask=m)
    re, im = _cmul(a, b, c, d, RE, IM)
    tl.store(OUT + 2 * p, re.to(tl.bfloat16), mask=m)
    tl.store(OUT + 2 * p + 1, im.to(tl.bfloat16), mask=m)


def _launch(kernel, x, freqs, out, re, im):
    """x [1, S, H, D] (pairs along D; batch 1, which the table's index assumes), freqs [S, D/2] complex64 (as
    diffusers passes it, unsqueezed over heads)."""
    B, S, H, D = x.shape
    assert B == 1, "the kernels index the table for batch 1"
    n_pairs = x.numel() // 2
    kernel[(triton.cdiv(n_pairs, BLOCK),)](x, torch.view_as_real(freqs), out, n_pairs, D // 2, H, re, im,
                                           BLOCK=BLOCK, **EAGER_NUMERICS)
    return out


def eager_rope(x, freqs):  # diffusers' apply_rotary_emb_qwen(use_real=False)
    x_rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_rotated * freqs.unsqueeze(1)).flatten(3).type_as(x)


def draws(device, S=4096, H=24, D=128, n=3):
    """(name, x fp32 [1, S, H, D], freqs complex64 [S, D/2]) with RoPE-like tables (unit complex numbers)."""
    for k in range(n):
        g = torch.Generator(device=device).manual_seed(k)
        x = torch.randn(1, S, H, D, device=device, generator=g) * (10.0 ** (k - 1))
        theta = torch.rand(S, D // 2, device=device, generator=g, dtype=torch.float64) * 4096
        freqs = torch.polar(torch.ones_like(theta), theta).to(torch.complex64)
        yield f"draw{k} bf16-valued", x.bfloat16().float(), freqs
        yield f"draw{k} fp32", x, freqs


def exactness(device) -> dict:
    res = {}
    for name, x, freqs in draws(device):
        ref = torch.view_as_real(torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * freqs.unsqueeze(1))
        for cand, re, im in CANDIDATES:
            got = _launch(cmul_kernel, x, freqs, torch.empty_like(ref), re, im)
            res.setdefault(cand, {})[name] = int((got.view(torch.int32) != ref.view(torch.int32)).sum())
    return res


def timing(device, exact: str | None) -> dict:
    g = torch.Generator(device=device).manual_seed(7)
    x = torch.randn(1, 4096, 24, 128, device=device, generator=g).bfloat16()  # Qwen-Image's image q at 1024²
    theta = torch.rand(4096, 64, device=device, generator=g, dtype=torch.float64) * 4096
    freqs = torch.polar(torch.ones_like(theta), theta).to(torch.complex64)
    moved = 2 * x.numel() * x.element_size() + freqs.numel() * 8
    sets = input_sets((x, freqs), moved)
    out = {"eager_us": steady_us([lambda s=s: eager_rope(*s) for s in sets]), "floor_us": moved / HBM_TBS / 1e6}
    if exact is not None:
        _, re, im = next(c for c in CANDIDATES if c[0] == exact)
        fused = _launch(rope_kernel, x, freqs, torch.empty_like(x), re, im)
        out["fused_bits_equal"] = bool(torch.equal(fused.view(torch.int16), eager_rope(x, freqs).view(torch.int16)))
        out["fused_us"] = steady_us([lambda s=s: _launch(rope_kernel, *s, torch.empty_like(s[0]), re, im)
                                     for s in sets])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "probe_complex_rope.json"))
    args = ap.parse_args()
    device = "cuda"
    exact = exactness(device)
    rows = [[c, *v.values(), "yes" if not any(v.values()) else ""] for c, v in exact.items()]
    names = list(next(iter(exact.values())))
    print(tabulate(rows, headers=["candidate", *names, "exact"]))
    first = next((c for c, v in exact.items() if not any(v.values())), None)
    t = timing(device, first)
    print(f"\nQwen-Image image q RoPE [1, 4096, 24, 128] bf16, steady µs: eager (3 ops) {t['eager_us']:.1f}, "
          f"fused {t.get('fused_us', float('nan')):.1f} (bits equal: {t.get('fused_bits_equal')}; candidate "
          f"{first}), floor {t['floor_us']:.1f}")
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "differing_elements": exact,
                   "first_exact": first, "timing": t}, f, indent=1)


if __name__ == "__main__":
    main()
