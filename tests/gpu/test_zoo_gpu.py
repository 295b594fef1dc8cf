"""The diffusers zoo on CUDA: every model in bf16 (``DIFFUSION_FUSE_FULL=1``: fp32 too) compiled with the
lossless tier, its Triton kernels live.

Per model, as tests/test_zoo.py on the CPU: the output equals eager's bit for bit, no pass or matcher failed, and
every site is kept. On CUDA the guards run the kernels (the CPU takes every op's reference path), so a site whose
kernel differs from eager here is rejected by the verifier and shows in ``not_kept``. The cases run in worker
processes (spawned: each its own CUDA context), one per four CPU cores; a table of sites, kept sites and kernel
calls per model is printed at the end.
"""

import concurrent.futures
import multiprocessing
import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from test_zoo import FULL, XFAIL, run_case  # noqa: E402

from diffusion_fuse.testing.zoo import ZOO  # noqa: E402

DTYPES = ("bf16", "fp32") if FULL else ("bf16",)
# known failures before the backend runs, each with its reason (strict: one that starts passing fails)
GPU_XFAIL = {**XFAIL}
if torch.__version__ < (2, 12):  # a TorchVersion: compared as a version
    GPU_XFAIL["ace_step", "bf16"] = GPU_XFAIL["ace_step", "fp32"] = (
        "Dynamo 2.11 cannot trace diffusers' AttentionBackendName(...) in ACE-Step's forward (sourceless builder)")
SUMMARY: dict = {}


@pytest.fixture(scope="module")
def results():
    cases = [(n, d) for n in ZOO for d in DTYPES]
    ctx = multiprocessing.get_context("spawn")
    workers = max(1, min((os.cpu_count() or 4) // 4, 8))
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        futures = {case: pool.submit(run_case, *case, "cuda") for case in cases}
        return {case: f.result() for case, f in futures.items()}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_model_is_bitwise_eager_on_cuda(name, dtype, results, request):
    if (name, dtype) in GPU_XFAIL:
        request.applymarker(pytest.mark.xfail(reason=GPU_XFAIL[name, dtype], strict=True))
    r = results[name, dtype]
    SUMMARY[name, dtype] = r
    assert "raised" not in r, r["raised"]
    assert not r["degenerate"], "eager output is empty, all zero or not finite"
    assert r["bitwise"], r["table"]
    assert not r["errors"], "\n".join(r["errors"])
    assert not r["not_kept"], r["table"]


def teardown_module(module):
    print("\nzoo on CUDA (model, dtype, bitwise, sites, not kept, kernel calls):")
    for (name, dtype), r in sorted(SUMMARY.items()):
        if "raised" in r:
            print(f"  {name} {dtype} raised")
            continue
        print(f"  {name} {dtype} {r['bitwise']} {r['sites']} {len(r['not_kept'])} {r['kernel_calls']}")
