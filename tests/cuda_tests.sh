#!/usr/bin/env bash
# tests/cuda_tests.sh TEST_BIN — the CUDA tests of the suite, one `suite::name` a line: suites cuda
# and quant_cuda, and every test whose body calls gpu_or_skip(). Run from the repository root.
# Used by tests/cudasim/run.sh (which must see each pass, emulated) and by scripts/gpu_bundle.sh
# (the list the GPU check runs there).
set -euo pipefail
perl -ne 'if (/^(?:Parameterized)?Test\(\s*(\w+)\s*,\s*(\w+)/) { $t = "$1::$2"; }
          if (/gpu_or_skip\(\)/ && $t) { print "$t\n"; $t = ""; } $t = "" if eof;' tests/*.c
"$1" --list 2>/dev/null | awk '
  /^[a-z0-9_]+: [0-9]+ tests?$/ { suite = $1; sub(":", "", suite); next }
  /^[├└]/ { name = $NF; if (suite == "cuda" || suite == "quant_cuda") print suite "::" name }'
