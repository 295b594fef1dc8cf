"""CPU checks of the pointwise pass's generated kernels (kernels/pointwise.py), in Triton's interpreter.

Each case is a small function diffusers-style code writes; it is traced to ATen (make_fx, no
decompositions), grouped by the pointwise pass, and run: the op calls go through the
generated kernel (the interpreter runs it on CPU tensors), the result is compared with eager.
Values, dtypes and strides must match; bitwise for fp32 cases whose ops CPU and CUDA eager
compute alike (the interpreter's fp32 -> bf16 cast truncates, and libdevice functions are
stood in for by tl.math: tolerance there). Bit-exactness on the GPU is tests/gpu/test_pointwise_gpu.py's.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

import pytest
import torch
import torch.nn.functional as F
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


def _pairs_then_pad(x, y):  # pairs read under a pad's mask (the batch it adds holds the fill)
    a, b = x.unflatten(-1, (-1, 2)).unbind(-1)
    z = torch.stack([a * 3, b + a], -1).flatten(-2)
    return torch.nn.functional.pad(z, (0, 0, 0, 0, 0, 1)) + y


def _pairs_of_a_transpose(x, c, s):  # pairs along the last dim of a transposed view (stride 5 apart)
    a, b = x.transpose(1, 2).unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)


def _modulate(x, s):
    return x * (1 + s)[:, None] + s[:, None]


def _zero_dim(x, t):
    return x * t + t


def _two_outputs(x):
    xf = x.float()
    return xf.pow(2), (xf * 3).to(x.dtype)


def _silu_sigmoid_tanh(x):
    return torch.nn.functional.silu(x) + torch.sigmoid(x) * torch.tanh(x) - torch.rsqrt(x.abs() + 1)


def _cat_per_program(x, a, b):
    return (x.transpose(1, 2) * torch.cat([a, b], 0)).contiguous()


def _cat_three_chains(a, b, c):
    return torch.cat([a * 3, b - 1.5, c], -1)


def _cat_rows(a, b):
    return torch.cat([a * 3, b + 0.25], 1)


def _cat_three_with_gelu(a, b, c):
    return torch.cat([a * 2, torch.nn.functional.gelu(b, approximate="tanh"), -c], -1)


def _pad_both_sides(x):  # pads before and after the last dim, a fill that is not 1 (x * 2 and the cast: exact)
    return F.pad((x * 2).float(), (1, 2), mode="constant", value=0.5)


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
        # SANA's linear attention at 5 heads of 16, 48 tokens (1 and 37 tokens: tiles cut by the edges)
        "sana_query_relu": (functools.partial(pw.sana_query_relu, heads=5), (rn(2, 48, 80),)),
        "sana_key_relu": (functools.partial(pw.sana_key_relu, heads=5), (rn(2, 48, 80),)),
        "sana_value_float": (functools.partial(pw.sana_value_float, heads=5), (rn(2, 256, 320),)),  # lone: >= 2**16
        # ... and with the F.pad that follows it: one kernel writes the padded fp32 value (a row of ones)
        "sana_value_pad": (functools.partial(pw.sana_value_pad, heads=5), (rn(2, 48, 80),)),
        "pad_both_sides": (_pad_both_sides, (rn(3, 5, 40),)),
        # Qwen-Image's complex RoPE (view_as_complex, a complex multiply, view_as_real), alone and as its joint
        # attention cats text and image; fp32 x: the fp32 path without the bf16 casts
        "qwen_rope": (pw.qwen_rope, (rn(1, 24, 3, 16), pw.rope_freqs(24, 8, "cpu", g))),
        "qwen_rope_cat": (pw.qwen_rope_cat, (rn(1, 7, 3, 16), rn(1, 24, 3, 16), pw.rope_freqs(7, 8, "cpu", g),
                                             pw.rope_freqs(24, 8, "cpu", g))),
        # ... where each input's tokens span whole BLOCKs (8 tokens of 4 x 32 per 1024): a branch per program, as
        # at Qwen-Image's shapes
        "qwen_rope_cat_branches": (pw.qwen_rope_cat, (rn(1, 8, 4, 32), rn(1, 24, 4, 32), pw.rope_freqs(8, 16, "cpu", g),
                                                      pw.rope_freqs(24, 16, "cpu", g))),
        # Lumina's: a complex128 table promotes the product to fp64 pairs, narrowed by type_as
        "lumina_rope": (pw.lumina_rope, (rn(1, 24, 3, 24), pw.rope_freqs(24, 12, "cpu", g, torch.complex128)[None])),
        # ... on the key, repeated for grouped-query attention: the kernel writes the repeated key once
        "lumina_key_gqa": (functools.partial(pw.lumina_key_gqa, n_rep=3),
                           (rn(1, 24, 2, 24), pw.rope_freqs(24, 12, "cpu", g, torch.complex128)[None])),
        "repeat_fp32": (lambda x: (x * 2).repeat(2, 1, 3), (rn(4, 5, 6, dtype=f32),)),
        "sana_attn_out": (pw.sana_attn_out, (rn(2, 5, 17, 48, dtype=f32),)),
        "sana_attn_out_odd": (pw.sana_attn_out, (rn(1, 3, 17, 37, dtype=f32),)),
        "sana_key_relu_fp32": (functools.partial(pw.sana_key_relu, heads=3), (rn(2, 70, 96, dtype=f32),)),
        "bias_add": (pw.bias_add, (rn(2, 300, 256), rn(256))),
        # a cat over the tiled kernel's program index: each branch's element is per program, and out of the
        # branch's range in the other programs (the load must stay masked)
        "cat_per_program": (_cat_per_program, (rn(8, 64, 48, dtype=f32), rn(2, 1, 1, dtype=f32),
                                               rn(6, 1, 1, dtype=f32))),
        # cats whose every BLOCK (1024) of output lies in one input: one branch per program, no masked loads of
        # the other inputs (FLUX's single-block gelu + cat at widths 3072 + 12288)
        "gelu_cat_branches": (pw.gelu_cat, (rn(1, 3, 1024), rn(1, 3, 3072))),
        # row tiles over several row programs (22 rows: the last program's 2 rows past the end masked), and three
        # pieces of which the middle one is looked up (bf16 ops that round exactly elsewhere: bitwise)
        "gelu_cat_rows": (pw.gelu_cat, (rn(2, 11, 1024), rn(2, 11, 3072))),
        "cat_three_with_gelu": (_cat_three_with_gelu, (rn(2, 9, 1024), rn(2, 9, 2048), rn(2, 9, 1024))),
        "cat_three_chains": (_cat_three_chains, (rn(3, 1024, dtype=f32), rn(3, 2048, dtype=f32),
                                                 rn(3, 1024, dtype=f32))),
        "cat_rows": (_cat_rows, (rn(2, 3, 1024, dtype=f32), rn(2, 5, 1024, dtype=f32))),
        # SANA's GLUMBConv: a biased conv's output read only by the chain, the bias added in the kernel (the conv
        # runs without it; CONV_BIAS_CASES lets the pass do that on the CPU, whose eager conv adds the bias inside
        # it: close, not bitwise)
        "conv_silu": (pw.conv_silu, (pw.tokens_as_image(rn(2, 36, 16), 6), rn(40, 16, 1, 1) * 0.2, rn(40))),
        # Wan's RoPE: halves written into empty_like, which fxpasses/interleave_scatter.py makes a stack
        "wan_rope": (pw.wan_rope, (rn(1, 12, 3, 16), rn(1, 12, 1, 16, dtype=f32), rn(1, 12, 1, 16, dtype=f32))),
        "wan_rope_fp32": (pw.wan_rope, (rn(1, 12, 3, 16, dtype=f32), rn(1, 12, 1, 16, dtype=f32),
                                        rn(1, 12, 1, 16, dtype=f32))),
        # SD3's joint value cat of transposed [B, S, H, D] views alone (eager's cat takes its slow indexed path)
        "joint_value_cat": (functools.partial(pw.joint_value_cat, heads=4), (rn(2, 512, 64), rn(2, 33, 64))),
        # LTX-2's split RoPE: the halves updated in place by addcmul_ (functionalized: slice_scatter); close, not
        # bitwise: the interpreter's tl.fma rounds the product (numpy has no fused multiply-add); eager's addcmul is
        # one FMA, and the GPU kernel's bits are eager's (tests/gpu/test_pointwise_gpu.py)
        "split_rope": (pw.split_rope, (rn(1, 12, 48), rn(1, 3, 12, 8, dtype=f32), rn(1, 3, 12, 8, dtype=f32))),
        "conv_glu": (pw.conv_glu, (pw.tokens_as_image(rn(2, 36, 40), 6), rn(40, 1, 3, 3) * 0.3, rn(40))),
        "pairs_then_pad": (_pairs_then_pad, (rn(3, 5, 6, dtype=f32), rn(4, 5, 6, dtype=f32))),
        "pairs_of_a_transpose": (_pairs_of_a_transpose, (rn(3, 6, 5, dtype=f32), rn(3, 5, 3, dtype=f32),
                                                         rn(3, 5, 3, dtype=f32))),
    }[name]


CASES = ["rope", "rope_cat", "gated_residual", "gelu_cat", "swiglu", "wan_residual", "fp32_chain", "where_mask",
         "strided_in", "permuted_out", "stack_split", "modulate_fp16", "zero_dim", "two_outputs", "gelu_clone",
         "activations", "sana_query_relu", "sana_key_relu", "sana_value_float", "sana_attn_out", "sana_attn_out_odd",
         "sana_key_relu_fp32", "bias_add", "cat_per_program", "gelu_cat_branches", "cat_three_chains", "cat_rows",
         "gelu_cat_rows", "cat_three_with_gelu", "conv_silu", "conv_glu", "wan_rope",
         "wan_rope_fp32", "sana_value_pad", "pad_both_sides", "qwen_rope", "qwen_rope_cat", "qwen_rope_cat_branches",
         "joint_value_cat", "split_rope", "pairs_then_pad", "pairs_of_a_transpose", "lumina_rope", "lumina_key_gqa",
         "repeat_fp32"]
CONV_BIAS_CASES = {"conv_silu": "convolution,silu", "conv_glu": "convolution,silu,mul"}
# cats whose kernel branches once per program on the input its BLOCK lies in (number of branches)
BRANCHES = {"gelu_cat_branches": 2, "cat_three_chains": 3, "cat_rows": 2, "gelu_cat": 0, "gelu_cat_rows": 2,
            "cat_three_with_gelu": 3}
# complex RoPE: (loads in the kernel, branches per program). Each complex pair is loaded once, contiguous: a lane
# loads its own component and takes the other from its neighbour (x and the table, per branch)
PAIR_CASES = {"qwen_rope": (2, 0), "qwen_rope_cat_branches": (4, 2)}
# real pairs read at their pair index (RoPE's unflatten + unbind): each element loaded once, in its own lane, the
# partner swapped in from the neighbouring lane once per value (kernels/pointwise.py, _paired; after a cat, the cat's
# value): (x's loads, swaps)
# (Wan's form: tests/test_pointwise_pass.py, after the rewrite that makes its halves a stack)
REAL_PAIRS = {"rope": (1, 1), "rope_cat": (2, 1), "pairs_then_pad": (1, 1), "pairs_of_a_transpose": (1, 1)}
# bf16 gelu chains: gelu through eager's own output table (kernels/lut16.py): (lookups, tables, row-tile grid or
# None) in the kernel. A last-dim cat whose inputs split on BLOCK but not on LUT_BLOCK multiples walks row tiles of
# CAT_ROWS x BLOCK, each program inside one input (its branch per program: BRANCHES); the grid is (row programs,
# column blocks)
LUT_CASES = {"gelu_cat": (1, 1, None), "gelu_clone": (1, 1, None), "gelu_cat_branches": (1, 1, [1, 4]),
             "gelu_cat_rows": (1, 1, [3, 4]), "cat_three_with_gelu": (1, 1, [3, 4])}
# fp32 cases whose ops eager computes alike on CPU and CUDA, and the interpreter exactly, and a bf16 one whose ops
# round exactly (x 2, a sign flip, a lookup of CPU eager's gelu): bitwise
EXACT = {"fp32_chain", "where_mask", "strided_in", "permuted_out", "sana_query_relu", "sana_key_relu",
         "sana_value_float", "sana_key_relu_fp32", "cat_per_program", "cat_three_chains", "cat_rows",
         "cat_three_with_gelu", "wan_rope_fp32", "sana_value_pad", "pad_both_sides", "joint_value_cat",
         "pairs_then_pad", "pairs_of_a_transpose", "repeat_fp32"}
# the layouts choose_layout must pick: (x dim, y dim) of the outputs' shape, None for the flat kernel
# (SANA's key: both sides contiguous along the head dim, 16 or 32 elements: flat)
TILES = {"sana_query_relu": (3, 2), "sana_key_relu": None, "sana_value_float": (2, 3), "sana_attn_out": (2, 1),
         "sana_attn_out_odd": (2, 1), "sana_key_relu_fp32": None, "bias_add": None, "strided_in": (1, 2),
         "permuted_out": (1, 2), "gated_residual": None, "cat_per_program": (2, 1), "sana_value_pad": (3, 2)}


def _random_layout_case(seed: int):
    """A mul + add over a permuted (non-contiguous) fp32 input and a contiguous or broadcast one, whose result is
    copied out contiguous, transposed, or with two dims merged: the layouts that exercise the tiling and the view
    index algebra. fp32 ops the interpreter computes as eager does: the result must be bitwise eager's."""
    g = torch.Generator().manual_seed(1000 + seed)

    def randint(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    nd = randint(2, 4)
    shape = [randint(1, 40) for _ in range(nd)]
    while torch.tensor(shape).prod() > 20000:
        shape[int(torch.argmax(torch.tensor(shape)))] //= 2
    perm = torch.randperm(nd, generator=g).tolist()
    base = torch.randn([shape[p] for p in perm], generator=g)
    x = base.permute([perm.index(k) for k in range(nd)])  # logical `shape`, memory order `perm`
    y_shape = [1 if randint(0, 3) == 0 else n for n in shape]
    y = torch.randn(y_shape, generator=g)
    tail = randint(0, 2)
    a, b = sorted(torch.randperm(nd, generator=g)[:2].tolist()) if nd > 1 else (0, 0)

    def fn(x, y):
        z = x * 1.5 + y
        if tail == 0:
            return z.contiguous()
        if tail == 1:
            return z.transpose(a, b).contiguous()
        return z.flatten(a, a + 1).contiguous() if a + 1 < nd else z.contiguous()

    return fn, (x, y), (shape, perm, y_shape, tail)


def random_layouts(seeds=range(40)) -> list:
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.lowering.pointwise import generate_source
    from diffusion_fuse.testing.pointwise import fuse, program_of

    out = []
    for seed in seeds:
        fn, args, desc = _random_layout_case(seed)
        gm, sites = fuse(fn, *args)
        counters.reset()
        ref, got = fn(*args), gm(*args)
        src = generate_source(list(args), program_of(fn, *args))
        out.append({"case": [str(d) for d in desc], "sites": len(sites), "hits": counters.snapshot()["kernel"],
                    "equal": bool(torch.equal(ref, got)) and ref.stride() == got.stride(),
                    "tile": list(src.tile) if src.tile else None, "strided_bytes": src.strided_bytes,
                    "int64": "tl.int64" in src.source})
    return out


ROW_MEAN_SIZES = (32, 64, 128, 256)


def row_means() -> dict:
    """SD3's joint QK norms (diffusers' RMSNorm on transposed [B, H, S, D] views, then the cat) in fp32, the
    variance summed inside the tail's kernel: the same bits as ``mean_square``'s kernel's variance followed by the
    tail (whose ops the interpreter and CPU eager compute alike in fp32), per row size."""
    from diffusion_fuse.kernels.mean_square import plan_mean_square
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.lowering.pointwise import generate_source
    from diffusion_fuse.testing import pointwise as pw
    from diffusion_fuse.testing.pointwise import fuse, program_of, site_ops

    def tail(x, w):
        return (x * torch.rsqrt(plan_mean_square(x)(x) + 1e-6)).to(w.dtype) * w

    out = {}
    for d in ROW_MEAN_SIZES:
        g = torch.Generator().manual_seed(d)
        amp = torch.logspace(-3, 3, d)[torch.randperm(d, generator=g)]  # wide rows: other orders give other bits
        args = (torch.randn(2, 40, 4 * d, generator=g) * amp.repeat(4), torch.randn(2, 20, 4 * d, generator=g),
                torch.randn(d, generator=g), torch.randn(d, generator=g))
        fn = functools.partial(pw.joint_qk_norm, heads=4)
        gm, sites = fuse(fn, *args)
        counters.reset()
        got = gm(*args)
        want = torch.cat([tail(pw.heads_first(args[0], 4), args[2]), tail(pw.heads_first(args[1], 4), args[3])], 2)
        src = generate_source(list(args), program_of(fn, *args))
        out[str(d)] = {"sites": [",".join(site_ops(s)) for s in sites], "counters": counters.snapshot(),
                       "equal": torch.equal(got, want), "strides": [list(got.stride()), list(fn(*args).stride())],
                       "row_sums": src.source.count("row_sums(")}
    # two norms cat along the row itself: each branch's mask tests the index inside the row, and the rows are
    # summed under the kernel's own mask
    g = torch.Generator().manual_seed(1)
    args = tuple(torch.randn(*s, generator=g) for s in ((2, 40, 64), (2, 40, 64), (64,), (64,)))

    def last_dim_cat(a, b, wa, wb):
        return torch.cat([pw.rms_norm_explicit(a, wa), pw.rms_norm_explicit(b, wb)], -1)

    gm, sites = fuse(last_dim_cat, *args)
    counters.reset()
    got = gm(*args)
    want = torch.cat([tail(args[0], args[2]), tail(args[1], args[3])], -1)
    out["last_dim_cat"] = {"sites": [",".join(site_ops(s)) for s in sites], "counters": counters.snapshot(),
                           "equal": torch.equal(got, want), "strides": [list(got.stride()), list(want.stride())],
                           "row_sums": generate_source(list(args), program_of(last_dim_cat, *args)).source.count(
                               "row_sums(")}
    return out


def worker() -> dict:
    from diffusion_fuse.fxpasses.pointwise import CONV_BIAS_DEVICES
    from diffusion_fuse.kernels.pointwise_ops import Variants
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.lowering.pointwise import generate_source
    from diffusion_fuse.testing.pointwise import fuse, program_of, site_ops

    res = {}
    for name in CASES:
        fn, args = make(name)
        if name in CONV_BIAS_CASES:
            CONV_BIAS_DEVICES.add("cpu")
        else:
            CONV_BIAS_DEVICES.discard("cpu")
        # the branch checks read the recipe kernel: a table lookup (lut16) takes larger programs, whose blocks
        # straddle the cat's inputs (LUT_CASES below checks that kernel)
        row_tiles = bool(LUT_CASES.get(name, (0, 0, None))[2])  # the branch check reads the row-tile kernel there
        variants = Variants(lut16=False) if name in BRANCHES and not row_tiles else Variants()
        src = generate_source(list(args), program_of(fn, *args), variants) \
            if name in TILES or name in BRANCHES or name in LUT_CASES or name in PAIR_CASES or name in REAL_PAIRS \
            else None
        lut_src = generate_source(list(args), program_of(fn, *args)) if name in LUT_CASES else None
        gm, sites = fuse(fn, *args)
        counters.reset()
        ref = fn(*args)
        got = gm(*args)
        refs, gots = (list(ref), list(got)) if isinstance(ref, tuple) else ([ref], [got])
        res[name] = {
            "sites": [",".join(site_ops(s)) for s in sites],
            "counters": counters.snapshot(),
            "dtypes": [[str(r.dtype), str(g.dtype)] for r, g in zip(refs, gots)],
            # the strides that address elements, as the verifier compares them (verify/compare.py): a size-1
            # dim's stride follows how a view was computed, which fake and real tensors do not always agree on
            "strides": [[[st for n, st in zip(t.shape, t.stride()) if n > 1] for t in (r, g)]
                        for r, g in zip(refs, gots)],
            "rel_err": max(float((r.double() - g.double()).norm() / max(r.double().norm(), 1e-30))
                           for r, g in zip(refs, gots)),
            "equal": all(torch.equal(r, g) for r, g in zip(refs, gots)),
            "tile": list(src.tile) if src and src.tile else None,
            "strided_bytes": src.strided_bytes if src else None,
            "unmasked_loads": [ln.strip() for ln in src.source.splitlines()
                               if "tl.load(" in ln and "mask=" not in ln] if src else None,
            "branches": [ln.strip() for ln in src.source.splitlines()
                         if ln.strip().startswith(("if c0", "elif c0", "else:"))] if src else None,
            "swaps": src.source.count("tl.split(") if src else None,
            "loads": [ln.strip() for ln in src.source.splitlines()  # the inputs' (not a lookup table's)
                      if "tl.load(" in ln and not ln.strip().startswith("lut")] if src else None,
            "lut": {"lookups": lut_src.source.count("lut16_apply("), "block": lut_src.constexprs.get("BLOCK"),
                    "rows": lut_src.constexprs.get("CAT_ROWS"), "grid": list(lut_src.grid),
                    "warps": lut_src.num_warps, "tables": len(lut_src.tables)} if lut_src else None,
        }
    res["random_layouts"] = random_layouts()
    # int64 indices everywhere (what a tensor near 2**31 elements, or a tiling whose edge tiles could wrap int32,
    # takes), on layouts of their own (the op's plans are cached per layout)
    from diffusion_fuse.lowering import pointwise as lowering_pointwise

    limit, lowering_pointwise._INT32_LIMIT = lowering_pointwise._INT32_LIMIT, 0
    try:
        res["random_layouts_int64"] = random_layouts(range(1000, 1024))
    finally:
        lowering_pointwise._INT32_LIMIT = limit
    res["row_means"] = row_means()
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
    *CONV_BIAS_CASES.items(),
    ("rope", "neg,stack,_to_copy,mul,_to_copy,mul,add,_to_copy"),
    ("rope_cat", "cat,neg,stack,_to_copy,mul,_to_copy,mul,add,_to_copy"),
    ("gelu_cat", "gelu,cat"),
    ("gelu_clone", "gelu,clone"),
    ("wan_rope", "mul,mul,sub,mul,mul,add,_to_copy,_to_copy,stack,clone"),
    ("sana_value_pad", "_to_copy,constant_pad_nd"),
    ("qwen_rope", "_to_copy,mul,_to_copy"),
    ("qwen_rope_cat", "_to_copy,mul,_to_copy,_to_copy,mul,_to_copy,cat"),
    ("lumina_rope", "_to_copy,mul,_to_copy"),
    ("lumina_key_gqa", "_to_copy,mul,_to_copy,repeat"),
    ("repeat_fp32", "mul,repeat"),
    ("split_rope", "_to_copy,mul,neg,addcmul,slice_scatter,addcmul,slice_scatter,_to_copy"),
])
def test_whole_chain_is_one_site(results, case, ops):
    assert results[case]["sites"] == [ops]



