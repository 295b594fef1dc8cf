"""CPU checks of kernels/lut16.py in Triton's interpreter: the table kernel gives eager's bits on all 65,536
bf16 patterns (the table is CPU eager's here; tests/gpu/test_lut16_gpu.py does the same with CUDA eager), and
``build_lut16`` explains why an op gets no table."""

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

from diffusion_fuse.testing.pointwise import LUT16_UNARY

# every op of LUT16_UNARY but erf's gelu (the interpreter's CPU erf table needs a wider window), and relu: every
# magnitude under a rule, an empty window
OPS = [*[k for k in LUT16_UNARY if k != "gelu_erf"], "relu"]


def worker() -> dict:
    from diffusion_fuse.kernels.lut16 import all_patterns, build_lut16, lut16_triton

    res = {}
    for name in OPS:
        op = torch.relu if name == "relu" else LUT16_UNARY[name]
        lut, why = build_lut16(op, torch.bfloat16, "cpu")
        x = all_patterns(torch.bfloat16, "cpu")
        res[name] = {"why": why, "span": lut.span if lut else None, "entries": lut.table.numel() if lut else None,
                     "differ": int((lut16_triton(x, lut).view(torch.int16) != op(x).view(torch.int16)).sum())
                     if lut else None}
    res["neg_fp16"] = build_lut16(torch.neg, torch.float16, "cpu")[1]  # a sign flip is no rule: no table fits
    res["fp32"] = build_lut16(torch.exp, torch.float32, "cpu")[1]
    return res


@pytest.fixture(scope="module")
def results():
    return run_worker(__file__)


@pytest.mark.parametrize("op", list(OPS))
def test_table_kernel_is_eager_on_every_bf16_pattern(results, op):
    r = results[op]
    assert r["why"] == "" and r["differ"] == 0, r
    assert r["entries"] in (4096, 8192)


def test_gelu_tanh_window(results):
    # gelu-tanh: only magnitudes between |x| ~ 2^-9 and ~5 need entries of their own; relu needs none
    assert 1000 < results["gelu_tanh"]["span"] < 1700
    assert results["relu"]["span"] == 0


def test_no_table_says_why(results):
    assert "magnitudes between the rules' ranges" in results["neg_fp16"]
    assert "bf16/fp16" in results["fp32"]


if __name__ == "__main__":
    worker_main(worker)
