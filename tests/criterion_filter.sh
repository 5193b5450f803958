#!/usr/bin/env bash
# tests/criterion_filter.sh LIST — a Criterion --filter selecting the tests of LIST (one
# "suite::name" a line): an extglob @(…|…) of groups of at most 50, since Criterion's extglob
# matcher aborts on a group of more than 100 alternatives (extglobmatch.c: handle_operator).
set -euo pipefail
sed 's|::|/|' "$1" | awk '{ t[NR] = $0 }
  END {
    printf "@("
    for (i = 1; i <= NR; i += 50) {
      printf "%s@(", (i > 1 ? "|" : "")
      for (j = i; j < i + 50 && j <= NR; j++) printf "%s%s", (j > i ? "|" : ""), t[j]
      printf ")"
    }
    printf ")\n"
  }'
