import logging
import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Kernel logic runs in Triton's interpreter only in the subprocesses tests/kernels spawn;
# the rest of the suite must see the real (CPU: reference-path) dispatch.
os.environ.pop("TRITON_INTERPRET", None)
warnings.filterwarnings("ignore", message=".*should be kept in float32.*")
logging.getLogger("diffusers").setLevel(logging.ERROR)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def fused_rms_norm_kernel_on_cpu():
    """A CPU kernel for ``aten._fused_rms_norm`` (its own decomposition), so that CPU graphs hold the op as CUDA
    graphs do (a CPU build decomposes it into the pow → mean → rsqrt chain)."""
    from torch._decomp.decompositions import _fused_rms_norm

    ops = (torch.ops.aten._fused_rms_norm.default, torch.ops.aten.rms_norm.default)
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_fused_rms_norm", lambda x, shape, w, eps: _fused_rms_norm(x, shape, w, eps), "CPU")
    for op in ops:  # the Python dispatcher caches per dispatch key whether to decompose
        op._dispatch_cache.clear()
    yield
    lib._destroy()
    for op in ops:
        op._dispatch_cache.clear()