@pytest.mark.parametrize("case", sorted(TILES))
def test_layout_reads_and_writes_contiguously(results, case):
    """A transpose is walked in tiles (each access contiguous along one tile index), anything else flat."""
    r = results[case]
    assert r["tile"] == (list(TILES[case]) if TILES[case] else None), r
    assert r["strided_bytes"] == 0, r


@pytest.mark.parametrize("case", sorted(LUT_CASES))
def test_bf16_gelu_is_looked_up_in_eagers_table(results, case):
    """gelu (tanh) from bf16 to bf16 is a lookup in a table of CPU eager's outputs here (the GPU's eager on the
    GPU), in programs of LUT_BLOCK elements and LUT_WARPS warps; the chain's output is then CPU eager's, bitwise."""
    from diffusion_fuse.kernels.pointwise import BLOCK, CAT_ROWS, LUT_BLOCK, LUT_WARPS

    r = results[case]
    lookups, tables, row_grid = LUT_CASES[case]
    want = {"lookups": lookups, "block": LUT_BLOCK, "rows": None, "warps": LUT_WARPS, "tables": tables}
    if row_grid:  # programs of CAT_ROWS rows per BLOCK columns
        assert CAT_ROWS * BLOCK == LUT_BLOCK and r["lut"]["grid"] == row_grid, r["lut"]
        want.update(block=BLOCK, rows=CAT_ROWS)
    assert {k: v for k, v in r["lut"].items() if k != "grid"} == want, r["lut"]
    assert r["equal"], r


