"""CPU checks of kernels/mean_square.py: its summation order in Triton's interpreter, its guard.

The interpreter runs fp32 arithmetic one IEEE op at a time, so the kernel must equal ``emulate`` (ATen's
reduce order as the module's contract states it, in numpy) bit for bit, in both warp orders; inputs span six
decades so that every other order gives other bits (checked too). Whether the contract is eager's is the GPU
test's job (tests/gpu/test_mean_square_gpu.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

import numpy as np
import pytest
import torch
from _interp import run_worker, worker_main

CASES = [(16, 128), (37, 128), (16, 64), (21, 32), (37, 96), (16, 48), (21, 100), (37, 160), (16, 2432),
         (19, 1156)]  # (rows, D): the measured head dims, then rows of other sizes (strided and vector lanes)
ORDERS = {f"{form}_{'desc' if desc else 'asc'}": (k, desc) for k, form in
          {0: "sequential", 1: "tree", 2: "halves", 3: "vector"}.items() for desc in (True, False)}


ROW_SUM_SIZES = (32, 64, 128, 256, 512, 1024)  # row_sums' rows (powers of two up to a generated kernel's block)


def orders_of(d: int) -> dict[str, tuple[int, bool]]:
    """The orders a row of ``d`` can be summed in by some kernel: every candidate of ``candidates(d)``, and at the
    measured head dims every form of the generic kernel."""
    from diffusion_fuse.kernels.mean_square import CANDIDATES, candidates

    return {n: o for n, o in ORDERS.items() if o in candidates(d) or o in CANDIDATES.get(d, ())}


def emulate(x: torch.Tensor, order: tuple[int, bool]) -> np.ndarray:
    """The contract's order in numpy: lane t of LPR sums its squares (elements t + LPR i in order; or vectors
    t + LPR k into four accumulators, combined in order; or at D = 128 as a tree or by halves); the warp tree
    halves (descending) or pairs neighbours (ascending); then the factor."""
    from diffusion_fuse.kernels.mean_square import VECTOR, lanes_per_row, mean_factor

    form, descending = order
    sq = x.reshape(-1, x.shape[-1]).float().numpy()
    sq = sq * sq
    rows, d = sq.shape
    lpr = lanes_per_row(form, d)
    step = 4 * lpr if form == VECTOR else lpr
    padded = np.zeros((rows, -(-d // step) * step), np.float32)  # absent elements add +0.0: exact
    padded[:, :d] = sq
    if form == VECTOR:
        acc = np.zeros((rows, lpr, 4), np.float32)
        for k in range(padded.shape[1] // step):
            acc = acc + padded.reshape(rows, -1, lpr, 4)[:, k]
        s = ((acc[..., 0] + acc[..., 1]) + acc[..., 2]) + acc[..., 3]
    else:
        a = padded.reshape(rows, -1, lpr).transpose(0, 2, 1)  # [rows, lane, i]
        if form == 1:
            s = (a[:, :, 0] + a[:, :, 1]) + (a[:, :, 2] + a[:, :, 3])
        elif form == 2:
            s = (a[:, :, 0] + a[:, :, 2]) + (a[:, :, 1] + a[:, :, 3])
        else:
            s = a[:, :, 0].copy()
            for i in range(1, a.shape[2]):
                s = s + a[:, :, i]
    while s.shape[1] > 1:
        w = s.shape[1] // 2
        s = s[:, :w] + s[:, w:] if descending else s[:, 0::2] + s[:, 1::2]
    return (s[:, 0] * np.float32(mean_factor(rows, d))).astype(np.float32)


def _wide(rows, d, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    amp = torch.logspace(-3, 3, d)[torch.randperm(d, generator=g)]
    return (torch.randn(rows, d, generator=g) * amp).to(dtype)


def worker() -> dict:
    from diffusion_fuse.kernels.mean_square import (
        can_use_mean_square,
        eager_order,
        lanes_per_row,
        mean_factor,
        plan_mean_square,
        rows_of,
    )

    res = {}
    for rows, d in CASES:
        for dtype in (torch.float32, torch.bfloat16):
            x = _wide(rows, d, rows * d, dtype)
            for oname, order in orders_of(d).items():
                got = plan_mean_square(x, order)(x)
                want = emulate(x, order)
                others = [emulate(x, o) for o in orders_of(d).values() if o != order]
                key = f"{rows}x{d}:{str(dtype)[6:]}:{oname}"
                res[key] = {"shape": list(got.shape), "equal": bool(np.array_equal(got.numpy().view(np.int32).ravel(),
                                                                              want.view(np.int32))),
                            "other_differs": all(not np.array_equal(want.view(np.int32), o.view(np.int32))
                                                 for o in others),
                            "close_to_eager": bool(torch.allclose(got, x.float().pow(2).mean(-1, keepdim=True),
                                                                  rtol=1e-5, atol=0))}
    # rows of a [1, S, H, D] view of a [S, H * D] projection (evenly strided rows), a padded row stride, and rows
    # of 2 and 3 strided dims: [B, S, H, D] projections transposed to [B, H, S, D] (SD3.5's QK norms), the leading
    # tokens of each head; each row in the contract's order, the means contiguous as eager's
    base = _wide(40, 4 * 32, 7)
    strided = {"heads_view": base.view(1, 40, 4, 32), "padded_rows": _wide(24, 80, 8)[:, :64],
               "heads_transposed_b1": _wide(80, 128, 9).view(1, 20, 4, 128).transpose(1, 2),
               "heads_transposed": _wide(2 * 9 * 3, 128, 10, torch.bfloat16).view(2, 9, 3, 128).transpose(1, 2),
               "heads_transposed_d64": _wide(2 * 11 * 3, 64, 11).view(2, 11, 3, 64).transpose(1, 2),
               "every_other_token": _wide(2 * 3 * 10, 128, 12).view(2, 3, 10, 128)[:, :, ::2],
               "leading_tokens": _wide(2 * 3 * 20, 32, 13).view(2, 3, 20, 32)[:, :, :7]}
    for name, x in strided.items():
        order = eager_order(x.device, x.shape[-1])
        got = plan_mean_square(x)(x)
        res[name] = {"shape": list(got.shape), "ref_shape": list(x.shape[:-1]) + [1],
                     "contiguous": got.is_contiguous(), "accepted": can_use_mean_square(x)[0],
                     "row_dims": sum(n != 1 for n in rows_of(x)[0]), "equal": bool(np.array_equal(
                         got.reshape(-1).numpy().view(np.int32), emulate(x.contiguous(), order).view(np.int32)))}
    # row_sums (the generated pointwise kernels' row means): every form it takes, on 16 rows a program
    for d in ROW_SUM_SIZES:
        x = _wide(16, d, 100 + d)
        for oname, (form, desc) in orders_of(d).items():
            got = torch.empty(16)
            row_sums_probe[(1,)](x, got, mean_factor(16, d), 16, d, form, desc, lanes_per_row(form, d))
            res[f"row_sums:{d}:{oname}"] = bool(np.array_equal(got.numpy().view(np.int32),
                                                               emulate(x, (form, desc)).view(np.int32)))
    res["guard"] = {name: can_use_mean_square(x)[1] for name, x in {
        "ok": torch.zeros(16, 128), "d96": torch.zeros(16, 96), "d2048": torch.zeros(16, 2048),
        "d16": torch.zeros(16, 16), "d130": torch.zeros(16, 130), "d32768": torch.zeros(16, 32768),
        "few_rows": torch.zeros(15, 128),
        "strided_d": torch.zeros(16, 256)[:, ::2], "int": torch.zeros(16, 128, dtype=torch.int32),
        "four_row_dims": torch.zeros(2, 3, 4, 5, 128).permute(3, 2, 1, 0, 4)}.items()}
    return res


@pytest.fixture(scope="module")
def results():
    return run_worker(__file__)


@pytest.mark.parametrize("case", [f"{r}x{d}:{t}:{o}" for r, d in CASES for t in ("float32", "bfloat16")
                                  for o in orders_of(d)])
def test_kernel_sums_in_the_contracts_order(results, case):
    r = results[case]
    rows = int(case.split("x")[0])
    assert r["shape"] == [rows, 1]
    assert r["equal"] and r["close_to_eager"], r
    if case.split(":")[1] == "float32":
        assert r["other_differs"], "inputs too tame: another order gives the same bits"


@pytest.mark.parametrize("case", [f"row_sums:{d}:{o}" for d in ROW_SUM_SIZES for o in orders_of(d)])
def test_row_sums_add_in_the_contracts_order(results, case):
    """The reshape form of the lanes and the warp tree (what a generated pointwise kernel sums a row mean with)
    gives the kernels' bits in every order it may be asked for."""
    assert results[case], case


