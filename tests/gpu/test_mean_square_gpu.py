"""GPU check of kernels/mean_square.py against eager (bitwise), and of the warp order it assumes.

For each shape (Qwen-Image's q/k rows: 4096 image and 512 text tokens x 24 heads of 128; D = 64 and 32;
bf16, fp16 and fp32 inputs over six decades), every candidate order of the kernel (``CANDIDATES``: a lane's
elements in order, as a tree, by halves, or as one vector; warp offsets descending or ascending) is compared
with eager's ``x.float().pow(2).mean(-1, keepdim=True)``; the test passes when the order ``eager_order`` finds
for each D (the one the kernel runs in) is bitwise eager's everywhere, and D = 32 and 64 have one. The per-order
counts of differing rows go to $OUT/mean_square_gpu.json.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SHAPES = [("qwen_img_q", (1, 4096, 24, 128)), ("qwen_txt_q", (1, 512, 24, 128)), ("d64", (2, 300, 8, 64)),
          ("d32", (4097, 32)), ("rows16", (16, 128))]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _name(order):
    from diffusion_fuse.kernels.mean_square import LANE_FORMS

    return f"{LANE_FORMS[order[0]]}_{'desc' if order[1] else 'asc'}"


def _x(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    d = shape[-1]
    amp = torch.logspace(-3, 3, d, device="cuda")[torch.randperm(d, device="cuda", generator=g)]
    x = torch.randn(*shape, device="cuda", generator=g) * amp
    return x.clamp(-6e4, 6e4).to(dtype)  # fp16's range


def test_kernel_is_eagers_mean_in_the_order_it_finds():
    from diffusion_fuse.kernels.mean_square import CANDIDATES, eager_order, plan_mean_square

    res = {}
    for seed, (name, shape) in enumerate(SHAPES):
        for dtype in DTYPES:
            x = _x(shape, dtype, seed)
            ref = x.float().pow(2).mean(-1, keepdim=True)
            for order in CANDIDATES[shape[-1]]:
                got = plan_mean_square(x, order)(x)
                assert got.shape == ref.shape and got.stride() == ref.stride()
                differ = got.view(torch.int32) != ref.view(torch.int32)
                res[f"{name}:{str(dtype)[6:]}:{_name(order)}"] = int(differ.sum())
    with open(os.path.join(os.environ.get("OUT", "."), "mean_square_gpu.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))
    device = torch.device("cuda", torch.cuda.current_device())
    found = {d: eager_order(device, d) for d in CANDIDATES}
    assert found[32] is not None and found[64] is not None, (found, res)
    bad = {k: v for k, v in res.items() for name, shape in SHAPES if k.startswith(name + ":") and v
           and found[shape[-1]] is not None and k.endswith(":" + _name(found[shape[-1]]))}
    assert not bad, (found, bad)


def test_through_the_backend_the_site_runs_the_kernel_and_is_kept():
    """A QK norm at head dim 64 (measured exact, run 4): the site is kept, the output is eager's bits, and the
    kernel ran (not the reference path). The tiny models' head dim (16) is not the family's."""
    import diffusion_fuse
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.testing.tiny_models import QKNorm

    torch._dynamo.reset()
    model = QKNorm(24, 64).to("cuda", torch.bfloat16)
    x = torch.randn(1, 512, 24 * 64, device="cuda").bfloat16()
    report = diffusion_fuse.Report()
    counters.reset()
    with torch.no_grad():
        ref = model(x)
        out = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report))(x)
    assert torch.equal(ref.view(torch.int16), out.view(torch.int16))
    sites = [s for s in report.sites() if s.pattern == "mean_square"]
    assert len(sites) == 1 and sites[0].status == "kept", report.table()
    assert counters.snapshot()["kernel"].get("mean_square", 0) >= 1, counters.snapshot()
