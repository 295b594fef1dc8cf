"""CPU checks of kernels/rms_norm.py: its order of operations in Triton's interpreter, its dispatch, its sm_90 build.

The interpreter runs fp32 arithmetic one IEEE op at a time (its ``tl.fma`` is a mul then an
add), so with fp32 inputs and the ``push_fma=False`` variant the kernel must equal
``emulate_rms_sum_squares`` (eager's lanes, pushes and trees in numpy) *bit for bit*: that
checks the lane layout, the row packing of small D, the masks and both reduction trees. Inputs
span six decades so that another summation order gives other bits (checked too). bf16 numerics
and the FMA variant are the GPU test's job (tests/gpu/test_rms_norm_gpu.py).
"""

from __future__ import annotations

import os
import re
import struct
import sys
from pathlib import Path

if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

import pytest
import torch
from _interp import run_worker, worker_main

DIMS = [16, 24, 64, 128, 200, 520, 1000, 3072]
ROWS = [1, 5, 17]


def _wide(M, D, seed):
    g = torch.Generator().manual_seed(seed)
    amp = torch.logspace(-3, 3, D)[torch.randperm(D, generator=g)]
    return torch.randn(M, D, generator=g) * amp, torch.randn(D, generator=g)


def _order_results() -> dict:
    import numpy as np

    from diffusion_fuse.kernels.rms_norm import emulate_rms_sum_squares, rms_norm_exact

    res = {}
    for D in DIMS:
        for M in ROWS:
            x, w = _wide(M, D, seed=D * 31 + M)
            for with_w in (False, True):
                y, rstd = rms_norm_exact(x, w if with_w else None, 1e-6, push_fma=False)
                s = emulate_rms_sum_squares(x)
                var = s / np.float32(D)
                r = np.float32(1) / np.sqrt(var + np.float32(1e-6))
                ye = x.numpy() * r[:, None]
                if with_w:
                    ye = ye * w.numpy()
                flat = x.numpy().astype(np.float32) ** 2
                seq = np.zeros(M, np.float32)
                for j in range(D):  # one lane summing the row in order: another order, other bits
                    seq = seq + flat[:, j]
                res[f"D={D} M={M} w={with_w}"] = {
                    "rstd_equal": bool(np.array_equal(rstd.numpy().view(np.int32), r.view(np.int32))),
                    "y_equal": bool(np.array_equal(y.numpy().view(np.int32), ye.view(np.int32))),
                    "sequential_differs": bool(not np.array_equal(seq.view(np.int32), s.view(np.int32))),
                }
    for D in (24, 128, 200, 520):  # every row-group count: the same lanes, trees and bits
        x, w = _wide(17, D, seed=D)
        s = emulate_rms_sum_squares(x)
        for groups in (1, 2, 8):
            _, rstd = rms_norm_exact(x, None, 1e-6, push_fma=False, groups=groups)
            r = np.float32(1) / np.sqrt(s / np.float32(D) + np.float32(1e-6))
            res[f"groups={groups} D={D}"] = {"rstd_equal": bool(np.array_equal(rstd.numpy().view(np.int32),
                                                                                r.view(np.int32)))}
    return res


def _dispatch_cases():
    g = torch.Generator().manual_seed(0)

    def rn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g).to(dtype)

    x4 = rn(2, 9, 3, 64)
    w = rn(64)
    sc, sh = rn(2, 1, 192), rn(2, 9, 192)
    xt = rn(2, 9, 3, 64).transpose(1, 2)  # SD3.5's [B, H, S, Dh] view
    rms = {  # op args: x, weight, eps, scale, shift, out_dtype
        "qk_norm_4d": (x4, w, 1e-6, None, None, None),
        "qk_norm_eps_none": (x4, w, None, None, None, None),
        "across_heads_modulate_cast": (rn(2, 9, 192), rn(192), 1e-6, sc, sh, torch.float32),
        "transposed_rows": (xt, w, 1e-6, None, None, None),
        "fp16_no_weight": (rn(7, 1000, dtype=torch.float16), None, 1e-5, None, None, None),
        "misaligned": (rn(2 * 9 * 64 + 1)[1:].view(2, 9, 64), w, 1e-6, None, None, None),
        "odd_D": (rn(2, 9, 30), None, 1e-6, None, None, None),
        "weight_other_dtype": (x4, w.float(), 1e-6, None, None, None),
        "float64": (x4.double(), w.double(), 1e-6, None, None, None),
        "rows_over_4_dims": (rn(7, 5, 3, 2, 64).permute(3, 2, 1, 0, 4), w, 1e-6, None, None, None),
    }
    chain = {  # op args: x, eps, cast1, weight, bias, cast2, scale, shift, out_dtype
        "diffusers_bf16_weight": (x4, 1e-6, torch.bfloat16, w, None, None, None, None, None),
        "composite_fp32_weight": (x4, 1e-6, None, w.float(), None, torch.bfloat16, None, None, None),
        "diffusers_bias_modulate": (rn(2, 9, 192), 1e-6, torch.bfloat16, rn(192), rn(192), None, sc, sh, None),
        "transposed_rows": (xt, 1e-6, torch.bfloat16, w, None, None, None, None, None),
        "odd_D": (rn(2, 9, 30), 1e-5, None, None, None, torch.bfloat16, None, None, None),
        "float64": (x4.double(), 1e-6, None, None, None, None, None, None, None),
    }
    return rms, chain


