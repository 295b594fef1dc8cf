"""CPU checks, in Triton's interpreter, of the kernels reading a Wan timestep table as table + temb.

The operands are the views the patterns emit (patterns/table_slice.py): rows of the fp32 table
[1,6,D] / [1,1,6,D] and of the temb [B,6,D] / per-token [B,S,6,D] (bf16), selected or narrowed at
the slice index. Outputs are fp32 where possible, so the only difference from the reference is
the interpreter's rsqrt: a wrong row, stride or operand shows as an O(1) error. Bit-exactness is
tests/gpu/test_table_slice_gpu.py's job.
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

B, S = 2, 5
DIMS = (96, 512)  # 512: a UNIFORM row (D % 512 == 0), held in registers


def tables(D: int, per_token: bool, chunks: int = 6, temb_dtype=torch.bfloat16, seed=0):
    """(table view, temb) whose sum eager would chunk: Wan 2.2 TI2V per token, else Wan 2.1."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(1, chunks, D, generator=g) / D**0.5
    if per_token:
        return table.unsqueeze(0), torch.randn(B, S, chunks, D, generator=g).to(temb_dtype)
    return table, torch.randn(B, chunks, D, generator=g).to(temb_dtype)


def row(t: torch.Tensor, per_token: bool, j: int) -> torch.Tensor:
    """Slice j as the pattern reads it: select (per token, squeezed) or narrow (kept dim)."""
    return t.select(2, j) if per_token else t.narrow(1, j, 1)


def cases() -> dict:
    g = torch.Generator().manual_seed(1)
    out = {}
    for D, per_token in ((D, p) for D in DIMS for p in (False, True)):
        tag = f"{'per_token' if per_token else 'b6d'}_{D}"
        table, temb = tables(D, per_token)
        x = torch.randn(B, S, D, generator=g).bfloat16()
        res = torch.randn(B, S, D, generator=g).bfloat16() * 4
        ff = torch.randn(B, S, D, generator=g).bfloat16()
        w, b = torch.randn(D, generator=g), torch.randn(D, generator=g)
        sh = (row(table, per_token, 0), row(temb, per_token, 0))
        sc = (row(table, per_token, 1), row(temb, per_token, 1))
        gate = (row(table, per_token, 2), row(temb, per_token, 2))
        # norm1: norm_modulate(x, ..., scale, shift, ln f32, out fp32 here (bf16 in the model), scale_t, shift_t)
        out[f"ln_modulate_{tag}"] = ("ln", (x, None, None, 1e-6, sc[0], sh[0], torch.float32, None, sc[1], sh[1]))
        # attention residual + norm2: r bf16, affine LN of r.float(), no modulate, output fp32
        out[f"norm2_{tag}"] = ("grl", (res, x, gate[0], w, b, 1e-6, None, None, None, gate[1], None, None,
                                       torch.bfloat16, torch.float32))
        # FFN residual + the output norm: its own 2-chunk table, temb [B, D] (or [B, S, D]) broadcast along the chunks
        out_table, out_temb = tables(D, per_token, chunks=2, seed=3)
        out_temb = out_temb[:, :, :1] if per_token else out_temb[:, :1]
        o_sh = (row(out_table, per_token, 0), out_temb.squeeze(2) if per_token else out_temb)
        o_sc = (row(out_table, per_token, 1), o_sh[1])
        out[f"norm_out_{tag}"] = ("grl", (res, ff, gate[0], None, None, 1e-6, o_sc[0], o_sh[0], None, gate[1],
                                          o_sc[1], o_sh[1], torch.bfloat16, torch.float32))
        # FFN residual alone (block end under regional compilation)
        out[f"residual_{tag}"] = ("gr", (res, ff, gate[0], gate[1], torch.bfloat16))
        out[f"residual_fp32_{tag}"] = ("gr", (res.float(), ff.float(), gate[0], gate[1].float(), None))
    return out


