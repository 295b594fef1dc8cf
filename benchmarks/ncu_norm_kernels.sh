#!/usr/bin/env bash
# Nsight Compute on the norm kernels at FLUX's shapes (benchmarks/ncu_norm_kernels.py): speed of light, memory
# workload, warp stall reasons of each launch, as text in $OUT/ncu_norm_kernels.txt.
#   bash benchmarks/ncu_norm_kernels.sh
set -uo pipefail
cd "$(dirname "$0")"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
if [ -z "$NCU" ]; then echo "no ncu on this machine"; exit 2; fi
out="${OUT:-.}/ncu_norm_kernels.txt"
"$NCU" --kernel-name regex:"_rms_norm_kernel|_ln_modulate_kernel|_gated_residual_ln_modulate_kernel" \
  --launch-skip-before-match 0 --set full --print-summary none \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
  --section LaunchStats --section SchedulerStats \
  python3 ncu_norm_kernels.py >"$out" 2>&1
rc=$?
grep -E "^  [a-zA-Z_]+.*\(|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles|Issued Ipc|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Block Limit|Eligible" "$out" | head -200
exit $rc
