#!/usr/bin/env bash
# scripts/gpu_source_hash.sh — one sha256 over the sources the GPU bundle is compiled from (C, CUDA,
# C++ and headers under the code folders, scripts and tests, and the Makefile), by path and
# content. gpu_bundle.sh records it; gpu_check.sh compares it with its own tree's, which has no
# .git (the device gets a copy of the files), so that a stale bundle is refused, not measured.
set -euo pipefail
cd "$(dirname "$0")/.."
{ find core quant lora moe model data optim plan trainer scripts tests -type f \
    \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cc' \) \
    -not -path 'tests/cudasim/*' -not -path 'tests/fuzz/*'; echo Makefile; } |
  LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16