@pytest.mark.parametrize("case", sorted(BRANCHES))
def test_a_cat_whose_blocks_lie_in_one_input_branches_per_program(results, case):
    """Each program takes the one input its BLOCK of the output lies in: one load per input, each under the
    kernel's own mask only (no per-lane select of the others), and the chain of each input in its branch alone.
    Where the inputs' boundaries do not fall on BLOCK multiples (the small gelu_cat), lanes select as before."""
    r = results[case]
    assert len(r["branches"]) == BRANCHES[case], r["branches"]
    if BRANCHES[case]:
        assert r["branches"][-1] == "else:"
        assert all(ln.endswith("mask=m, other=0)") or "mask=m, other=0)." in ln for ln in r["loads"]), r["loads"]
        assert len(r["loads"]) == BRANCHES[case]


@pytest.mark.parametrize("case", sorted(PAIR_CASES))
def test_complex_pairs_load_once_and_swap_in_registers(results, case):
    r = results[case]
    loads, branches = PAIR_CASES[case]
    assert len(r["loads"]) == loads and len(r["branches"]) == branches, r
    assert all("+ f," in ln or "+ t" in ln for ln in r["loads"]), r["loads"]  # no pair index (f // 2) * 2 + 1
    assert r["swaps"] == loads, r["swaps"]


