"""Do the row-group kernels stay eager's bits when x is 8- but not 16-byte aligned, or its rows are not 16-element strided?

``kernels/rms_norm.rms_row_sum_squares`` sums a row with warp shuffles that assume lane f of the state is thread
f % 128. Compiled for sm_90 on the CPU, the kernel's shuffled state keeps that layout only when Triton's
specialization marks x's pointer and row stride divisible by 16: otherwise x is loaded one element per thread and
converted to a layout in which one thread holds several lanes (tests/kernels/test_rms_norm.py shows it). This probe
runs both kernels that use it (``rms_norm_exact`` for ``_fused_rms_norm``; ``mean_square`` at D = 128) at such
layouts on the GPU and counts the rows whose bits differ from eager.

    python benchmarks/probe_lane_alignment.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from tabulate import tabulate

from diffusion_fuse.kernels.mean_square import plan_mean_square
from diffusion_fuse.kernels.rms_norm import rms_norm_exact


def layouts(D: int, rows: int, g: torch.Generator):
    """(name, x) for x [rows, D] bf16 at several pointer offsets and row strides (in elements)."""
    for offset in (0, 4, 8):
        for pad in (0, 4, 8):
            stride = D + pad
            base = torch.randn(rows * stride + offset + 16, generator=g, device="cuda").to(torch.bfloat16)
            x = base[offset:offset + rows * stride].view(rows, stride)[:, :D]
            yield f"offset {offset * 2} B, row stride {stride}", x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "probe_lane_alignment.json"))
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    rows, out = [], []
    for D in (24, 64, 128):
        w = torch.randn(D, generator=g, device="cuda").to(torch.bfloat16)
        for name, x in layouts(D, 4099, g):
            y, rstd = rms_norm_exact(x, w, 1e-6)
            y_ref, rstd_ref = torch.ops.aten._fused_rms_norm(x.contiguous(), [D], w, 1e-6)
            bad_rms = int((y.view(torch.int16) != y_ref.view(torch.int16)).any(-1).sum())
            bad_ms = None
            if D == 128:
                m = plan_mean_square(x)(x)
                m_ref = x.float().pow(2).mean(-1, keepdim=True)
                bad_ms = int((m.view(torch.int32) != m_ref.view(torch.int32)).sum())
            rows.append([D, name, bad_rms, "" if bad_ms is None else bad_ms])
            out.append(dict(D=D, layout=name, rms_norm_rows_differing=bad_rms, mean_square_rows_differing=bad_ms))
            print(rows[-1], flush=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(tabulate(rows, headers=["D", "x layout", "rms_norm rows differing", "mean_square rows differing"]))


if __name__ == "__main__":
    main()
