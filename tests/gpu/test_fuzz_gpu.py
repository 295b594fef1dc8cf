"""The property-based fuzz of tests/test_fuzz.py on CUDA with the Triton kernels live.

Random forms (dtype, D incl. 512-multiples that take the register-tile kernels, odd D that the
guard routes to the reference, gated or not, Wan fp32 LN, affine, per-token, swapped operands,
transposed / strided x, amplitudes 1e-4..100) through the lossless backend: the output must be
eager's bit for bit and every site must be kept by the verifier (a kernel that differed from
eager would show as a rejected site). Budget: DIFFUSION_FUSE_FUZZ_EXAMPLES (default 100).
Prints a summary; with $OUT set, writes fuzz_gpu.json.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers import bitwise_equal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz import Modulated, forms, make_inputs

import diffusion_fuse

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
EXAMPLES = int(os.environ.get("DIFFUSION_FUSE_FUZZ_EXAMPLES", "100"))
TALLY = {"examples": 0, "sites": 0, "kept": 0, "kernel_hits": 0, "guard_fallbacks": 0, "mismatches": 0}


@st.composite
def gpu_forms(draw):
    f = draw(forms())
    f["D"] = draw(st.sampled_from([4, 30, 64, 512, 1000, 1536, 3072]))
    f["S"] = draw(st.sampled_from([0, 1, 3, 17, 300]))
    return f


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(gpu_forms())
def test_compiled_equals_eager_on_cuda_with_kernels_live(form):
    torch._dynamo.reset()
    model = Modulated(form).cuda()
    args = [a.cuda() for a in make_inputs(form)]
    if form["layout"] == "transposed":  # keep the layout .cuda() copied away
        args[0] = args[0].transpose(1, 2).contiguous().transpose(1, 2)
    report = diffusion_fuse.Report()
    c = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)
    with torch.no_grad():
        ref = model(*args)
        out = c(*args)
        out2 = c(*args)  # the second call runs the verified graph alone
    sites = report.sites()
    counters = report.counters()
    TALLY["examples"] += 1
    TALLY["sites"] += len(sites)
    TALLY["kept"] += sum(s.status == "kept" for s in sites)
    TALLY["kernel_hits"] += sum(counters.get("kernel", {}).values())
    TALLY["guard_fallbacks"] += sum(sum(v.values()) for v in counters.get("fallback", {}).values())
    equal = bitwise_equal(ref, out) and bitwise_equal(ref, out2)
    TALLY["mismatches"] += (not equal) + sum(s.status != "kept" for s in sites)
    assert equal, form
    assert all(s.status == "kept" for s in sites), report.table()


def test_fuzz_summary():
    print(f"\nfuzz on CUDA: {TALLY}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "fuzz_gpu.json"), "w") as f:
            json.dump(TALLY, f, indent=2)
    assert TALLY["examples"] == 0 or TALLY["kernel_hits"] > 0, TALLY