def _dispatch_results() -> dict:
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.lowering.rms_norm import rms_norm as rms_norm_reference
    from diffusion_fuse.lowering.rms_norm_chain import rms_norm_chain as rms_norm_chain_reference

    rms, chain = _dispatch_cases()
    res = {}
    for op_name, cases, reference in (("rms_norm", rms, rms_norm_reference),
                                      ("rms_norm_chain", chain, rms_norm_chain_reference)):
        op = getattr(torch.ops.diffusion_fuse, op_name)
        for key, args in cases.items():
            counters.reset()
            out = op(*args)
            ref = reference(*args)
            err = float((ref.double() - out.double()).norm() / ref.double().norm())
            res[f"{op_name}:{key}"] = {"counters": counters.snapshot(), "equal": bool(torch.equal(out, ref)),
                                       "rel_err": err, "same_layout": (out.dtype, out.shape, out.stride()) ==
                                       (ref.dtype, ref.shape, ref.stride())}
    return res


def _model_results() -> dict:
    # A module with one rms_norm site and live kernels: the interpreter's order is not the CPU
    # reference's (the composite chain), so the verifier must reject the site, name the first
    # differing element, and the output must stay eager's.
    from torch._decomp.decompositions import _fused_rms_norm

    import diffusion_fuse

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_fused_rms_norm", lambda x, shape, w, eps: _fused_rms_norm(x, shape, w, eps), "CPU")
    model = torch.nn.RMSNorm(512, eps=1e-6)
    x = torch.randn(3, 40, 512) * 10
    report = diffusion_fuse.Report()
    with torch.no_grad():
        ref = model(x)
        out = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)(x)
    return {"equal": bool(torch.equal(ref, out)), "sites": [(s.pattern, s.status, s.reason) for s in report.sites()],
            "kernel_calls": report.counters()["kernel"].get("rms_norm", 0)}


def _rope_cases():
    g = torch.Generator().manual_seed(1)

    def rn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g).to(dtype)

    S, D = 9, 64
    cos, sin = rn(S, D, dtype=torch.float32), rn(S, D, dtype=torch.float32)

    def with_zero_rows(x):  # y = +0.0 there: RoPE's neg must give -0.0 (Triton's unary minus gives +0.0)
        x[:, 1] = 0.0
        return x

    cs = (cos[None, :, None, :], sin[None, :, None, :])  # as apply_rotary_emb broadcasts them (sequence_dim=1)
    return {  # op args: x, weight, eps, cos, sin
        "single_block_bf16": (rn(2, S, 3, D), rn(D), 1e-6, *cs),
        "single_block_fp32": (with_zero_rows(rn(2, S, 3, D, dtype=torch.float32)), rn(D, dtype=torch.float32), 1e-6,
                              *cs),
        "no_weight_fp32_rows_over_3_dims": (with_zero_rows(rn(2, S, 3, D, dtype=torch.float32)), None, None, *cs),
        "one_row_pair_block": (rn(1, S, 1, 8, dtype=torch.float32), None, 1e-6, cos[None, :, None, :8].contiguous(),
                               sin[None, :, None, :8].contiguous()),
        "cos_fp16": (rn(2, S, 3, D), rn(D), 1e-6, cs[0].half(), cs[1]),
        "cos_strided_along_D": (rn(2, S, 3, D), rn(D), 1e-6, rn(S, 2 * D, dtype=torch.float32)[:, ::2][None, :, None],
                                cs[1]),
        # heads that a program's rows divide: the program's rows read one cos/sin row (SHARED_TRIG)
        "heads_share_trig_fp32": (with_zero_rows(rn(2, S, 8, D, dtype=torch.float32)), rn(D, dtype=torch.float32), 1e-6,
                                  *cs),
        "flux_heads_share_trig_bf16": (rn(1, 3, 24, 128), rn(128), 1e-6, rn(1, 3, 1, 128, dtype=torch.float32),
                                       rn(1, 3, 1, 128, dtype=torch.float32)),
    }


def _rope_results() -> dict:
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.lowering.rms_norm_rope import rms_norm_rope as rms_norm_rope_reference
    from diffusion_fuse.lowering.rms_norm_rope import rope as rope_reference

    res = {}
    for key, args in _rope_cases().items():
        x, w, eps, cos, sin = args
        counters.reset()
        out = torch.ops.diffusion_fuse.rms_norm_rope(*args)
        snap = counters.snapshot()
        ref = rms_norm_rope_reference(*args)
        # the epilogue alone: RoPE of the rms_norm op's output (the same kernel's norm) in torch, op for op
        epilogue = rope_reference(torch.ops.diffusion_fuse.rms_norm(x, w, eps, None, None, None), cos, sin)
        err = float((ref.double() - out.double()).norm() / ref.double().norm())
        res[key] = {"counters": snap, "equal": bool(torch.equal(out, ref)), "rel_err": err,
                    "epilogue_equal": bool(torch.equal(out.view(torch.int16) if out.dtype == torch.bfloat16 else out,
                                                       epilogue.view(torch.int16) if out.dtype == torch.bfloat16
                                                       else epilogue)),
                    "same_layout": (out.dtype, out.shape, out.stride()) == (ref.dtype, ref.shape, ref.stride())}
    return res


