"""CPU checks of kernels/grouped_gemv.py in Triton's interpreter: the member tables, slots, masks, biases and
both K forms, and its guard.

Integer-valued inputs make every sum exact in any order, so the kernel must equal ``torch.addmm`` bit for bit
whatever form a member takes. One case tells the forms apart: K = 512 in tiles of 128 (two a half) with the
partial sums (2^24, 0 | 1, 1) and a bias of -2^24: one chain rounds 2^24 + 1 back to 2^24 twice (0 after the
bias), two halves keep 1 + 1 (2 after it). Whether a form is cuBLAS's is the GPU test's job
(tests/gpu/test_grouped_gemv_gpu.py).
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

# (rows M, K, member row counts, which members have a bias)
CASES = [(1, 256, (192, 64, 40), (True, False, True)), (2, 512, (128, 8), (True, True)),
         (3, 64, (72, 64, 16, 200), (False, True, False, True))]
FORMS = ("ones", "twos", "mixed")


def _ints(g, *shape):
    return torch.randint(-3, 4, shape, generator=g).to(torch.bfloat16)


def _reference(x, ws, bs):
    return torch.cat([(torch.addmm(b, x, w.t()) if b is not None else torch.mm(x, w.t())).reshape(-1)
                      for w, b in zip(ws, bs)])


def _forms(kind, n):
    return {"ones": [1] * n, "twos": [2] * n, "mixed": [(None, 2, 1)[i % 3] for i in range(n)]}[kind]


def worker() -> dict:
    from diffusion_fuse.kernels.grouped_gemv import plan_grouped_gemv

    res = {}
    for ci, (m, k, sizes, biased) in enumerate(CASES):
        g = torch.Generator().manual_seed(ci)
        x = _ints(g, m, k)
        ws = [_ints(g, n, k) for n in sizes]
        bs = [_ints(g, n) if b else None for n, b in zip(sizes, biased)]
        want = _reference(x, ws, bs)
        for kind in FORMS:
            got = plan_grouped_gemv(x, ws, bs, _forms(kind, len(ws)))(x, ws, bs)
            res[f"{ci}-{kind}"] = [list(got.shape) == list(want.shape), bool(torch.equal(got, want))]
    # the forms apart: partial sums 2^24, 0 | 1, 1 over K tiles of 128, bias -2^24
    x = torch.zeros(1, 512, dtype=torch.bfloat16)
    w = torch.zeros(64, 512, dtype=torch.bfloat16)
    x[0, 0], w[:, 0] = 2.0 ** 12, 2.0 ** 12
    x[0, 256], w[:, 256] = 1.0, 1.0
    x[0, 384], w[:, 384] = 1.0, 1.0
    b = torch.full((64,), -(2.0 ** 24), dtype=torch.bfloat16)
    for form in (1, 2):
        res[f"apart-{form}"] = plan_grouped_gemv(x, [w], [b], [form])(x, [w], [b]).float().unique().tolist()
    # device tables live with the process (a captured CUDA graph reads them), one set per set of members
    from diffusion_fuse.kernels import grouped_gemv as gg

    res["tables_shared"] = gg._tables(x, [w], [b], [1]) is gg._tables(x, [w], [b], [1])
    cap, gg.MAX_TABLE_SETS = gg.MAX_TABLE_SETS, len(gg._live_tables)
    try:
        plan_grouped_gemv(x, [w.clone()], [b], [1])
        res["past_cap"] = "planned"
    except RuntimeError as e:
        res["past_cap"] = str(e)
    finally:
        gg.MAX_TABLE_SETS = cap
    return res


@pytest.fixture(scope="module")
def results():
    return run_worker(__file__)


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("kind", FORMS)
def test_every_member_lands_in_its_slot_with_addmms_values(results, case, kind):
    shape_ok, equal = results[f"{case}-{kind}"]
    assert shape_ok and equal


def test_form_two_adds_the_halves_form_one_carries_the_chain(results):
    assert results["apart-1"] == [0.0]
    assert results["apart-2"] == [2.0]


def test_a_plan_keeps_its_device_tables_and_too_many_sets_are_refused(results):
    assert results["tables_shared"]
    assert "sets of weights planned already" in results["past_cap"]


def test_guard_names_what_it_rejects():
    from diffusion_fuse.kernels.grouped_gemv import can_use_grouped_gemv

    x = torch.ones(1, 256, dtype=torch.bfloat16)
    w = torch.ones(64, 256, dtype=torch.bfloat16)
    assert can_use_grouped_gemv(x, [w], [None]) == (False, "device is cpu")  # no interpreter in this process
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        assert can_use_grouped_gemv(x, [w], [None]) == (True, "")
        assert "K = 48" in can_use_grouped_gemv(x[:, :48], [w[:, :48].contiguous()], [None])[1]
        assert "M <= 16" in can_use_grouped_gemv(torch.ones(17, 256, dtype=torch.bfloat16), [w], [None])[1]
        assert "contiguous" in can_use_grouped_gemv(torch.ones(2, 512, dtype=torch.bfloat16)[:, ::2], [w], [None])[1]
        assert "contiguous False" in can_use_grouped_gemv(x, [torch.ones(256, 64, dtype=torch.bfloat16).t()],
                                                          [None])[1]
        assert "aligned" in can_use_grouped_gemv(x, [w[:12]], [None])[1]
        assert "dtype torch.float32" in can_use_grouped_gemv(x.float(), [w.float()], [None])[1]
        assert "bias 0" in can_use_grouped_gemv(x, [w], [torch.ones(32, dtype=torch.bfloat16)])[1]
    finally:
        del os.environ["TRITON_INTERPRET"]


def _compile_sm90():
    """Build the kernel for sm_90 as the launcher does (its launch shape, 16-byte aligned tables and operands) at
    FLUX's K; its PTX."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from diffusion_fuse.kernels import grouped_gemv as gg
    from diffusion_fuse.kernels.launch import EAGER_NUMERICS

    k = gg._grouped_gemv_kernel
    names = k.arg_names
    const = {"K": 3072, "BLOCK_N": gg.BLOCK_N, "BLOCK_K": gg.block_k(3072), "BLOCK_M": gg.MAX_ROWS,
             "INTERPRETED": False}
    sig = {"X": "*bf16", "TILE_MEMBER": "*i32", "TILE_N0": "*i32", "W_PTRS": "*i64", "B_PTRS": "*i64",
           "N_OF": "*i32", "OUT_OF": "*i64", "FORM_OF": "*i32", "OUT": "*bf16", "M": "i32", "stride_xm": "i32",
           **{n: "constexpr" for n in const}}
    aligned = [n for n in sig if sig[n].startswith("*")] + ["stride_xm"]
    src = ASTSource(fn=k, signature=sig, constexprs={(names.index(n),): v for n, v in const.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": gg.WARPS, "num_stages": gg.STAGES, **EAGER_NUMERICS}).asm["ptx"]


def test_sm90_build_reads_weights_in_16_byte_async_copies_into_mma():
    # the weights' addresses come from a table: without the alignment hint each load is one element
    ptx = _compile_sm90()
    assert "wgmma.mma_async" in ptx  # 64 weight rows a program fill a warpgroup's wgmma
    assert "cp.async.cg.shared.global" in ptx
    assert not [ln for ln in ptx.splitlines() if "ld.global" in ln and ".b16 " in ln and "evict_first" in ln]
    assert all(", 0x10," in ln for ln in ptx.splitlines() if "cp.async.cg.shared.global" in ln)


if __name__ == "__main__":
    worker_main(worker)
