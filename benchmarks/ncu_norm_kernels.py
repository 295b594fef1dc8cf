"""Run the norm kernels at FLUX's shapes a few times each, for Nsight Compute (``benchmarks/ncu_norm_kernels.sh``).

FLUX.1-dev's single-block QK RMSNorm + RoPE ``[1,4608,24,128]`` (``_rms_norm_kernel``, 152 calls per forward),
LN + modulate ``[1,4608,3072]`` (``_ln_modulate_kernel``, #3's FLUX row) and the gated residual + LN + modulate
(``_gated_residual_ln_modulate_kernel``), each launched as the ops plan them, twice (the first compiles).

    python benchmarks/ncu_norm_kernels.py
"""

from __future__ import annotations

import torch

import diffusion_fuse  # noqa: F401  (registers the ops)
from bench_norm import workloads as norm_workloads
from bench_rms_norm import workloads as rms_workloads


def main() -> None:
    for name, op_name, args in rms_workloads():
        if op_name == "rms_norm_rope" or name.startswith("FLUX QK norm"):
            for _ in range(2):
                getattr(torch.ops.diffusion_fuse, op_name)(*args)
    for name, spec in norm_workloads():
        if not name.startswith("FLUX"):
            continue
        for _ in range(2):
            if spec[0] == "gated":
                torch.ops.diffusion_fuse.gated_residual_ln_modulate(*spec[1])
            else:
                torch.ops.diffusion_fuse.ln_modulate(*spec)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