def _cat_rope_results() -> dict:
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.lowering.rms_norm_cat_rope import rms_norm_cat_rope as rms_norm_cat_rope_reference
    from diffusion_fuse.lowering.rms_norm_rope import rope as rope_reference

    g = torch.Generator().manual_seed(2)

    def rn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    D, Sa, Sb = 64, 5, 4
    cos, sin = rn(1, Sa + Sb, 1, D), rn(1, Sa + Sb, 1, D)
    x_a, x_b = rn(2, Sa, 3, D), rn(2, Sb, 3, D)
    x_b[:, 1] = 0.0  # the neg's -0 (see _rope_cases)
    cases = {  # op args: x_a, w_a, eps_a, x_b, w_b, eps_b, dim, cos, sin
        "double_block_fp32": (x_a, rn(D), 1e-6, x_b, rn(D), 1e-5, 1, cos, sin),
        "double_block_bf16": (x_a.bfloat16(), rn(D).bfloat16(), 1e-6, x_b.bfloat16(), None, 1e-6, 1, cos, sin),
        "cos_broadcast_along_cat": (x_a, None, 1e-6, x_b, None, 1e-6, 1, cos[:, :1].contiguous(), sin[:, :1]
                                    .contiguous()),
        "cat_over_D": (x_a[:, :4], None, 1e-6, x_a[:, :4], None, 1e-6, 3, rn(1, 4, 1, 2 * D), rn(1, 4, 1, 2 * D)),
        "halves_of_two_dtypes": (x_a, None, 1e-6, x_b.bfloat16(), None, 1e-6, 1, cos, sin),
        "heads_share_trig": (rn(2, Sa, 8, D), rn(D), 1e-6, rn(2, Sb, 8, D), rn(D), 1e-5, 1, cos, sin),
    }
    res = {}
    for key, args in cases.items():
        x_a, w_a, eps_a, x_b, w_b, eps_b, dim, cos, sin = args
        counters.reset()
        out = torch.ops.diffusion_fuse.rms_norm_cat_rope(*args)
        snap = counters.snapshot()
        ref = rms_norm_cat_rope_reference(*args)
        res[key] = {"counters": snap, "equal": bool(torch.equal(out, ref)), "same_layout":
                    (out.dtype, out.shape, out.stride()) == (ref.dtype, ref.shape, ref.stride()),
                    "rel_err": float((ref.double() - out.double()).norm() / ref.double().norm())}
        if snap["kernel"]:  # the two halves and the RoPE, op for op, from the rms_norm op's own outputs
            parts = [torch.ops.diffusion_fuse.rms_norm(x, w, e, None, None, None)
                     for x, w, e in ((x_a, w_a, eps_a), (x_b, w_b, eps_b))]
            composed = rope_reference(torch.cat(parts, dim), cos, sin)
            res[key]["composed_equal"] = bool(torch.equal(out.float(), composed.float()))
    return res


LANE_FORMS = ["plain", "weight", "modulate", "rope", "rope_shared", "rstd"]


def _lane_results() -> dict:
    """The lane epilogue against the row epilogue (plan_rms_norm's lane_epilogue on / off): the same IEEE ops on the
    same values, so the interpreter must give the same bits; 17 rows leave a program partly masked."""
    from diffusion_fuse.kernels.rms_norm import Tail, lane_epilogue_ok, plan_rms_norm, rms_norm_tail, stats_constexprs
    from diffusion_fuse.lowering.rms_norm import contiguous_strides, row_dims

    g = torch.Generator().manual_seed(3)
    res = {}
    for D in (32, 64, 128):
        for dt in (torch.float32, torch.bfloat16):
            for form in LANE_FORMS:
                H = 8 if form == "rope_shared" else 3
                x = (torch.randn(1, 17, H, D, generator=g) * torch.logspace(-2, 2, D)).to(dt)
                w = None if form in ("plain", "rstd") else torch.randn(D, generator=g).to(dt)
                scale = shift = None
                if form == "modulate":
                    scale, shift = (torch.randn(1, 1, 1, D, generator=g).to(dt) for _ in range(2))
                if form.startswith("rope"):
                    scale, shift = (torch.randn(1, 17, 1, D, generator=g) for _ in range(2))  # cos, sin (fp32)
                x[0, 1] = 0.0  # RoPE's -0
                if form.startswith("rope"):
                    tail, final = rms_norm_tail(dt, w, None, None, None)
                elif form == "rstd":
                    tail, final = Tail(c2=dt), dt
                else:
                    tail, final = rms_norm_tail(dt, w, scale, shift, None)
                st = contiguous_strides(x.shape)
                outs = []
                for lane in (False, True):
                    launch = plan_rms_norm(x, x.shape, st, final, w, None, 1e-6, scale, shift, tail,
                                           row_dims(x, st, scale, shift), store_rstd=form == "rstd",
                                           rope=form.startswith("rope"), lane_epilogue=lane)
                    outs.append(launch(x, w, None, scale, shift))
                (y0, r0), (y1, r1) = outs
                res[f"D={D} {str(dt)[6:]} {form}"] = {
                    "eligible": lane_epilogue_ok(stats_constexprs(D), 1, 1),
                    "equal": bool(torch.equal(y0.view(torch.int16) if dt == torch.bfloat16 else y0.view(torch.int32),
                                              y1.view(torch.int16) if dt == torch.bfloat16 else y1.view(torch.int32))),
                    "rstd_equal": r0 is None or bool(torch.equal(r0.view(torch.int32), r1.view(torch.int32))),
                    "changed_by_the_norm": bool(not torch.equal(y1.float(), x.float()))}
    return res


