"""CPU checks of kernels/depthwise_conv.py: its summation orders in Triton's interpreter, its guard and layouts.

The interpreter runs fp32 arithmetic one IEEE op at a time, so each candidate order must equal ``emulate`` (the
module's contract in torch ops, one add at a time) bit for bit; wide-range inputs make the orders differ from each
other (checked too). fp32 stands in for bf16 here (the interpreter's bf16 cast truncates). Which order is eager's
on a GPU is tests/gpu/test_depthwise_conv_gpu.py's job.
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

# (batch, channels, height, width, kh, kw, pad_h, pad_w, channels_last): blocks of the kernels only partly filled,
# a non-square filter (each layout), no padding, more columns than one column block, more channels than one
# channel block; every order on the first case, the candidates on the rest
CASES = [(1, 70, 6, 5, 3, 3, 1, 1, True), (1, 8, 9, 40, 3, 3, 1, 1, False), (1, 8, 12, 6, 5, 3, 2, 1, False),
         (2, 8, 8, 5, 3, 3, 0, 0, True), (1, 136, 7, 9, 5, 3, 2, 1, True)]

FULL = os.environ.get("DIFFUSION_FUSE_FULL", "") not in ("", "0")  # tests/helpers.py's, in the worker too
# the GLU tail on a channels-last case and a contiguous one (on every case in the full run: DIFFUSION_FUSE_FULL=1)
GLU_CASES = (0, 2)


def emulate(x, w, b, padding, order):
    """The contract: per output, ``acc`` from 0 or the bias, plus each tap's product in the order's turn (the
    padding's taps skipped or added as zeros), rounded once; the bias added after when not first."""
    from diffusion_fuse.kernels.depthwise_conv import ROW_MAJOR

    tap_order, bias_first, skip = order
    n, c, h, wd = x.shape
    kh, kw = w.shape[-2:]
    ph, pw = padding
    ho, wo = h + 2 * ph - kh + 1, wd + 2 * pw - kw + 1
    xp = torch.nn.functional.pad(x.float(), (pw, pw, ph, ph))
    inside = torch.nn.functional.pad(torch.ones(h, wd, dtype=torch.bool), (pw, pw, ph, ph))
    acc = torch.zeros(n, c, ho, wo)
    if b is not None and bias_first:  # the bias itself (0 + b would turn a -0 bias into +0)
        acc = b.float().view(1, c, 1, 1).expand(n, c, ho, wo).clone()
    taps = [(i, j) for i in range(kh) for j in range(kw)] if tap_order == ROW_MAJOR else \
        [(i, j) for j in range(kw) for i in range(kh)]
    for i, j in taps:
        p = acc + w[:, 0, i, j].float().view(1, c, 1, 1) * xp[:, :, i:i + ho, j:j + wo]
        acc = torch.where(inside[i:i + ho, j:j + wo], p, acc) if skip else p
    y = acc.to(x.dtype)
    if b is not None and not bias_first:
        y = (y.float() + b.float().view(1, c, 1, 1)).to(x.dtype)
    return y


def emulate_glu(y, gate):
    """The GLU tail on the convolution's output: value * silu(gate), silu as ``g / (1 + exp(-g))`` one fp32 op at a
    time (numpy's fp32 exp is the interpreter's)."""
    import numpy as np

    halves = torch.chunk(y, 2, dim=1)
    g = halves[gate].contiguous().numpy()
    s = torch.from_numpy(g / (np.float32(1) + np.exp(-g)))
    return halves[1 - gate] * s


def worker() -> dict:
    from diffusion_fuse.kernels.depthwise_conv import (
        CANDIDATES,
        ORDERS,
        _draw,
        can_use_depthwise_conv,
        plan_depthwise_conv,
    )

    res = {}
    for k, (n, c, h, wd, kh, kw, ph, pw, cl) in enumerate(CASES):
        x = torch.empty(n, c, h, wd)
        x = x.to(memory_format=torch.channels_last) if cl else x
        x, w, b = _draw(x, torch.empty(c, 1, kh, kw), True, seed=k)
        for bias in (b, None) if k == 0 else (b,):
            wants = {o: emulate(x, w, bias, (ph, pw), o) for o in ORDERS}
            # every order on the first case with its bias (without it too in the full run), the candidates elsewhere
            for order in ORDERS if k == 0 and (bias is not None or FULL) else CANDIDATES:
                got = plan_depthwise_conv(x, w, bias is not None, (ph, pw), order)(x, w, bias)
                key = f"{k}:{'bias' if bias is not None else 'nobias'}:{order}"
                want = wants[order]
                res[key] = {"equal": torch.equal(got.view(torch.int32), want.view(torch.int32)),
                            "strides": list(got.stride()), "want_strides": list(torch.ops.aten.convolution(
                                x, w, bias, [1, 1], [ph, pw], [1, 1], False, [0, 0], c).stride()),
                            "tap_order_matters": not torch.equal(want, wants[(1 - order[0], *order[1:])]),
                            "neg_zeros": int(((got == 0) & got.signbit()).sum())}
            for gate in (0, 1) if bias is not None and (FULL or k in GLU_CASES) else ():
                order = CANDIDATES[k % 2]
                got = plan_depthwise_conv(x, w, True, (ph, pw), order, gate)(x, w, bias)
                want = emulate_glu(wants[order], gate)
                halves = torch.chunk(torch.ops.aten.convolution(x, w, bias, [1, 1], [ph, pw], [1, 1], False,
                                                                [0, 0], c), 2, dim=1)
                eager = halves[1 - gate] * torch.nn.functional.silu(halves[gate])  # eager's output layout
                res[f"{k}:glu{gate}"] = {"equal": torch.equal(got.view(torch.int32), want.view(torch.int32)),
                                         "strides": list(got.stride()), "want_strides": list(eager.stride()),
                                         "glu_shape": list(got.shape) == list(want.shape)}
            if bias is not None:  # the candidates eager_order chooses between give other bits on its draw
                res[f"{k}:candidates_differ"] = not torch.equal(wants[CANDIDATES[0]].view(torch.int32),
                                                                wants[CANDIDATES[1]].view(torch.int32))
    x = torch.zeros(1, 8, 4, 4)
    res["guard"] = {str(dt)[6:]: can_use_depthwise_conv(x.to(dt), torch.zeros(8, 1, 3, 3, dtype=dt), None, (1, 1))
                    for dt in (torch.float32, torch.bfloat16)}
    res["guard"]["not_depthwise"] = can_use_depthwise_conv(x.bfloat16(), torch.zeros(16, 1, 3, 3).bfloat16(), None,
                                                           (1, 1))
    res["guard"]["strided"] = can_use_depthwise_conv(x.bfloat16()[:, :, ::2], torch.zeros(8, 1, 3, 3).bfloat16(),
                                                     None, (1, 1))
    res["guard"]["strided_bias"] = can_use_depthwise_conv(x.bfloat16(), torch.zeros(8, 1, 3, 3).bfloat16(),
                                                          torch.zeros(16).bfloat16()[::2], (1, 1))
    x7 = torch.zeros(1, 7, 4, 4, dtype=torch.bfloat16)
    res["guard"]["glu_odd"] = can_use_depthwise_conv(x7, torch.zeros(7, 1, 3, 3, dtype=torch.bfloat16), None,
                                                     (1, 1), 1)
    return res


def _orders(results: dict) -> dict:
    """The per-order records (case:bias:order) and the GLU's (case:glu<gate>)."""
    return {k: v for k, v in results.items() if isinstance(v, dict) and "equal" in v}


@pytest.fixture(scope="module")
def results():
    return run_worker(__file__)


def test_every_order_is_its_contract(results):
    orders = _orders(results)
    assert orders and all(v["equal"] for v in orders.values()), [k for k, v in orders.items() if not v["equal"]]


def test_the_output_has_eagers_layout(results):
    """Channels-last in, channels-last out (cuDNN keeps the layout); contiguous in, contiguous out."""
    orders = _orders(results).values()
    assert all(v["strides"] == v["want_strides"] for v in orders)


def test_the_glu_tail_is_its_contract_in_either_half(results):
    """value * silu(gate) of the convolution's halves, the gate the first or the second, eager's output layout."""
    glu = {k: v for k, v in _orders(results).items() if ":glu" in k}
    runs = len(CASES) if FULL else len(GLU_CASES)
    assert len(glu) == 2 * runs and all(v["glu_shape"] for v in glu.values())
    assert all(v["equal"] and v["strides"] == v["want_strides"] for v in glu.values()), glu


def test_the_draw_tells_the_orders_apart(results):
    """eager_order's draw gives other bits in the other tap order, and in the other candidate (the bias first or
    after), in every case."""
    assert all(v["tap_order_matters"] for k, v in _orders(results).items() if ":glu" not in k)
    differ = [v for k, v in results.items() if k.endswith(":candidates_differ")]
    assert differ and all(differ)


def test_a_negative_zero_bias_added_first_stays_negative_zero(results):
    """ATen's own kernel starts from the bias: where every product is -0 a -0 bias gives -0 (the draw has such
    outputs), and the kernel's bias-first orders that skip the padding keep it."""
    kept = [v["neg_zeros"] for k, v in _orders(results).items() if ":bias:" in k and k.endswith(", True, True)")]
    assert kept and all(n > 0 for n in kept)


def test_the_guard(results):
    """In the interpreter: bf16 taken; fp32 not (cuDNN convolves it in TF32), nor a channel multiplier, a
    strided x or a GLU of an odd channel count; on a plain CPU nothing is."""
    from diffusion_fuse.kernels.depthwise_conv import can_use_depthwise_conv

    guard = results["guard"]
    assert guard["bfloat16"] == [True, ""]
    assert not guard["float32"][0] and "dtypes" in guard["float32"][1]
    assert not guard["not_depthwise"][0] and "one filter a channel" in guard["not_depthwise"][1]
    assert not guard["strided"][0] and "channels-last" in guard["strided"][1]
    assert not guard["strided_bias"][0] and "contiguous bias" in guard["strided_bias"][1]
    assert not guard["glu_odd"][0] and "even count" in guard["glu_odd"][1]
    x = torch.zeros(1, 8, 4, 4, dtype=torch.bfloat16)
    assert can_use_depthwise_conv(x, torch.zeros(8, 1, 3, 3, dtype=torch.bfloat16), None, (1, 1)) == \
        (False, "device is cpu")


if __name__ == "__main__":
    worker_main(worker)
