#!/usr/bin/env bash
# One command for the GPU machine: GPU tests, the demo on CUDA, benchmarks.
# Logs and JSON go to a work folder packed as $OUT/results.tgz (the device tool brings back few
# files); summary.txt and the benchmark JSON are also copied to $OUT. A short table is printed last.
#   bash benchmarks/run_gpu.sh [all|tests|bench|models]   (all: tests, demo, benchmarks;
#   without BENCHES, all and bench run every benchmark: ~5 min more than `tests`)
#   models: whole models at real shapes (benchmarks/bench_models.py); MODELS=flux1,sana,wan22_5b by default,
#   MODELS=qwen_image,flux2,wan21_14b for the rest; BENCH_MODELS_ARGS adds options (e.g. --max-autotune)
#   TESTS="tests/gpu/test_a.py tests/gpu/test_b.py" picks test files; BENCHES="bench_e2e bench_pointwise" picks
#   benchmark steps; BENCH_E2E_ARGS adds options to bench_e2e.py (e.g. "--models flux_stack --profile"),
#   E2E_LIMIT its time limit in seconds (400), NORM_LIMIT bench_norm.py's (200), BENCH_NORM_ARGS its options
#   (e.g. "--workloads LN+mod")
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL="${OUT:-$PWD/out}"; mkdir -p "$FINAL"
# DF_WORK: the work folder, so that two runs (one per GPU, CUDA_VISIBLE_DEVICES) can share a machine
export OUT="${DF_WORK:-/tmp/df_results}"; rm -rf "$OUT"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # diffusers is not on the GPU image: carry .whl (shared/tools/gpu_wheels.sh)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$OUT.site" .whl/*.whl
  export PYTHONPATH=$OUT.site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee "$OUT/env.txt"
status=0
: >"$OUT/summary.txt"
# The GPU's clocks, power and throttle reasons every 100 ms while this runs (read only, nothing is set), to
# see whether the clocks differ between steps and runs (e.g. at the power limit under sustained GEMM load).
# Each step's start and end times are in summary.txt; benchmarks/clocks_summary.py lines the two up.
CLOCKS_PID=""
if command -v nvidia-smi >/dev/null 2>&1; then
  GPU_ID="${CUDA_VISIBLE_DEVICES:-0}"; GPU_ID="${GPU_ID%%,*}"  # the GPU this run uses (first visible)
  POWER=power.draw.instant  # an older driver has only power.draw (averaged over about a second)
  [[ "$(nvidia-smi -i "$GPU_ID" --query-gpu=$POWER --format=csv,noheader,nounits 2>/dev/null)" =~ ^[0-9] ]] \
    || POWER=power.draw
  nvidia-smi -i "$GPU_ID" --query-gpu=timestamp,utilization.gpu,clocks.sm,clocks.mem,$POWER,temperature.gpu,\
clocks_throttle_reasons.active --format=csv -lms 100 >"$OUT/gpu_clocks.csv" 2>/dev/null &
  CLOCKS_PID=$!
fi
step() {
  local name=$1 limit=$2; shift 2
  echo "== $name"
  local t0=$SECONDS start epoch0
  start=$(date +%H:%M:%S); epoch0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc ($((SECONDS - t0)) s, $start-$(date +%H:%M:%S), $epoch0-$(date +%s))" >>"$OUT/summary.txt"
  [ $rc -eq 0 ] || status=1
  tail -n 30 "$OUT/$name.log"
}
what="${1:-all}"
if [ "$what" = models ]; then
  step bench_models "${MODELS_LIMIT:-570}" python3 benchmarks/bench_models.py --models "${MODELS:-flux1,sana,wan22_5b}" \
    --json "$OUT/bench_models.json" ${BENCH_MODELS_ARGS:-}
