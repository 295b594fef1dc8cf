"""GPU check of kernels/mean_square.py against eager (bitwise), and of the warp order it assumes.

For each shape (Qwen-Image's q/k rows: 4096 image and 512 text tokens x 24 heads of 128; D = 64 and 32;
bf16, fp16 and fp32 inputs over six decades), every candidate order of the kernel (``CANDIDATES``: a lane's
elements in order, as a tree, by halves, or as one vector; warp offsets descending or ascending) is compared
with eager's ``x.float().pow(2).mean(-1, keepdim=True)``; the test passes when the order ``eager_order`` finds
for each D (the one the kernel runs in) is bitwise eager's everywhere, and D = 32 and 64 have one. The per-order
counts of differing rows go to $OUT/mean_square_gpu.json. Strided rows (``[B, S, H, D]`` projections transposed to
``[B, H, S, D]``, as diffusers' SD3 attention normalizes q and k; the leading tokens of each head) run the op and
must be eager's bits too.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SHAPES = [("qwen_img_q", (1, 4096, 24, 128)), ("qwen_txt_q", (1, 512, 24, 128)), ("d64", (2, 300, 8, 64)),
          ("d32", (4097, 32)), ("rows16", (16, 128)),
          # rows of other sizes: head dims of 48 and 96, a row of 160, hidden sizes (LTX's 2048, PixArt's 1152,
          # SD3.5-large's 2432, Lumina's 2304, Wan's 5120)
          ("d48", (2, 300, 8, 48)), ("d96", (4800, 96)), ("d160", (1024, 160)), ("d1152", (2, 512, 1152)),
          ("d2048", (1, 2048, 2048)), ("d2304", (1, 600, 2304)), ("d2432", (2, 333, 2432)), ("d5120", (700, 5120))]
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
    from diffusion_fuse.kernels.mean_square import VECTOR, candidates, eager_order, plan_mean_square

    res = {}
    for seed, (name, shape) in enumerate(SHAPES):
        for dtype in DTYPES:
            x = _x(shape, dtype, seed)
            ref = x.float().pow(2).mean(-1, keepdim=True)
            for order in candidates(shape[-1]):
                got = plan_mean_square(x, order)(x)
                assert got.shape == ref.shape and got.stride() == ref.stride()
                differ = got.view(torch.int32) != ref.view(torch.int32)
                res[f"{name}:{str(dtype)[6:]}:{_name(order)}"] = int(differ.sum())
    with open(os.path.join(os.environ.get("OUT", "."), "mean_square_gpu.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))
    device = torch.device("cuda", torch.cuda.current_device())
    found = {shape[-1]: eager_order(device, shape[-1]) for _, shape in SHAPES}
    print("eager's order per D:", found)
    assert all(o is not None for o in found.values()), (found, res)
    # rows past 128 elements: ATen vectorizes them (the contract's vector lanes)
    assert all(o == (VECTOR, True) for d, o in found.items() if d > 128), found
    bad = {k: v for k, v in res.items() for name, shape in SHAPES if k.startswith(name + ":") and v
           and found[shape[-1]] is not None and k.endswith(":" + _name(found[shape[-1]]))}
    assert not bad, (found, bad)


def test_through_the_backend_the_site_runs_the_kernel_and_is_kept():
    """A QK norm at head dim 96 (the pointwise kernels take rows of powers of two with the norm's tail): the site
    is kept, the output is eager's bits, and the kernel ran (not the reference path)."""
    import diffusion_fuse
    from diffusion_fuse.lowering import counters
    from diffusion_fuse.testing.tiny_models import QKNorm

    torch._dynamo.reset()
    model = QKNorm(24, 96).to("cuda", torch.bfloat16)
    x = torch.randn(1, 512, 24 * 96, device="cuda").bfloat16()
    report = diffusion_fuse.Report()
    counters.reset()
    with torch.no_grad():
        ref = model(x)
        out = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report))(x)
    assert torch.equal(ref.view(torch.int16), out.view(torch.int16))
    sites = [s for s in report.sites() if s.pattern == "mean_square"]
    assert len(sites) == 1 and sites[0].status == "kept", report.table()
    assert counters.snapshot()["kernel"].get("mean_square", 0) >= 1, counters.snapshot()


STRIDED = [("heads_transposed_d64", (2, 1024, 24, 64), "transpose"), ("heads_transposed_d128", (2, 512, 24, 128),
           "transpose"), ("heads_transposed_b1", (1, 333, 38, 64), "transpose"),
           ("heads_transposed_d32", (2, 300, 8, 32), "transpose"), ("leading_tokens", (2, 8, 600, 128), "leading")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, shape, layout", STRIDED)
def test_strided_rows_run_the_op_with_eagers_bits(name, shape, layout, dtype):
    from diffusion_fuse.kernels.mean_square import can_use_mean_square
    from diffusion_fuse.lowering import counters

    x = _x(shape, dtype, seed=len(name))
    x = x.transpose(1, 2) if layout == "transpose" else x[:, :, : shape[2] // 2]
    assert not x.is_contiguous()
    ok, why = can_use_mean_square(x)
    assert ok, why
    counters.reset()
    got = torch.ops.diffusion_fuse.mean_square(x)
    assert counters.snapshot()["kernel"] == {"mean_square": 1}, counters.snapshot()
    ref = x.float().pow(2).mean(-1, keepdim=True)
    assert got.shape == ref.shape and got.stride() == ref.stride()
    assert torch.equal(got.view(torch.int32), ref.view(torch.int32))


class TransposedQKNorm(torch.nn.Module):
    """diffusers' SD3 attention: ``q.view(B, -1, heads, head_dim).transpose(1, 2)``, then ``RMSNorm``."""

    def __init__(self, heads: int, head_dim: int):
        super().__init__()
        from diffusers.models.normalization import RMSNorm

        self.heads = heads
        self.norm = RMSNorm(head_dim, eps=1e-6, elementwise_affine=True)

    def forward(self, q):
        return self.norm(q.view(q.shape[0], -1, self.heads, q.shape[-1] // self.heads).transpose(1, 2))


def test_through_the_backend_a_transposed_qk_norm_runs_the_kernel_and_is_kept():
    import diffusion_fuse
    from diffusion_fuse.lowering import counters

    torch._dynamo.reset()
    model = TransposedQKNorm(24, 96).to("cuda", torch.bfloat16)  # (64: pointwise's, tests/gpu/test_pointwise_gpu.py)
    x = torch.randn(2, 512, 24 * 96, device="cuda").bfloat16()
    report = diffusion_fuse.Report()
    counters.reset()
    with torch.no_grad():
        ref = model(x)
        out = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report))(x)
    assert torch.equal(ref.view(torch.int16), out.view(torch.int16))
    sites = [s for s in report.sites() if s.pattern == "mean_square"]
    assert len(sites) == 1 and sites[0].status == "kept", report.table()
    assert counters.snapshot()["kernel"].get("mean_square", 0) >= 1, counters.snapshot()