def worker() -> dict:
    return {"order": _order_results(), "dispatch": _dispatch_results(), "model": _model_results(),
            "rope": _rope_results(), "cat_rope": _cat_rope_results(), "lanes": _lane_results()}


@pytest.fixture(scope="module")
def results():
    return run_worker(__file__)


@pytest.mark.parametrize("D", DIMS)
def test_kernel_sums_in_eagers_order_bit_for_bit(results, D):
    from diffusion_fuse.kernels.rms_norm import row_groups

    assert row_groups(D) == (4 if D <= 512 else 1)  # the default: several row groups per program for short rows
    cases = {k: v for k, v in results["order"].items() if k.startswith(f"D={D} ")}
    assert len(cases) == 2 * len(ROWS)
    bad = {k: v for k, v in cases.items() if not (v["rstd_equal"] and v["y_equal"])}
    assert not bad, bad


@pytest.mark.parametrize("shape, want", [((1, 4608, 24, 128), 2), ((2, 9, 8, 64), 1), ((2, 9, 3, 64), None),
                                         ((1, 9, 1, 8), None), ((1, 4096, 16, 128), 4), ((1, 77, 24, 1000), None)])
def test_rope_programs_share_a_cos_sin_row_when_their_rows_divide_the_heads(shape, want):
    from diffusion_fuse.kernels.rms_norm import shared_trig_groups
    from diffusion_fuse.lowering.rms_norm import contiguous_strides as _contiguous
    from diffusion_fuse.lowering.rms_norm import row_dims as _rows

    x = torch.empty(shape)
    cos = torch.empty(1, shape[1], 1, shape[3]).expand(*shape)
    assert shared_trig_groups(shape[3], _rows(x, _contiguous(x.shape), cos, cos)) == want


def test_the_lane_epilogue_gives_the_row_epilogues_bits(results):
    lanes = results["lanes"]
    assert len(lanes) == 3 * 2 * len(LANE_FORMS)
    bad = {k: v for k, v in lanes.items() if not (v["eligible"] and v["equal"] and v["rstd_equal"]
                                                  and v["changed_by_the_norm"])}
    assert not bad, bad


@pytest.mark.parametrize("D, x_sd, o_sd, want", [(32, 1, 1, True), (64, 1, 1, True), (128, 1, 1, True),
                                                 (16, 1, 1, False), (24, 1, 1, False), (200, 1, 1, False),
                                                 (256, 1, 1, False), (3072, 1, 1, False), (128, 2, 1, False),
                                                 (128, 1, 3, False)])
def test_the_lane_epilogue_takes_full_rows_inside_a_warp_with_unit_stride(D, x_sd, o_sd, want):
    from diffusion_fuse.kernels.rms_norm import lane_epilogue_ok, stats_constexprs

    assert lane_epilogue_ok(stats_constexprs(D), x_sd, o_sd) == want


def _shuffles(layout: str) -> str:
    """A ttgir with one warp shuffle whose state has ``layout``."""
    return (f"#blocked = {layout}\n    %b = tt.elementwise_inline_asm \"shfl.sync.bfly.b32 $0, $1, $2, 0x1f, -1;\" "
            f"%a, %c : tensor<512xi32, #blocked> -> tensor<512xi32, #blocked> loc(#loc1)\n")


class _Build:
    def __init__(self, ttgir: str) -> None:
        self.asm = {"ttgir": ttgir}


def _launches(builds: list, ran: list) -> tuple:
    """Lane and row launches whose ``warmup`` gives ``builds`` in turn (the last one from then on) and whose calls
    append their names to ``ran``."""

    class Kernel:
        def warmup(self, *args, grid, **kw):
            return builds.pop(0) if len(builds) > 1 else builds[0]

    class Launch:
        def __init__(self, name):
            self.name, self.kernel, self.grid, self.constexprs, self.options = name, Kernel(), (1,), {}, {}

        def __call__(self, *args):
            ran.append(self.name)

    return Launch("lane"), Launch("rows")


