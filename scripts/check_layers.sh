#!/usr/bin/env bash
# make layers: no #include points up a layer. Layers, bottom up (README "Layout"):
#   core < quant, lora, moe < model < data, optim, plan < trainer (trainer/cmd is trainer's)
# A file may include headers of its own folder and of the layers below it. Folders of one layer
# do not include each other, except the pairs in SIBLINGS (plan/plan_measure.c runs the
# optimizer's real step). tests/ and scripts/ are exempt: they may use every layer.
# Fails naming each offending file, line and include.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A LAYER=([core]=0 [quant]=1 [lora]=1 [moe]=1 [model]=2 [data]=3 [optim]=3 [plan]=3 [trainer]=4)
SIBLINGS=" plan>optim "

bad=0
while IFS= read -r file; do
    from=${file%%/*}
    while IFS=: read -r line inc; do
        to=${inc%%/*}
        [[ -n ${LAYER[$to]:-} && $to != "$from" ]] || continue
        if (( LAYER[$to] > LAYER[$from] )); then
            echo "layers: $file:$line includes \"$inc\": $to/ is a layer above $from/"
            bad=1
        elif (( LAYER[$to] == LAYER[$from] )) && [[ $SIBLINGS != *" $from>$to "* ]]; then
            echo "layers: $file:$line includes \"$inc\": $to/ is beside $from/ (same layer; allowed pairs:$SIBLINGS)"
            bad=1
        fi
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" |
             sed -E 's/^([0-9]+):[^"]*"([^"]+)".*/\1:\2/')
done < <(find "${!LAYER[@]}" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cc' \) | sort)

if (( bad )); then
    echo "layers: FAILED (layers bottom up: core < quant, lora, moe < model < data, optim, plan < trainer)"
    exit 1
fi
echo "layers: ok"
