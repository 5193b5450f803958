#!/usr/bin/env bash
# scripts/sass_count.sh [--max] — SASS instructions per weight element of the 4-bit dequantization
# kernels (quant/quant.cu's dequant8_kernel, the default, one instantiation per format × double quant × output
# dtype), as compiled for the H100 (sm_90). Each thread of those kernels runs straight-line code for
# 8 · DEQ_ITEMS elements (no loop but the 256-entry table's fill, one pass), so the kernel's
# instruction count over that is the issue slots one element costs. NOPs (alignment padding) are not counted.
#   (no argument)  a line per kernel: instructions, per element
#   --max          only the largest per-element figure
#   --both         the lines on stderr, the largest figure on stdout (what `make bench-gpu` prints and
#                  hands the roofline)
# Needs nvcc (the CUDA toolkit) and cuobjdump with its nvdisasm: $CUOBJDUMP, PATH, $CUDA_HOME/bin, or
# NVIDIA's PyPI wheels nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm unpacked under
# ~/.cache/moetrain-tools (`--install` fetches them there; this toolkit install has neither).
# Exit 2 when a tool is missing (the message says which), 1 when a kernel is not found.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/moetrain-tools
cuda=${CUDA_HOME:-/usr/local/cuda}

find_cuobjdump() {
  local c
  for c in "${CUOBJDUMP:-}" "$(command -v cuobjdump || true)" "$cuda/bin/cuobjdump" \
           "$cache/nvidia/cu13/bin/cuobjdump"; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}

if [ "$mode" = --install ]; then
  mkdir -p "$cache"
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --dest "$tmp" 'nvidia-cuda-cuobjdump>=13,<14' 'nvidia-cuda-nvdisasm>=13,<14'
  for w in "$tmp"/*.whl; do python3 -m zipfile -e "$w" "$cache"; done
  chmod +x "$cache"/nvidia/cu13/bin/cuobjdump "$cache"/nvidia/cu13/bin/nvdisasm
  rm -rf "$tmp"
  echo "cuobjdump: $cache/nvidia/cu13/bin/cuobjdump"
  exit 0
fi

export PATH=$PATH:$cache/nvidia/cu13/bin  # nvdisasm, which cuobjdump -sass runs
nvcc=$(command -v nvcc || echo "$cuda/bin/nvcc")
[ -x "$nvcc" ] || { echo "sass_count: nvcc not found (the CUDA toolkit)" >&2; exit 2; }
cuobjdump=$(find_cuobjdump) || {
  echo "sass_count: cuobjdump not found (not in this toolkit install): bash scripts/sass_count.sh --install" \
       "fetches NVIDIA's nvidia-cuda-cuobjdump wheel from PyPI into $cache" >&2
  exit 2
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$nvcc" -O2 -std=c++20 -I. -DMT_CUDA -gencode arch=compute_90,code=sm_90 -cubin quant/quant.cu -o "$tmp/quant.cubin"
"$cuobjdump" -sass "$tmp/quant.cubin" >"$tmp/sass.txt"
# Elements a thread: 8 an item, DEQ_ITEMS items (quant/quant.cu's enum).
per=$(( 8 * $(sed -n 's/.*DEQ_ITEMS = \([0-9]*\).*/\1/p' quant/quant.cu) ))
# One block per function: "Function : NAME", then instruction lines "/*0040*/  OP ... ;".
# $1: the kernel's name (dequant8_kernel, or dequant8_rows_kernel: rows written wider than the weight's).
count() {
  awk -v per="$per" -v kern="$1" '
    /Function : / { fn = $3; next }
    index(fn, kern) && /^[ \t]+\/\*[0-9a-f]+\*\/[ \t]+[A-Z@]/ {
      line = $0; sub(/^[ \t]+\/\*[0-9a-f]+\*\/[ \t]+/, "", line); sub(/;.*/, "", line); split(line, w, /[ \t]+/)
      op = (w[1] ~ /^@/) ? w[2] : w[1]
      if (op != "NOP") n[fn]++
    }
    END { for (f in n) printf "%s %d %.2f\n", f, n[f], n[f] / per }' "$tmp/sass.txt" | sort
}
count dequant8_kernel >"$tmp/counts"
count dequant8_rows_kernel >"$tmp/rows"
[ -s "$tmp/counts" ] || { echo "sass_count: no dequant8_kernel in quant/quant.cu's SASS" >&2; exit 1; }
table() {
  lines "$tmp/counts" "quant/quant.cu dequant8_kernel"
  [ -s "$tmp/rows" ] && lines "$tmp/rows" "its rows instantiation (the experts' w1‖w3 with their LoRAs' B beside, not the default)"
  return 0
}
lines() {
  echo "SASS instructions per element, $2 (sm_90, NOPs excluded; $per elements a thread):"
  # Demangled enough to read: format 0 NF4 1 FP4 2 INT4, double quant, output dtype.
  awk '{ f = $1; t = f; sub(/.*kernelILi/, "", t); fmt = substr(t, 1, 1); dq = (t ~ /Lb1/) ? "dq" : "  ";
         out = (f ~ /bfloat16/) ? "bf16" : "f32 ";
         name = (fmt == 0) ? "NF4 " : (fmt == 1) ? "FP4 " : (fmt == 2) ? "INT4" : "MXFP4";
         printf "  %s %s -> %s  %4d instructions  %5.2f per element\n", name, dq, out, $2, $3 }' "$1"
}
largest() { sort -k3 -n "$tmp/counts" | tail -1 | awk '{ print $3 }'; }
case "$mode" in
  --max) largest;;
  --both) table >&2; largest;;
  *) table;;
esac