@pytest.mark.parametrize("case", sorted(REAL_PAIRS))
def test_real_pairs_load_once_and_swap_in_registers(results, case):
    r = results[case]
    x_loads, swaps = REAL_PAIRS[case]
    pairs_read = [ln for ln in r["loads"] if "in0" in ln or ("rope_cat" in case and "in1" in ln)]
    assert len(pairs_read) == x_loads and r["swaps"] == swaps, r
    assert not any("(f // 2) * 2" in ln for ln in r["loads"]), r["loads"]  # no element read at its pair's index


def test_a_cat_branch_reads_its_input_under_its_mask(results):
    # the branch's per-program element is out of its input's range in the other branch's programs: an unmasked
    # load there reads past the input (a fault on the GPU), so every load but the kernel's own is masked
    r = results["cat_per_program"]
    assert r["equal"] and r["tile"] == [2, 1]
    assert r["unmasked_loads"] == [], r["unmasked_loads"]


def test_random_layouts_are_bitwise_eager(results):
    cases = results["random_layouts"]
    bad = [c for c in cases if not (c["equal"] and c["sites"] == 1 and c["hits"] == {"pointwise": 1})]
    assert not bad, bad[:3]
    assert sum(c["tile"] is not None for c in cases) >= 5, [c["tile"] for c in cases]  # the tiling is exercised