elif [ "$what" != bench ]; then
  # One pytest per GPU test file, all at once: most of their time is Triton compiling on the CPU
  # (16 cores), and none of them times anything.
  t0=$SECONDS
  test_pids=()
  for f in ${TESTS:-tests/gpu/test_*.py}; do
    name=$(basename "$f" .py)
    ( timeout 480 python3 -m pytest -q -s -p no:cacheprovider "$f" >"$OUT/$name.log" 2>&1
      echo "$name rc=$? " >>"$OUT/summary.txt" ) &
    test_pids+=($!)
  done
  wait "${test_pids[@]}"  # these only: a bare wait would also wait for the clock logger, which never ends
  echo "gpu tests (parallel): $((SECONDS - t0)) s" >>"$OUT/summary.txt"
  grep -q "rc=[1-9]" "$OUT/summary.txt" && status=1
  for f in "$OUT"/test_*.log; do echo "== $(basename "$f")"; tail -n 12 "$f"; done
  step demo 120 python3 examples/flux_pipeline.py --device cuda
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  want() { [ -z "${BENCHES:-}" ] || [[ " $BENCHES " == *" $1 "* ]]; }
  # shellcheck disable=SC2086
  want bench_norm && step bench_norm "${NORM_LIMIT:-200}" python3 benchmarks/bench_norm.py --json "$OUT/bench_norm.json" \
    ${BENCH_NORM_ARGS:-}
  want bench_rms_norm && step bench_rms_norm 120 python3 benchmarks/bench_rms_norm.py --json "$OUT/bench_rms_norm.json"
  want bench_pointwise && step bench_pointwise 200 python3 benchmarks/bench_pointwise.py --json "$OUT/bench_pointwise.json"
  want bench_grouped_gemv && step bench_grouped_gemv 200 python3 benchmarks/bench_grouped_gemv.py \
    --json "$OUT/bench_grouped_gemv.json"
  # shellcheck disable=SC2086
  want bench_e2e && step bench_e2e "${E2E_LIMIT:-400}" python3 benchmarks/bench_e2e.py --json "$OUT/bench_e2e.json" ${BENCH_E2E_ARGS:-}
  want bench_wan_temb && step bench_wan_temb 400 python3 benchmarks/bench_wan_temb.py --json "$OUT/bench_wan_temb.json"
  want bench_depthwise_conv && step bench_depthwise_conv 300 python3 benchmarks/bench_depthwise_conv.py \
    --json "$OUT/bench_depthwise_conv.json"
fi
[ -n "$CLOCKS_PID" ] && kill "$CLOCKS_PID" 2>/dev/null
if [ -f "$OUT/gpu_clocks.csv" ]; then
  python3 benchmarks/clocks_summary.py "$OUT/gpu_clocks.csv" "$OUT/summary.txt" >>"$OUT/summary.txt" 2>&1
  for j in bench_e2e bench_models; do
    [ -f "$OUT/$j.json" ] && python3 benchmarks/clocks_summary.py "$OUT/gpu_clocks.csv" --phases "$OUT/$j.json" \
      >>"$OUT/summary.txt" 2>&1
  done
fi
tar -czf "$FINAL/results.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
cp "$OUT/summary.txt" "$FINAL/"  # JSON and logs travel in results.tgz: the device tool brings back few files
echo "== summary"
cat "$OUT/summary.txt"
[ -f "$OUT/bench_norm.log" ] && tail -n 6 "$OUT/bench_norm.log"
[ -f "$OUT/bench_rms_norm.log" ] && tail -n 6 "$OUT/bench_rms_norm.log"
[ -f "$OUT/bench_pointwise.log" ] && tail -n 12 "$OUT/bench_pointwise.log"
[ -f "$OUT/bench_grouped_gemv.log" ] && tail -n 4 "$OUT/bench_grouped_gemv.log"
[ -f "$OUT/bench_e2e.log" ] && tail -n 4 "$OUT/bench_e2e.log"
[ -f "$OUT/bench_models.log" ] && grep -E "^(==|[A-Z].*  (eager|inductor|lossless|high))" "$OUT/bench_models.log"
[ -f "$OUT/bench_wan_temb.log" ] && tail -n 14 "$OUT/bench_wan_temb.log"
[ -f "$OUT/bench_depthwise_conv.log" ] && tail -n 9 "$OUT/bench_depthwise_conv.log"
exit $status