@pytest.mark.parametrize("case, row_dims", [("heads_view", 1), ("padded_rows", 1), ("heads_transposed_b1", 2),
                                            ("heads_transposed", 3), ("heads_transposed_d64", 3),
                                            ("every_other_token", 1), ("leading_tokens", 2)])
def test_strided_rows_are_read_in_place(results, case, row_dims):
    r = results[case]
    assert r["accepted"] and r["row_dims"] == row_dims, r
    assert r["equal"] and r["shape"] == r["ref_shape"] and r["contiguous"], r


def test_the_interpreter_takes_each_dims_first_candidate():
    from diffusion_fuse.kernels.mean_square import CANDIDATES, SEQUENTIAL, VECTOR, eager_order

    # the forms measured on the H200 (module docstring) come first
    assert eager_order(torch.device("cpu"), 64) == (SEQUENTIAL, True) == CANDIDATES[64][0]
    assert eager_order(torch.device("cpu"), 128) == (VECTOR, True) == CANDIDATES[128][0]


def test_eagers_forms_run_the_lane_kernels():
    from diffusion_fuse.kernels import mean_square as ms

    def kernel(x, order):
        cells = [c.cell_contents for c in ms.plan_mean_square(x, order).__closure__]
        return next(c.kernel for c in cells if isinstance(c, ms.CachedLaunch))

    x = torch.zeros(40, 128)
    assert kernel(x, (ms.VECTOR, True)) is ms.mean_square_lanes_kernel
    others = {kernel(x, o) for o in ms.CANDIDATES[128][1:]}
    assert others == {ms.mean_square_kernel, ms.mean_square_strided_lanes_kernel}
    # eager's form at 32 and 64 (strided lanes, descending) on the lane kernel; the other on the generic one
    for d in (32, 64):
        assert kernel(torch.zeros(40, d), (ms.SEQUENTIAL, True)) is ms.mean_square_strided_lanes_kernel
        assert kernel(torch.zeros(40, d), (ms.SEQUENTIAL, False)) is ms.mean_square_kernel


