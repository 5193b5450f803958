#!/usr/bin/env bash
# tests/cuda_tests.sh TEST_BIN — the CUDA tests of the suite, one `suite::name` a line: suites cuda
# and quant_cuda, and every test whose body calls gpu_or_skip(). Run from the repository root.
# Used by tests/cudasim/run.sh (which must see each pass, emulated) and by scripts/gpu_bundle.sh
# (the list the GPU check runs there).
# tests/cuda_tests.sh --filter LIST — the Criterion filter that runs the tests of LIST (such a
# list): suites cuda and quant_cuda as `suite/*` (all of theirs are CUDA tests), the others by
# name. Criterion crashed (SIGSEGV) on a filter of 100 alternatives, one per test.
set -euo pipefail
if [ "${1:-}" = --filter ]; then
  awk -F'::' '$1 == "cuda" || $1 == "quant_cuda" { whole[$1] = 1; next } { alt = alt "|" $1 "/" $2 }
    END { s = ""; for (w in whole) s = s "|" w "/*"; s = s alt; print "@(" substr(s, 2) ")" }' "$2"
  exit 0
fi
perl -ne 'if (/^(?:Parameterized)?Test\(\s*(\w+)\s*,\s*(\w+)/) { $t = "$1::$2"; }
          if (/gpu_or_skip\(\)/ && $t) { print "$t\n"; $t = ""; } $t = "" if eof;' tests/*.c
"$1" --list 2>/dev/null | awk '
  /^[a-z0-9_]+: [0-9]+ tests?$/ { suite = $1; sub(":", "", suite); next }
  /^[├└]/ { name = $NF; if (suite == "cuda" || suite == "quant_cuda") print suite "::" name }'
