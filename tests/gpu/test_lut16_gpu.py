"""kernels/lut16.py on the GPU: for each op, the table of CUDA eager's outputs, looked up by the kernel, gives
eager's bits on all 65,536 bf16 patterns (and every generated chain that looks an op up is checked by
test_pointwise_gpu.py). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from diffusion_fuse.testing.pointwise import LUT16_UNARY as OPS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("op", list(OPS))
def test_table_kernel_is_eager_on_every_bf16_pattern(op):
    from diffusion_fuse.kernels.lut16 import all_patterns, build_lut16, lut16_triton

    fn = OPS[op]
    lut, why = build_lut16(fn, torch.bfloat16, "cuda")
    assert lut is not None, why
    x = all_patterns(torch.bfloat16, "cuda")
    for block, warps in ((8192, 16), (2048, 4)):
        got = lut16_triton(x, lut, block, warps)
        n = int((got.view(torch.int16) != fn(x).view(torch.int16)).sum())
        print(f"{op}: {lut.describe()}; {block}/{warps}: {n} of 65536 differ")
        assert n == 0