def test_a_lane_build_with_other_shuffle_layouts_runs_the_row_epilogue(caplog):
    """The first call checks the lane build's shuffle layouts; a build Triton laid out otherwise is not run."""
    from diffusion_fuse.kernels import rms_norm as rk

    bad = "#ttg.blocked<{sizePerThread = [1], threadsPerWarp = [32], warpsPerCTA = [2], order = [0]}>"
    ran = []
    before = len(rk.LANE_EPILOGUE_REJECTED)
    choice = rk._LaneOrRows(*_launches([_Build(_shuffles(bad))], ran), 4)
    with caplog.at_level("WARNING", logger="diffusion_fuse"):
        choice(1)
        choice(2)
    assert ran == ["rows", "rows"]
    assert len(rk.LANE_EPILOGUE_REJECTED) == before + 1 and "warpsPerCTA = [2]" in rk.LANE_EPILOGUE_REJECTED[-1]
    assert any("lane epilogue not taken" in r.message for r in caplog.records)
    good = _Build(_shuffles("#ttg.slice<{dim = 1, parent = #blocked1}>") + (
        "#blocked1 = #ttg.blocked<{sizePerThread = [1, 4], threadsPerWarp = [32, 1], warpsPerCTA = [4, 1], "
        "order = [1, 0]}>\n"))
    ran.clear()
    choice = rk._LaneOrRows(*_launches([good], ran), 4)
    choice(1)
    assert ran == ["lane"] and rk.lane_layout_problem(good, 4) is None


def test_a_deferred_lane_build_leaves_the_choice_to_the_next_call():
    """A dry run (lowering/precompile.py) skips the lane build (``warmup`` gives None): nothing is launched or
    rejected then, and the next call checks the build."""
    from diffusion_fuse.kernels import rms_norm as rk

    good = _Build(_shuffles("#ttg.blocked<{sizePerThread = [1], threadsPerWarp = [32], warpsPerCTA = [4], "
                            "order = [0]}>"))
    ran = []
    before = len(rk.LANE_EPILOGUE_REJECTED)
    choice = rk._LaneOrRows(*_launches([None, good], ran), 4)
    choice(1)
    assert ran == [] and choice.active is None
    choice(2)
    choice(3)
    assert ran == ["lane", "lane"] and len(rk.LANE_EPILOGUE_REJECTED) == before


def test_every_row_group_count_sums_in_eagers_order(results):
    cases = {k: v for k, v in results["order"].items() if k.startswith("groups=")}
    assert len(cases) == 12 and all(v["rstd_equal"] for v in cases.values()), cases


def test_the_order_check_can_fail(results):
    # The inputs are chosen so that summing in another order changes the bits: the check above
    # tells eager's tree from a sequential sum.
    differs = [v["sequential_differs"] for k, v in results["order"].items()
               if k.startswith("D=") and not k.startswith(("D=16 ", "D=24 "))]
    assert sum(differs) > len(differs) // 2


@pytest.mark.parametrize("key", ["qk_norm_4d", "qk_norm_eps_none", "across_heads_modulate_cast", "transposed_rows",
                                 "fp16_no_weight"])
def test_rms_norm_guard_accepts_and_the_kernel_runs(results, key):
    r = results["dispatch"][f"rms_norm:{key}"]
    assert r["counters"]["kernel"] == {"rms_norm": 1} and r["counters"]["fallback"] == {}
    assert r["same_layout"] and r["rel_err"] < 1e-2, r  # the interpreter truncates to bf16 where CUDA rounds


@pytest.mark.parametrize("key, reason", [
    ("misaligned", "x is not 8-byte aligned (eager takes its non-vectorized RMSNorm)"),
    ("odd_D", "D=30 (kernel takes multiples of 4 up to 16384"),
    ("weight_other_dtype", "weight is not a contiguous [64] torch.bfloat16 tensor"),
    ("float64", "unsupported dtype (x torch.float64"),
    ("rows_over_4_dims", "x's rows span more than 3 strided dims"),
])
def test_rms_norm_guard_rejections_take_the_reference_path_and_are_counted(results, key, reason):
    r = results["dispatch"][f"rms_norm:{key}"]
    assert r["equal"] and r["counters"]["kernel"] == {}
    ((got, n),) = r["counters"]["fallback"]["rms_norm"].items()
    assert got.startswith(reason) and n == 1, got


@pytest.mark.parametrize("key", ["diffusers_bf16_weight", "composite_fp32_weight", "diffusers_bias_modulate",
                                 "transposed_rows", "odd_D"])
def test_rms_norm_chain_kernel_is_within_tolerance_with_the_reference_layout(results, key):
    r = results["dispatch"][f"rms_norm_chain:{key}"]
    assert r["counters"]["kernel"] == {"rms_norm_chain": 1} and r["counters"]["fallback"] == {}
    assert r["same_layout"] and r["rel_err"] < 3e-2, r  # up to six bf16 truncations in the interpreter


@pytest.mark.parametrize("key", ["single_block_bf16", "single_block_fp32", "no_weight_fp32_rows_over_3_dims",
                                 "one_row_pair_block", "heads_share_trig_fp32", "flux_heads_share_trig_bf16"])
def test_rms_norm_rope_kernel_runs_and_its_epilogue_is_ropes_ops(results, key):
    r = results["rope"][key]
    assert r["counters"]["kernel"] == {"rms_norm_rope": 1} and r["counters"]["fallback"] == {}, r
    assert r["same_layout"] and r["rel_err"] < 2e-2, r  # the norm's order differs from the CPU reference's
    if "fp32" in key or key == "one_row_pair_block":  # fp32: the interpreter rounds as torch does, op for op
        assert r["epilogue_equal"], r




@pytest.mark.parametrize("key", ["double_block_fp32", "double_block_bf16", "cos_broadcast_along_cat",
                                 "heads_share_trig"])
