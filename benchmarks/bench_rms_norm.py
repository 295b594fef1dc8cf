"""RMSNorm at real shapes: eager vs diffusion_fuse's ops vs the HBM floor.

Workloads: FLUX.1 QK norm over head_dim [1,4608,24,128] bf16 (``torch.nn.RMSNorm`` →
``_fused_rms_norm``; op ``rms_norm``, lossless), Wan2.1-14B QK norm across heads [1,32760,5120]
bf16 (same op), SD3.5/Qwen-Image QK norm as diffusers' RMSNorm writes it [2,24,4096,64]
(transposed view; op ``rms_norm_chain``, tier high), LTX-style RMSNorm + modulate [1,8192,2048]
(chain + ``* (1 + scale) + shift``), and diffusers RMSNorm's variance alone (op ``mean_square``,
lossless: Qwen-Image's image and text q, SD3.5's). GPU times are medians of ``triton.testing.do_bench`` (CUDA
events, L2 flushed); "eager" is the op's reference impl (the ATen ops eager runs), "op" the
``torch.ops.diffusion_fuse`` call (guard + plan cache + kernel); "steady" columns: benchmarks/steady.py
(back to back in one CUDA graph, inputs cycled out of L2). FLUX's single-block QK norm + RoPE runs as
``rms_norm_rope`` (RoPE in the norm's epilogue); its eager is the norm then the RoPE ops. The floor is the
bytes that must move over the measured copy bandwidth.
The host column is the wall time of 200 back-to-back calls without synchronizing, per call (what a
CPU-bound step pays). A second table times the kernel's row groups per program (``kernels/rms_norm.py``
``SMALL_D_ROW_GROUPS``, rows of D <= 512; with RoPE, the programs whose rows are heads of one token read one cos/sin
row, ``shared_trig_groups``) and its two epilogues (lanes, rows) at FLUX's shapes, steady state, each checked
bitwise against the reference.

    python benchmarks/bench_rms_norm.py [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import time

import torch
from tabulate import tabulate
from triton.testing import do_bench

import diffusion_fuse  # noqa: F401  (registers the ops)
from diffusion_fuse.lowering.mean_square import mean_square
from diffusion_fuse.lowering.rms_norm import rms_norm as rms_norm_reference
from diffusion_fuse.lowering.rms_norm_cat_rope import rms_norm_cat_rope as rms_norm_cat_rope_reference
from diffusion_fuse.lowering.rms_norm_chain import rms_norm_chain as rms_norm_chain_reference
from diffusion_fuse.lowering.rms_norm_rope import rms_norm_rope as rms_norm_rope_reference

try:
    from steady import copy_bandwidth, input_sets, steady_us
except ImportError:  # imported as benchmarks.bench_rms_norm
    from benchmarks.steady import copy_bandwidth, input_sets, steady_us

REFERENCES = {"rms_norm": rms_norm_reference, "rms_norm_chain": rms_norm_chain_reference,
              "rms_norm_rope": rms_norm_rope_reference, "mean_square": mean_square,
              "rms_norm_cat_rope": rms_norm_cat_rope_reference}


def workloads():
    g = torch.Generator(device="cuda").manual_seed(0)

    def rn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    yield "FLUX QK norm [1,4608,24,128]", "rms_norm", (rn(1, 4608, 24, 128), rn(128), 1e-6, None, None, None)
    yield "Wan2.1 QK norm [1,32760,5120]", "rms_norm", (rn(1, 32760, 5120), rn(5120), 1e-6, None, None, None)
    x = rn(2, 4096, 24, 64).transpose(1, 2)
    yield "SD3.5 QK chain [2,24,4096,64]^T", "rms_norm_chain", (x, 1e-6, torch.bfloat16, rn(64), None, None, None,
                                                                None, None)
    sc, sh = rn(1, 1, 2048), rn(1, 1, 2048)
    g2 = torch.Generator(device="cuda").manual_seed(1)
    pos = torch.randn(4608, 64, device="cuda", generator=g2).double() * 50
    cos, sin = (f(pos).repeat_interleave(2, dim=1).float()[None, :, None, :] for f in (torch.cos, torch.sin))
    yield "FLUX single QK norm + RoPE [1,4608,24,128]", "rms_norm_rope", (rn(1, 4608, 24, 128), rn(128), 1e-6, cos, sin)
    yield "FLUX double q: text + image norms, cat, RoPE [1,512+4096,24,128]", "rms_norm_cat_rope", (
        rn(1, 512, 24, 128), rn(128), 1e-6, rn(1, 4096, 24, 128), rn(128), 1e-6, 1, cos, sin)
    # diffusers RMSNorm's variance alone (the op of family mean_square) at Qwen-Image's and SD3.5's q shapes, where the
    # models' own QK norms sum it in their tails' pointwise kernels (bench_pointwise.py's qk_norm chains)
    yield "Qwen-Image q variance [1,4096,24,128]", "mean_square", (rn(1, 4096, 24, 128),)
    yield "Qwen-Image text q variance [1,512,24,128]", "mean_square", (rn(1, 512, 24, 128),)
    yield "SD3.5 q variance [2,4096,24,64]", "mean_square", (rn(2, 4096, 24, 64),)
    # SD3.5-large's q as its attention normalizes it: the [B, S, H, D] projection viewed as [B, H, S, D]
    yield "SD3.5-large q variance, heads view [2,38,4096,64]", "mean_square", (rn(2, 4096, 38, 64).transpose(1, 2),)
    # over the hidden size (vector lanes, several vectors a lane): LTX's norms at 768x512, 121 frames
    yield "LTX hidden variance [1,6144,2048]", "mean_square", (rn(1, 6144, 2048),)
    yield "LTX RMS+mod [1,8192,2048]", "rms_norm_chain", (rn(1, 8192, 2048), 1e-6, torch.bfloat16, None, None, None,
                                                          sc, sh, None)


def row_group_sweep(bw: float, groups=(1, 2, 4, 8)):
    """Steady µs of the FLUX QK-norm kernels per (row groups, epilogue) launch, each output checked bitwise
    against the reference; for RoPE, whether a program's rows read one shared cos/sin row."""
    from diffusion_fuse.kernels import rms_norm as rk
    from diffusion_fuse.kernels.rms_norm import rms_norm_tail
    from diffusion_fuse.lowering.rms_norm import contiguous_strides as _contiguous
    from diffusion_fuse.lowering.rms_norm import row_dims as _rows

    rows, out = [], []
    for name, op_name, op_args in workloads():
        if op_name not in ("rms_norm", "rms_norm_rope") or op_args[0].shape[-1] > 512:
            continue
        x, w, eps = op_args[:3]
        cos, sin = op_args[3:5] if op_name == "rms_norm_rope" else (None, None)
        ref = REFERENCES[op_name](*op_args)
        moved = sum(t.numel() * t.element_size() for t in (*op_args, ref) if isinstance(t, torch.Tensor))
        sets = input_sets(op_args, moved)
        floor = moved / bw * 1e6
        tail, final = rms_norm_tail(x.dtype, w, None, None, None)
        strides = _contiguous(x.shape)
        rows_ = _rows(x, strides, cos, sin)
        picked = rk.shared_trig_groups(x.shape[-1], rows_) if cos is not None else None
        for g, lane in itertools.product(groups, (False, True)):
            const = rk.stats_constexprs(x.shape[-1], groups=g)
            if lane and not rk.lane_epilogue_ok(const, 1, 1):
                continue
            launch = rk.plan_rms_norm(x, x.shape, strides, final, w, None, eps, cos, sin, tail, rows_,
                                      rope=cos is not None, groups=g, lane_epilogue=lane)
            # as plan_rms_norm decides it: a program's rows lie in one run of heads
            shared = picked is not None and const["N_ITERS"] == 1 and rows_[0][2] % const["ROWS"] == 0

            def fn(x, w, eps, *trig, launch=launch):  # trig: (cos, sin) for RoPE, (None, None, None) for the norm
                return launch(x, w, None, *trig[:2])[0]

            exact = bool(torch.equal(fn(*op_args).view(torch.int16), ref.view(torch.int16)))
            us = steady_us([lambda a=a: fn(*a) for a in sets])  # noqa: B023
            # what the ops launch (plan_rms_norm's defaults): the most groups that share a cos/sin row, else by D
            default = g == (picked or rk.row_groups(x.shape[-1])) and lane
            rows.append([name, g, "yes" if shared else "no", "lanes" if lane else "rows", f"{us:.1f}", f"{floor:.1f}",
                         f"{us / floor:.2f}", exact, "*" if default else ""])
            out.append(dict(workload=name, op=op_name, groups=g, shared_trig=shared, lane_epilogue=lane,
                            steady_us=us, floor_us=floor, bit_exact=exact, default=default))
    return rows, out