ROW_STRIDES = ("L1", "L2", "x_s0", "x_s1", "x_s2", "o_s0", "o_s1", "o_s2")


@pytest.mark.parametrize("row_dims", [1, 2, 3])
@pytest.mark.parametrize("d", [128, 2048, 2432, 160, 96])
def test_lanes_kernel_compiles_for_sm90_with_vector_loads_and_lane_shuffles(row_dims, d):
    """The sm_90 build of the vector-lane kernel as planned for rows of ``d`` (128; 2048, unrolled; 2432, chunks in
    a loop; 160, and 96 over 16 lanes, vectors masked whole): one vector load per row a thread holds and vector,
    all before the first shuffle; no FMA
    (eager adds rounded squares); the shuffles' state has lane f in thread f % 128; rows of 2 or 3 strided dims
    take 32-bit divisions only."""
    import re

    triton = pytest.importorskip("triton")
    from test_compile_sm90 import shuffle_layouts_any
    from test_rms_norm_kernel import lane_layouts
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from diffusion_fuse.kernels import mean_square as ms
    from diffusion_fuse.kernels.launch import EAGER_NUMERICS

    k = ms.mean_square_lanes_kernel
    const = {**ms.vector_lanes_constexprs(d, row_dims, False), "SHUFFLE": True}
    lpr, iters = const["LPR"], const["N_ITERS"]
    groups = const["ROWS"] * lpr // 128
    for dt in ("*bf16", "*fp32"):
        sig = {"X": dt, "OUT": "*fp32", "n_rows": "i32", "N": "i32", **dict.fromkeys(ROW_STRIDES, "i32"),
               "factor": "fp32", **{c: "constexpr" for c in const}}
        aligned = ("X", "OUT", "x_s0", "x_s1", "x_s2")
        src = ASTSource(fn=k, signature=sig, constexprs={(k.arg_names.index(c),): v for c, v in const.items()},
                        attrs={(k.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned})
        ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, **EAGER_NUMERICS})
        ptx = ck.asm["ptx"]
        load = "ld.global.v2.b32" if dt == "*bf16" else "ld.global.v4.b32"
        first_shfl = ptx.index("shfl.sync.down")
        unrolled = iters if iters <= ms.MAX_UNROLLED else ms.UNROLL  # a longer row: a chunk in the loop's body
        assert set(re.findall(r"ld\.global[.\w]*", ptx)) == {load}, dt
        assert ptx[:first_shfl].count(load) == groups * unrolled, (dt, ptx.count(load))
        assert "fma.rn.f32" not in ptx and not re.search(r"\b(div|rem)\.[su]64\b", ptx)
        levels = lpr.bit_length() - 1
        assert len(re.findall(r"shfl\.sync\.down", ptx)) == levels * groups
        layouts = shuffle_layouts_any(ck.asm["ttgir"])
        assert layouts and layouts <= lane_layouts(ms.LANE_GROUPS), layouts


def test_guard_names_what_it_rejects(results):
    g = results["guard"]
    assert g["ok"] == g["d96"] == g["d2048"] == ""
    assert all("last dim" in g[k] for k in ("d16", "d130", "d32768")), g
    assert "rows" in g["few_rows"] and "contiguous" in g["strided_d"]
    assert "dtype" in g["int"] and "more than 3 strided dims" in g["four_row_dims"]