def test_rms_norm_cat_rope_writes_both_halves_with_their_rope(results, key):
    r = results["cat_rope"][key]
    assert r["counters"]["kernel"] == {"rms_norm_cat_rope": 1} and r["counters"]["fallback"] == {}, r
    assert r["same_layout"] and r["rel_err"] < 2e-2, r
    if "bf16" not in key:  # fp32: the interpreter rounds as torch does, op for op
        assert r["composed_equal"], r


@pytest.mark.parametrize("family, key, reason", [
    ("rope", "cos_fp16", "cos/sin are torch.float16/torch.float32"),
    ("rope", "cos_strided_along_D", "cos is not contiguous along D"),
    ("cat_rope", "cat_over_D", "cat dim 3 is not a row dim of 4-dim inputs"),
    ("cat_rope", "halves_of_two_dtypes", "halves differ: torch.float32/torch.bfloat16"),
])
def test_rope_guard_rejections_take_the_reference_path(results, family, key, reason):
    r = results[family][key]
    assert r["equal"] and r["counters"]["kernel"] == {}
    ((got, n),) = r["counters"]["fallback"][f"rms_norm_{family}"].items()
    assert got.startswith(reason) and n == 1, got


def test_rms_norm_chain_guard_rejection_is_counted(results):
    r = results["dispatch"]["rms_norm_chain:float64"]
    assert r["equal"] and list(r["counters"]["fallback"]["rms_norm_chain"]) == [
        "unsupported dtype (x torch.float64; kernel takes ['torch.bfloat16', 'torch.float16', 'torch.float32'])"]


def test_live_kernel_that_is_not_eager_is_rejected_and_the_output_is_eager(results):
    r = results["model"]
    assert r["equal"] and r["kernel_calls"] >= 1
    ((pattern, status, reason),) = r["sites"]
    assert (pattern, status) == ("rms_norm", "rejected") and "elements differ; first at [" in reason


# ----------------------------------------------------------------------------------------
# sm_90 build (no interpreter): the kernel compiles for every configuration the guards can pick
# ----------------------------------------------------------------------------------------


def _compile_sm90(D, x="bf16", push_fma=True, tail=None, out="bf16", row_dims=1, rope=False, groups=None,
                  shared_trig=False, l2_const=None, flat=False, lane=False):
    """Compile ``_rms_norm_kernel`` for sm_90 as the launcher does for these operands (``l2_const``: the heads
    constant of rows over several dims, 24 by default there; ``flat``: x's and out's rows evenly strided)."""
    l2_const = (24 if row_dims >= 2 else 0) if l2_const is None else l2_const
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from diffusion_fuse.kernels import rms_norm as rk
    from diffusion_fuse.kernels.launch import EAGER_NUMERICS
    from diffusion_fuse.kernels.rms_norm import Tail

    ptr = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}
    k = rk._rms_norm_kernel
    const = dict(**rk.stats_constexprs(D, push_fma, groups), STORE_RSTD=False, ROW_DIMS=row_dims, WIDE_ROWS=False,
                 **rk.tail_constexprs(tail or Tail()), ROPE=rope, SHARED_TRIG=shared_trig, L2_CONST=l2_const,
                 N_POW2=D if D & (D - 1) == 0 else 0, X_FLAT=flat, O_FLAT=flat, LANE_EPI=lane)
    # M, L1, L2 as Triton's JIT types them for values below 2**31
    sig = {**{p: ptr[x] for p in ("X", "W", "B", "SCALE", "SHIFT")}, "OUT": ptr[out], "RSTD": "*fp32",
           **({"SCALE": "*fp32", "SHIFT": "*fp32"} if rope else {}),
           "M": "i32", "N": "i32", "L1": "i32", "L2": "i32", "eps": "fp32",
           **{n: "i64" for n in k.arg_names[12:len(k.arg_names) - len(const)]}, **{n: "constexpr" for n in const}}
    # As the launcher compiles contiguous, 16-byte aligned operands: unit strides along D are
    # constants, pointers and row strides carry Triton's divisibility-by-16 specialization.
    unit = {"x_sd": 1, "o_sd": 1}
    sig.update({n: "constexpr" for n in unit})
    names = k.arg_names
    aligned = ["X", "W", "B", "SCALE", "SHIFT", "OUT", "RSTD"] + [n for n in names if n[:2] in ("x_", "sc", "sh", "o_")
                                                                   and n not in unit]
    aligned += ["N"] if D % 16 == 0 else []
    src = ASTSource(fn=k, signature=sig, constexprs={(names.index(n),): v for n, v in {**const, **unit}.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    return const, triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4,
                                                                               **EAGER_NUMERICS})


def lane_layouts(groups: int) -> set[str]:
    """Layouts of a [groups * 128] state whose lane f is thread f % 128, register f // 128 (4 warps)."""
    from test_compile_sm90 import IDENTITY_LAYOUTS

    regs = ", ".join(f"[{128 << b}]" for b in range(groups.bit_length() - 1))
    return {lay.replace("register = []", f"register = [{regs}]") for lay in IDENTITY_LAYOUTS}


@pytest.mark.parametrize("D, groups", [(16, 1), (64, 1), (128, 1), (16, None), (64, None), (128, None), (128, 8),
                                       (3072, None), (5120, None)])