def test_random_layouts_indexed_in_int64_are_bitwise_eager(results):
    cases = results["random_layouts_int64"]
    bad = [c for c in cases if not (c["equal"] and c["sites"] == 1 and c["hits"] == {"pointwise": 1} and c["int64"])]
    assert not bad, bad[:3]
    assert sum(c["tile"] is not None for c in cases) >= 3, [c["tile"] for c in cases]


def _eval_lin(lin, env):
    return lin.const + sum(c * ((env[t.var] // t.div) % t.mod if t.mod else env[t.var] // t.div) for t, c in lin.terms)


@pytest.mark.parametrize("shape, view_as, tile", [
    ((2, 140, 64), (2, 7, 20, 64), (1, 2)),  # SANA: heads merged into channels, walked across them
    ((2, 5, 16, 48), (2, 80, 48), (3, 2)),  # the z digits land inside a dim shared with y: no carry
    ((3, 35, 7), (3, 5, 7, 7), (1, 2)),
    ((4, 6, 10), (24, 10), (2, 0)),
    ((6, 10), (4, 15), (1, 0)),  # digits straddle dims: needs the materialized flat index
    ((1, 37, 3, 17), (37, 51), (3, 1)),
])
def test_tiled_view_indices_unravel_exactly(shape, view_as, tile):
    """The multi-index a view's input sees, for every (x, y, z) of a tiling, equals unravelling the flat index
    (``Generator.digits``, or the materialized flat index where digits would carry)."""
    import itertools
    import math

    from diffusion_fuse.kernels.pointwise import Generator, Lin, Term, contiguous_strides, flatten

    gen = Generator.__new__(Generator)
    gen.lines, gen._cse = [], {}
    dx, dy = tile
    rest = [k for k in range(len(shape)) if k not in tile]
    nz = math.prod(shape[k] for k in rest)
    gen.bounds = {"x": shape[dx], "y": shape[dy], "z": nz}
    z_idx = gen.unravel(Lin.of(Term("z", 1, 0)), [shape[k] for k in rest])
    idx = [Lin()] * len(shape)
    idx[dx], idx[dy] = Lin.of(Term("x", 1, 0)), Lin.of(Term("y", 1, 0))
    for k, i in zip(rest, z_idx):
        idx[k] = i
    flat = flatten(idx, contiguous_strides(shape), shape)
    got = gen.unravel(flat, view_as)
    tmps = {name: expr for expr, name in gen._cse.items()}
    cs = contiguous_strides(view_as)
    for x, y, z in itertools.product(range(shape[dx]), range(shape[dy]), range(nz)):
        env = {"x": x, "y": y, "z": z}
        for name, expr in tmps.items():  # materialized indices
            env[name] = eval(expr, {}, dict(env))
        f = _eval_lin(flat, env)
        want = [(f // cs[k]) % view_as[k] for k in range(len(view_as))]
        assert [_eval_lin(i, env) for i in got] == want, (x, y, z)


def test_a_rejected_group_names_the_op_that_differs(results):
    r = results["rejected"]
    assert r["equal"]  # the verifier put the group back
    (reason,) = r["reasons"]
    assert "elements differ" in reason and "; first op to differ from eager: mul.Tensor (" in reason, reason


@pytest.mark.parametrize("d", [*map(str, ROW_MEAN_SIZES), "last_dim_cat"])
def test_a_norms_variance_is_summed_in_its_tails_kernel(results, d):
    """The pow → mean → rsqrt chain and its cat are one site, one launch, whose variance has mean_square's bits."""
    r = results["row_means"][d]
    assert len(r["sites"]) == 1 and r["sites"][0].count("mean") == 2, r["sites"]
    assert r["counters"]["kernel"] == {"pointwise": 1} and not r["counters"]["fallback"], r["counters"]
    assert r["equal"] and r["strides"][0] == r["strides"][1], r
    assert r["row_sums"] == 2, r  # one per norm (the cat's two branches)


if __name__ == "__main__":
    worker_main(worker)
