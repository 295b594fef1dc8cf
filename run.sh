#!/usr/bin/env bash
# Set-up and entry points. Creates .venv on first use (torch 2.13 from pip: the CPU wheel where pip serves one,
# the package in editable mode with its test extras), then:
#   ./run.sh demo [args]     tiny FluxPipeline compiled with backend="diffusion_fuse"
#   ./run.sh test [args]     the test suite (GPU tests skip themselves without CUDA)
#   ./run.sh newest [args]   a smoke subset of the suite (NEWEST_TESTS) on NEWEST_TORCH, the newest torch the
#                            registry serves here and pyproject.toml's upper end, in a venv of its own outside
#                            the checkout (its torch is a CUDA build of about 5 GB: made once per machine; by
#                            hand, not in CI)
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
NEWEST_TORCH=2.14.1
# what depends on torch's internals or its ecosystem: every family's conformance, the stage layout, no Triton,
# LoRA hot-swap, offload, inspect on a user's model, torch's logging and tracing, warm start
NEWEST_TESTS=(tests/test_layout.py tests/test_families.py tests/test_optional_triton.py tests/test_lora_hotswap.py
              tests/test_offload.py tests/test_inspect_callable.py tests/test_torch_logs_trace.py
              tests/test_warm_start.py)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
cmd="${1:-test}"
shift || true

if [ "$cmd" = newest ]; then
  # The checkout is on PYTHONPATH, so the venv holds only the dependencies: one venv serves every checkout.
  venv="${DIFFUSION_FUSE_NEWEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/diffusion-fuse/venv-torch-$NEWEST_TORCH}"
  if ! "$venv/bin/python" -c "import torch; assert torch.__version__.split('+')[0] == '$NEWEST_TORCH'" 2>/dev/null; then
    rm -rf "$venv"
    "$PY" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
  fi
  # the dependencies again whenever pyproject.toml changed since they were installed
  deps="$(sha256sum pyproject.toml | cut -d' ' -f1)"
  if [ "$(cat "$venv/.pyproject.sha256" 2>/dev/null)" != "$deps" ]; then
    "$venv/bin/python" -m pip install -q "torch==$NEWEST_TORCH" ".[test]"
    "$venv/bin/python" -m pip uninstall -q -y diffusion-fuse
    echo "$deps" > "$venv/.pyproject.sha256"
  fi
  "$venv/bin/python" -c "import torch, triton; print(f'newest: torch {torch.__version__}, triton {triton.__version__}')"
  PATH="$venv/bin:$PATH" exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "${NEWEST_TESTS[@]}" "$@"
fi

if [ ! -x .venv/bin/tlparse ] || [ ! -x .venv/bin/ruff ] || ! .venv/bin/python -c "import diffusion_fuse, diffusers, peft, pytest, xdist" 2>/dev/null; then
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
case "$cmd" in
  demo) exec .venv/bin/python examples/flux_pipeline.py "$@" ;;
  # two workers, a test file each (its module fixtures run once): the CI machine has two cores
  test) exec .venv/bin/python -m pytest -q -n 2 --dist loadfile tests "$@" ;;
  *) echo "usage: ./run.sh demo|test|newest [args]" >&2; exit 2 ;;
esac
