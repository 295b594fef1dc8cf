#!/usr/bin/env bash
# Dump the SASS of eager's vectorized_layer_norm_kernel (every dtype instantiation in the
# installed torch) so the FMA structure of cuWelfordOnlineSum / cuWelfordCombine and of the
# output expression can be read, next to the SASS of our Triton replica.
#
# Run ON THE GPU MACHINE from the repo root:  OUT=/some/dir bash benchmarks/sass_layer_norm.sh [sm_90]
# Writes to $OUT/sass_layer_norm/ (./out/sass_layer_norm without $OUT):
#   versions.txt, symbols.txt (mangled + demangled), <dtype>[_rms].sass, summary.txt
#   (opcode counts per kernel), triton_<...>.sass/.ptx for layer_norm_stats' kernel.
# Uses cuobjdump from PATH or /usr/local/cuda/bin, else the one bundled with triton.
set -euo pipefail

PY="${PYTHON:-python3}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${OUT:-$REPO/out}/sass_layer_norm"
mkdir -p "$DEST"

ARCH="${1:-$($PY -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"sm_{m}{n}")' 2>/dev/null || echo sm_90)}"
TORCH_LIB="$($PY -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
LIB="$TORCH_LIB/libtorch_cuda.so"
[ -f "$LIB" ] || { echo "no $LIB" >&2; exit 1; }

CUOBJDUMP="$(command -v cuobjdump || true)"
[ -n "$CUOBJDUMP" ] || { [ -x /usr/local/cuda/bin/cuobjdump ] && CUOBJDUMP=/usr/local/cuda/bin/cuobjdump; } || true
if [ -z "$CUOBJDUMP" ]; then
  CUOBJDUMP="$($PY -c 'import triton, os; print(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump"))')"
fi
[ -x "$CUOBJDUMP" ] || { echo "no cuobjdump found" >&2; exit 1; }
DEMANGLE="$(command -v c++filt || echo cat)"

{
  echo "arch: $ARCH"
  echo "lib: $LIB ($(du -h "$LIB" | cut -f1))"
  echo "cuobjdump: $CUOBJDUMP"
  "$CUOBJDUMP" --version 2>&1 | tail -n 2
  $PY -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "git", torch.version.git_version); print("triton", triton.__version__); print("device", torch.cuda.get_device_name())'
} > "$DEST/versions.txt" 2>&1
cat "$DEST/versions.txt"

# Extract this arch's cubins once (one decompression pass), then find the one with the kernel.
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
( cd "$WORK" && "$CUOBJDUMP" -xelf "$ARCH" "$LIB" > /dev/null 2>&1 || true )
PATTERN='_Z[A-Za-z0-9_]*vectorized_layer_norm_kernel[A-Za-z0-9_]*'
CUBINS=()
while IFS= read -r f; do CUBINS+=("$f"); done < <(grep -l -a -E "$PATTERN" "$WORK"/*.cubin 2>/dev/null || true)
if [ "${#CUBINS[@]}" -eq 0 ]; then
  echo "no $ARCH cubin with vectorized_layer_norm_kernel via -xelf; falling back to -fun on the whole library" >&2
  CUBINS=("$LIB")
  "$CUOBJDUMP" -symbols "$LIB" 2>/dev/null | grep -a -o -E "$PATTERN" | grep -v -E '_param_[0-9]+$' | sort -u > "$WORK/syms" || true
else
  echo "cubins: ${CUBINS[*]##*/}"
  grep -h -a -o -E "$PATTERN" "${CUBINS[@]}" | grep -v -E '_param_[0-9]+$' | sort -u > "$WORK/syms" || true
fi
[ -s "$WORK/syms" ] || { echo "no vectorized_layer_norm_kernel symbols found" >&2; exit 1; }

