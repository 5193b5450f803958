#!/usr/bin/env bash
# scripts/hf_roundtrip.sh — moetrain's checkpoints into both transformers versions: for each
# family's config as transformers 4.57 and 5.x write it (tests/data/hf_configs/), `moetrain init`,
# a `merge` of a 2-step LoRA run, and `quantize` load in transformers 4.57 and 5.x with no missing,
# unexpected or mismatched key (scripts/check_hf_load.py). A 4-bit checkpoint of per-expert
# weights does not load in transformers 5 (it fuses the experts: docs/formats.md), so there the
# quantize step quantizes attention only. Not CI (it needs torch): T4PY, T5PY name the pythons.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MT=$ROOT/build/moetrain
T4PY=${T4PY:-/work/.venv-t4cfg/bin/python}
T5PY=${T5PY:-/work/.venv-t5cfg/bin/python}
W=$(mktemp -d /tmp/hf_roundtrip.XXXXXX)
trap 'rm -rf "$W"' EXIT
for i in $(seq 0 15); do printf '{"text":"sample %d: the quick brown fox %d"}\n' "$i" $((i * 7)); done >"$W/data.jsonl"
fail=0
for v in v4 v5; do
  for fam in mixtral qwen2_moe qwen3_moe olmoe; do
    d=$W/$v-$fam
    "$MT" init --config "$ROOT/tests/data/hf_configs/$v/$fam.json" --out "$d/init" --seed 5 >/dev/null || { echo "init $v $fam failed"; fail=1; continue; }
    "$MT" train --model "$d/init" --data "$W/data.jsonl" --mode lora --r 4 --steps 2 --seq 32 --quant none \
      --out "$d/run" >"$d/train.log" 2>&1 || { tail -3 "$d/train.log"; fail=1; continue; }
    "$MT" merge --model "$d/init" --adapter "$d/run/adapter" --quant none --out "$d/merged" >/dev/null 2>&1 ||
      { echo "merge $v $fam failed"; fail=1; }
    "$MT" quantize --model "$d/init" --quant nf4 --out "$d/q4" >/dev/null 2>&1 || { echo "quantize $v $fam failed"; fail=1; }
    "$MT" quantize --model "$d/init" --quant nf4 --quant-targets attn --out "$d/q4attn" >/dev/null 2>&1 ||
      { echo "quantize --quant-targets attn $v $fam failed"; fail=1; }
  done
done
"$T4PY" "$ROOT/scripts/check_hf_load.py" "$W"/*/init "$W"/*/merged "$W"/*/q4 || fail=1
"$T5PY" "$ROOT/scripts/check_hf_load.py" "$W"/*/init "$W"/*/merged "$W"/*/q4attn || fail=1
echo "hf_roundtrip: $([ $fail = 0 ] && echo passed || echo FAILED)"
exit $fail
