#!/usr/bin/env bash
# Set-up and entry points. Creates .venv on first use (CPU torch 2.13 from the local wheel,
# the package in editable mode with its test extras), then:
#   ./run.sh demo [args]   tiny FluxPipeline compiled with backend="diffusion_fuse"
#   ./run.sh test [args]   the test suite (GPU tests skip themselves without CUDA)
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import diffusion_fuse, diffusers, pytest" 2>/dev/null; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q "triton==3.6.0" -e ".[test]"
fi
# torchao for tests/test_torchao.py only, outside the venv's site-packages: once installed, diffusers
# imports it with every model (and it prints warnings), so the demo and the other tests do not see it
if [ ! -d .venv/torchao/torchao ]; then
  .venv/bin/python -m pip install -q --no-deps --target .venv/torchao "torchao==0.18.0"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
cmd="${1:-test}"
shift || true
case "$cmd" in
  demo) exec .venv/bin/python examples/flux_pipeline.py "$@" ;;
  test) exec .venv/bin/python -m pytest -q tests "$@" ;;
  *) echo "usage: ./run.sh demo|test [args]" >&2; exit 2 ;;
esac