def worker() -> dict:
    import diffusion_fuse  # noqa: F401  (registers the ops)
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.lowering import gated_residual as gr
    from diffusion_fuse.lowering import gated_residual_norm_modulate as grl
    from diffusion_fuse.lowering import norm_modulate as ln
    from diffusion_fuse.lowering.gated_residual import gated_residual
    from diffusion_fuse.lowering.norm_modulate import norm_modulate

    fns = {"ln": (ln.norm_modulate, ln.SPEC.run_kernel),
           "grl": (grl.gated_residual_norm_modulate, grl.SPEC.run_kernel),
           "gr": (gr.gated_residual, gr.SPEC.run_kernel)}

    def rel(a, b):
        return float((a.double() - b.double()).norm() / a.double().norm())

    res: dict = {"kernel": {}, "dispatch": {}}
    for name, (kind, args) in cases().items():
        ref_fn, kernel_fn = fns[kind]
        ref, got = ref_fn(*args), kernel_fn(*args)
        ref, got = (ref, got) if isinstance(ref, tuple) else ((ref,), (got,))
        res["kernel"][name] = {"dtypes": [[str(a.dtype), str(b.dtype)] for a, b in zip(ref, got)],
                               "errs": [rel(a, b) for a, b in zip(ref, got)]}
        if kind == "gr" and got[0].dtype == torch.bfloat16:
            # r is rounded once from the fp32 sum; the interpreter rounds toward zero there
            r32 = gated_residual(*args[:4])
            truncated = (r32.view(torch.int32) & -65536).view(torch.float32).bfloat16()
            res["kernel"][name]["r_equal_truncated"] = bool(torch.equal(truncated, got[0]))

    op = torch.ops.diffusion_fuse.norm_modulate
    _, args = cases()["ln_modulate_per_token_96"]
    x, w, b, eps, sc, sh, ln_dt, out_dt, sct, sht = args
    calls = {
        "ok": args,
        "bf16_sum": (x, w, b, eps, sc.bfloat16(), sh, ln_dt, out_dt, sct, sht),
        "temb_strided_D": (x, w, b, eps, sc, sh, ln_dt, out_dt, torch.cat([sct, sct], -1)[..., ::2], sht),
    }
    for key, a in calls.items():
        counters.reset()
        out = op(*a)
        res["dispatch"][key] = {"counters": counters.snapshot(),
                                "equal_to_reference": bool(torch.equal(out, norm_modulate(*a)))}
    return res


@pytest.fixture(scope="module")
def results():
    return run_worker(__file__)


@pytest.mark.parametrize("case", list(cases()))
def test_kernel_reads_table_plus_temb_like_the_reference(results, case):
    r = results["kernel"][case]
    assert all(a == b for a, b in r["dtypes"]), r
    # No bf16 rounding in these: only the interpreter's rsqrt differs. Elsewhere the interpreter
    # truncates where CUDA rounds (bf16 r). A wrong row, stride or operand is an O(1) error.
    fp32_only = case.startswith(("ln_modulate_", "residual_fp32_"))
    assert all(e < (1e-5 if fp32_only else 1e-2) for e in r["errs"]), r
    assert r.get("r_equal_truncated", True), r


def test_guard_takes_fp32_table_sums(results):
    assert results["dispatch"]["ok"]["counters"]["kernel"] == {"norm_modulate": 1}


@pytest.mark.parametrize("key, reason", [
    ("bf16_sum", "scale + scale_temb is not an fp32 sum"),
    ("temb_strided_D", "scale_temb is not contiguous along D"),
])
def test_guard_rejections_take_the_reference_path(results, key, reason):
    r = results["dispatch"][key]
    assert r["equal_to_reference"] and r["counters"]["kernel"] == {}
    ((got, n),) = r["counters"]["fallback"]["norm_modulate"].items()
    assert got.startswith(reason) and n == 1, got


if __name__ == "__main__":
    worker_main(worker)