@pytest.mark.parametrize("row_dims", [1, 3])
@pytest.mark.parametrize("per", [1, 2])
def test_strided_lanes_kernel_compiles_for_sm90_with_one_element_per_lane(per, row_dims):
    """D = 32, 64: every lane's load is one element (a vector would hold several lanes in one thread), one per row
    group and element a lane owns; no FMA; the shuffles' state has lane f in thread f % 128, aligned x or not."""
    import re

    triton = pytest.importorskip("triton")
    from test_compile_sm90 import shuffle_layouts_any
    from test_rms_norm_kernel import lane_layouts
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from diffusion_fuse.kernels import mean_square as ms
    from diffusion_fuse.kernels.launch import EAGER_NUMERICS

    k = ms.mean_square_strided_lanes_kernel
    const = {"ROWS": ms.LANE_GROUPS * 128 // ms.LANES, "PER": per, "UNIFORM": per == 2, "SHUFFLE": True,
             "ROW_DIMS": row_dims, "X_FLAT": False}
    for dt, load in (("*bf16", "ld.global.b16"), ("*fp32", "ld.global.b32")):
        for aligned in (("X", "OUT", "x_s0", "x_s1", "x_s2"), ("OUT",)):
            sig = {"X": dt, "OUT": "*fp32", "n_rows": "i32", "N": "i32", **dict.fromkeys(ROW_STRIDES, "i32"),
                   "factor": "fp32",
                   **{c: "constexpr" for c in const}}
            src = ASTSource(fn=k, signature=sig, constexprs={(k.arg_names.index(c),): v for c, v in const.items()},
                            attrs={(k.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned})
            ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, **EAGER_NUMERICS})
            ptx = ck.asm["ptx"]
            assert set(re.findall(r"ld\.global[.\w]*", ptx)) == {load}
            assert ptx.count(load) == per * ms.LANE_GROUPS and "fma.rn.f32" not in ptx
            assert ptx.count("shfl.sync.down") == 5 * ms.LANE_GROUPS
            layouts = shuffle_layouts_any(ck.asm["ttgir"])
            assert layouts and layouts <= lane_layouts(ms.LANE_GROUPS), layouts


if __name__ == "__main__":  # the worker's probe kernel (a jit function resolves its callees as module globals)
    from diffusion_fuse.kernels.mean_square import row_sums
    from diffusion_fuse.kernels.optional_triton import tl, triton

    @triton.jit
    def row_sums_probe(X, OUT, factor, R: tl.constexpr, D: tl.constexpr, FORM: tl.constexpr, DESC: tl.constexpr,
                       LPR: tl.constexpr):
        v = tl.load(X + tl.arange(0, R * D)).to(tl.float32)
        tl.store(OUT + tl.arange(0, R), row_sums(tl.reshape(v * v, [R, D]), R, D, FORM, DESC, LPR) * factor)

    worker_main(worker)


def test_row_sums_take_the_rows_a_program_can_hold():
    """``row_sum_form``: powers of two from 32 to 1024 (a generated kernel's program holds whole rows), in the
    interpreter's order (each size's first candidate); None elsewhere."""
    from diffusion_fuse.kernels.mean_square import SEQUENTIAL, VECTOR, row_sum_form

    cpu = torch.device("cpu")
    assert row_sum_form(cpu, 64) == (SEQUENTIAL, True, 32) and row_sum_form(cpu, 32) == (SEQUENTIAL, True, 32)
    assert all(row_sum_form(cpu, d) == (VECTOR, True, 32) for d in (128, 256, 512, 1024))
    assert all(row_sum_form(cpu, d) is None for d in (16, 96, 160, 2048))


def test_transposed_heads_are_walked_in_memory_order():
    """SD3's QK norm rows ([B, S, H, D] viewed as [B, H, S, D]) are read as they lie: [B, S, H] rows, x's offset
    one stride a row (no division a lane); the means keep the view's order through the output strides."""
    from diffusion_fuse.kernels.mean_square import memory_rows

    x = torch.zeros(2, 4096, 38, 64).transpose(1, 2)
    sizes, xs, out, flat = memory_rows(x)
    assert sizes == (2, 4096, 38) and xs == (4096 * 38 * 64, 38 * 64, 64) and flat
    assert out == (38 * 4096, 1, 4096)  # mean[b, h, s] at b * H * S + h * S + s
    assert memory_rows(torch.zeros(16, 128))[3] and memory_rows(torch.zeros(2, 8, 600, 128)[:, :, :300])[3] is False
