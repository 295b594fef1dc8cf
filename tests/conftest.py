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