: > "$DEST/symbols.txt"
: > "$DEST/summary.txt"
while IFS= read -r sym; do
  pretty="$(echo "$sym" | "$DEMANGLE")"
  case "$sym" in
    *N3c108BFloat16E*) tag=bf16 ;;
    *N3c104HalfE*) tag=fp16 ;;
    *kernelIdd*) tag=fp64 ;;
    *kernelIff*) tag=fp32 ;;
    *) tag="other$(echo "$sym" | md5sum | cut -c1-6)" ;;
  esac
  case "$sym" in *Lb1E*) tag="${tag}_rms" ;; esac
  printf '%s\t%s\n%s\n\n' "$tag" "$sym" "$pretty" >> "$DEST/symbols.txt"
  for bin in "${CUBINS[@]}"; do
    # keep only this function's listing (cuobjdump prints headers for every fatbin it scans)
    "$CUOBJDUMP" -sass -arch "$ARCH" -fun "$sym" "$bin" 2>/dev/null \
      | awk -v s="$sym" '/Function : /{p = index($0, s) > 0} p' >> "$DEST/$tag.sass" || true
  done
  {
    echo "== $tag  $pretty"
    grep -o -E '\b(FFMA|FMUL|FADD|FCHK|MUFU\.[A-Z0-9]+|SHFL\.[A-Z]+|BAR\.[A-Z]+)\b' "$DEST/$tag.sass" | sort | uniq -c || true
  } >> "$DEST/summary.txt"
done < "$WORK/syms"

# PTX, if the wheel embeds any for this kernel (usually only for the newest arch).
"$CUOBJDUMP" -ptx -fun "$(head -n 1 "$WORK/syms")" "${CUBINS[0]}" > "$DEST/first_symbol.ptx" 2>/dev/null || true
[ -s "$DEST/first_symbol.ptx" ] || rm -f "$DEST/first_symbol.ptx"

# Our replica, default variant, bf16 and fp32, D=3072, with and without affine.
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" $PY - "$DEST" "$CUOBJDUMP" <<'EOF' || echo "triton replica dump failed (non-fatal)" >&2
import os, subprocess, sys
import torch
from diffusion_fuse.kernels import layer_norm_stats as lns
from diffusion_fuse.kernels.launch import EAGER_NUMERICS

dest, cuobjdump = sys.argv[1], sys.argv[2]
for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
    for affine in (False, True):
        x = torch.randn(2, 3072, device="cuda", dtype=dtype)
        w = torch.randn(3072, device="cuda", dtype=dtype) if affine else None
        y, mean, rstd = torch.empty_like(x), torch.empty(2, device="cuda"), torch.empty(2, device="cuda")
        k = lns._layer_norm_exact_kernel[(2,)](
            x, w, w, y, mean, rstd, 3072, 1e-6, N_ITERS=lns.n_iters_for(3072), LANES=lns.LANES, VEC=lns.VEC,
            HAS_W=affine, HAS_B=affine, AFFINE_FMA=True, **lns.DEFAULT_VARIANT.constexprs(),
            UNIFORM=lns.is_uniform(3072, lns.n_iters_for(3072)), num_warps=4, **EAGER_NUMERICS,
        )
        name = f"triton_{tag}{'_affine' if affine else ''}"
        with open(os.path.join(dest, name + ".ptx"), "w") as f:
            f.write(k.asm["ptx"])
        cubin = os.path.join(dest, name + ".cubin")
        with open(cubin, "wb") as f:
            f.write(k.asm["cubin"])
        with open(os.path.join(dest, name + ".sass"), "w") as f:
            f.write(subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True).stdout)
        os.remove(cubin)
print("triton replica dumped")
EOF
for f in "$DEST"/triton_*.sass; do
  [ -f "$f" ] || continue
  {
    echo "== ${f##*/}"
    grep -o -E '\b(FFMA|FMUL|FADD|FCHK|MUFU\.[A-Z0-9]+|SHFL\.[A-Z]+|BAR\.[A-Z]+)\b' "$f" | sort | uniq -c || true
  } >> "$DEST/summary.txt"
done

cat "$DEST/symbols.txt" "$DEST/summary.txt"
ls -la "$DEST"