def test_rms_norm_compiles_for_sm90_with_only_the_push_fma(D, groups):
    import torch as _torch
    from test_compile_sm90 import shuffle_layouts_any

    from diffusion_fuse.kernels.rms_norm import Tail

    tail = Tail(w=_torch.float32, c2=_torch.bfloat16)  # _fused_rms_norm's w * (x * rstd), rounded to bf16
    const, ck = _compile_sm90(D, tail=tail, groups=groups)
    ptx = ck.asm["ptx"]
    per_thread = const["ROWS"] * const["LPR"] // 128  # lanes (row groups) each thread holds
    assert ck.asm.get("cubin") and per_thread == (groups or (4 if D <= 512 else 1))
    # one push per element a thread owns: no lane is computed twice (a replicated layout would be)
    assert len(re.findall(r"\bfma\.rn\.f32", ptx)) == 4 * const["N_ITERS"] * per_thread
    assert "rsqrt.approx" in ptx and ".approx" not in ptx.replace("rsqrt.approx", "")
    assert "rsqrt.approx.f32" in ptx and ".ftz" not in ptx  # eager's rsqrtf keeps a subnormal input
    # var = sum / N: an IEEE division, or for N = 2**k the multiply by 2**-k (the same real number, rounded once)
    pow2 = D & (D - 1) == 0
    assert ("div.rn.f32" in ptx) != pow2
    if pow2:
        inv = f"0f{struct.unpack('<I', struct.pack('<f', 1.0 / D))[0]:08X}"
        assert re.search(r"mul\.rn\.f32\s+%r\d+, %r\d+, " + inv + ";", ptx)
    # x: 4 bf16 per load (one scalar load is the weight when a row is 128 elements, one per thread)
    assert "ld.global.v2.b32" in ptx and ptx.count("ld.global.b16") <= (D == 128)
    # every x load comes before the first shuffle: all row groups' bytes are in flight at once
    first_shfl = ptx.index("shfl.sync.down")
    assert ptx[:first_shfl].count("ld.global.v2.b32") >= const["N_ITERS"] * per_thread
    layouts = shuffle_layouts_any(ck.asm["ttgir"])
    assert layouts and layouts <= lane_layouts(per_thread), layouts  # lane f of the sums is thread f % 128
    _, ck = _compile_sm90(D, push_fma=False, tail=tail, groups=groups)
    assert "fma.rn.f32" not in ck.asm["ptx"]  # no contraction Triton chose on its own


@pytest.mark.parametrize("form", ["plain", "rope", "rope_shared", "modulate"])
@pytest.mark.parametrize("D", [32, 64, 128])
def test_lane_epilogue_compiles_for_sm90_reading_x_once_without_shared_memory(D, form):
    import torch as _torch

    from diffusion_fuse.kernels import rms_norm as rk
    from diffusion_fuse.kernels.rms_norm import Tail

    tail = Tail(w=_torch.float32, c2=_torch.bfloat16)
    if form == "modulate":
        tail = Tail(w=_torch.float32, c2=_torch.bfloat16, t=_torch.bfloat16, u=_torch.bfloat16, v=_torch.bfloat16)
    rope = form.startswith("rope")
    const, ck = _compile_sm90(D, tail=tail, rope=rope, shared_trig=form == "rope_shared",
                              groups=2 if form == "rope_shared" else None, row_dims=2 if rope else 1, flat=True,
                              lane=True)
    ptx = ck.asm["ptx"]
    per_thread = const["ROWS"] * const["LPR"] // 128
    assert rk.lane_epilogue_ok(const, 1, 1)
    assert rk.lane_layout_problem(ck, per_thread) is None  # lane f of the sums is thread f % 128
    # no relayout through shared memory, no barrier: the sum reaches its row's lanes by butterflies
    assert ck.metadata.shared == 0 and "bar.sync" not in ptx and "shfl.sync.down" not in ptx
    assert ptx.count("shfl.sync.bfly") == (const["LPR"].bit_length() - 1) * per_thread
    # x is read once: one 8-byte vector a row group, all before the first shuffle
    first = ptx.index("shfl.sync.bfly")
    assert ptx[:first].count("ld.global.v2.b32") >= per_thread
    assert len(re.findall(r"\bfma\.rn\.f32", ptx)) == 4 * per_thread  # eager's push, and no other FMA
    assert "rsqrt.approx.f32" in ptx and ".ftz" not in ptx
    assert (("neg.f32" in ptx) == rope)


@pytest.mark.parametrize("D", [128, 3072])
def test_row_addressing_takes_no_64_bit_division(D):
    # rows of one dimension (QK norm on [B, S, H, 128] made contiguous): no division at all; rows over
    # three dimensions (strided per-token layouts): 32-bit divisions only (a 64-bit one is a long routine)
    _, flat = _compile_sm90(D, row_dims=1)
    assert not re.search(r"\b(div|rem)\.[su](32|64)\b", flat.asm["ptx"])
    for row_dims in (2, 3):
        ptx = _compile_sm90(D, row_dims=row_dims, l2_const=0)[1].asm["ptx"]
        assert re.search(r"\b(div|rem)\.[su]32\b", ptx) and not re.search(r"\b(div|rem)\.[su]64\b", ptx)
    # the heads as a constant (what the launcher compiles): rows over two dims divide by a multiply-high
    for flat_rows in (False, True):
        ptx = _compile_sm90(D, row_dims=2, l2_const=24, flat=flat_rows)[1].asm["ptx"]
        assert not re.search(r"\b(div|rem)\.[su](32|64)\b", ptx)