def host_us(fn, n=200) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    bw = copy_bandwidth()
    rows, out = [], []
    for name, op_name, op_args in workloads():
        op = getattr(torch.ops.diffusion_fuse, op_name)
        reference = REFERENCES[op_name]
        y = op(*op_args)
        ref = reference(*op_args)
        exact = y.dtype == ref.dtype and torch.equal(y.contiguous().view(torch.uint8),
                                                     ref.contiguous().view(torch.uint8))
        moved = sum(t.numel() * t.element_size() for t in (*op_args, y) if isinstance(t, torch.Tensor))
        call_eager = functools.partial(reference, *op_args)
        call_op = functools.partial(op, *op_args)
        t_eager = do_bench(call_eager, return_mode="median")
        t_op = do_bench(call_op, return_mode="median")
        sets = input_sets(op_args, moved)
        s_eager = steady_us([functools.partial(reference, *a) for a in sets])
        s_op = steady_us([functools.partial(op, *a) for a in sets])
        floor = moved / bw * 1e3
        h_eager, h_op = host_us(call_eager), host_us(call_op)
        rows.append([name, op_name, f"{t_eager * 1e3:.1f}", f"{t_op * 1e3:.1f}", f"{s_eager:.1f}", f"{s_op:.1f}",
                     f"{floor * 1e3:.1f}", f"{s_op / (floor * 1e3):.2f}", f"{t_eager / t_op:.2f}x", f"{h_eager:.0f}",
                     f"{h_op:.0f}", "yes" if exact else "no"])
        out.append(dict(workload=name, op=op_name, bit_exact=exact, eager_us=t_eager * 1e3, op_us=t_op * 1e3,
                        floor_us=floor * 1e3,
                        eager_steady_us=s_eager, op_steady_us=s_op, host_eager_us=h_eager, host_op_us=h_op))
    groups_rows, groups_out = row_group_sweep(bw)
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s ({torch.cuda.get_device_name()}, torch {torch.__version__})")
    print(tabulate(rows, headers=["workload", "op", "eager µs", "op µs", "eager steady µs", "op steady µs",
                                  "floor µs", "op steady/floor", "speedup", "host eager µs/call", "host op µs/call",
                                  "bit-exact"]))
    print("\nrow groups per program (rows of D <= 512; steady state, µs)")
    print(tabulate(groups_rows, headers=["workload", "groups", "one cos/sin row", "epilogue", "steady µs", "floor µs",
                                         "steady/floor", "bit-exact", "default"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_bandwidth": bw, "rows": out, "row_groups": groups_out}, f, indent=1)


if __name__ == "__main__":
    main()