@pytest.mark.parametrize("shape, row_dims", [((1, 4608, 24, 128), 1), ((2, 7, 64), 1), ((3, 64), 1),
                                             ((2, 3, 64), 1)])
def test_contiguous_rows_are_one_dim(shape, row_dims):
    import torch as _torch

    from diffusion_fuse.kernels.rms_norm import row_dims as dims
    from diffusion_fuse.kernels.rows import row_layout

    x = _torch.empty(shape)
    (L0, L1, _), _ = row_layout(x.shape, x.stride(), x.stride())
    assert dims(L0, L1) == row_dims


@pytest.mark.parametrize("D, groups, shared", [(128, None, False), (128, 2, True), (3072, None, False)])
def test_rms_norm_rope_epilogue_compiles_for_sm90_without_contraction_or_partner_loads(D, groups, shared):
    import torch as _torch

    from diffusion_fuse.kernels.rms_norm import Tail

    tail = Tail(w=_torch.float32, c2=_torch.bfloat16)
    const, ck = _compile_sm90(D, tail=tail, rope=True, row_dims=2, groups=groups, shared_trig=shared)
    ptx = ck.asm["ptx"]
    # the norm's pushes are the only FMAs: y * cos + rot * sin stays two rounded products and a rounded sum
    assert len(re.findall(r"\bfma\.rn\.f32", ptx)) == 4 * const["N_ITERS"] * const["ROWS"] * const["LPR"] // 128
    # the partner's negation is neg.f32 (-0 for +0, as eager's neg), not Triton's unary minus (0 - x: +0 for +0;
    # the interpreter negates exactly, so only this and the GPU test can tell)
    assert "neg.f32" in ptx and not re.search(r"\bsub\.(rn\.)?f32", ptx)
    # the rotation partner comes from registers: x is read with vector loads only, as without the epilogue
    plain = _compile_sm90(D, tail=tail, row_dims=2)[1].asm["ptx"]
    assert ptx.count("ld.global.b16") == plain.count("ld.global.b16")
    assert "ld.global.v2.b32" in ptx or "ld.global.v4.b32" in ptx


def test_rms_norm_chain_tail_with_modulate_compiles_for_sm90():
    import torch as _torch

    from diffusion_fuse.kernels.rms_norm import Tail

    bf = _torch.bfloat16
    _, ck = _compile_sm90(2240, tail=Tail(c1=bf, w=bf, b=bf, t=bf, u=bf, v=bf))
    assert ck.asm.get("cubin")


@pytest.mark.parametrize("shape, mod_shape, rope, heads_const, flat", [
    ((1, 4608, 24, 128), (1, 4608, 1, 128), True, 24, True),  # FLUX QK norm + RoPE: cos/sin broadcast over heads
    ((2, 300, 8, 64), (2, 300, 1, 64), True, 8, True),
    ((1, 24, 300, 128), (1, 1, 300, 128), True, 0, True),  # [B, H, S, D]: the tables vary along the innermost (S)
    ((2, 300, 2048), (2, 1, 2048), False, 0, True),  # [B, S, D], per-batch modulate: the innermost is the tokens
    ((1, 4608, 24, 128), None, False, 0, False),  # contiguous, no modulate: one dim of rows
])
def test_only_the_heads_become_a_compile_time_constant(shape, mod_shape, rope, heads_const, flat):
    # kernels/rms_norm.py addressing_constexprs: a dim that changes with the resolution must stay an argument
    # (one compile for every resolution); x's and out's evenly strided rows take one multiply
    import torch as _torch

    from diffusion_fuse.kernels.rms_norm import addressing_constexprs
    from diffusion_fuse.lowering.rms_norm import contiguous_strides as _contiguous
    from diffusion_fuse.lowering.rms_norm import row_dims as _rows

    x = _torch.empty(shape)
    mod = None if mod_shape is None else _torch.empty(mod_shape)
    rows = _rows(x, _contiguous(x.shape), mod, mod)
    const = addressing_constexprs(shape[-1], rows, rope)
    assert const["L2_CONST"] == heads_const
    assert const["X_FLAT"] == const["O_FLAT"] == flat
    assert const["N_POW2"] == (shape[-1] if shape[-1] & (shape[-1] - 1) == 0 else 0)
    if mod_shape is not None:  # a second resolution (twice the tokens): the same constants, the same kernel
        tok = 1 if heads_const or len(shape) == 3 else 2  # the tokens' dim: [B, S, ...] or [B, H, S, D]
        grow = lambda s: tuple(2 * n if i == tok and n > 1 else n for i, n in enumerate(s))  # noqa: E731
        other, other_mod = _torch.empty(grow(shape)), _torch.empty(grow(mod_shape))
        assert addressing_constexprs(shape[-1], _rows(other, _contiguous(other.shape), other_mod, other_mod),
                                     rope) == const


if __name__ == "__main__":
    worker_main(worker)
