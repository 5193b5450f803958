#!/usr/bin/env bash
# scripts/family_interop.sh — each non-Mixtral family against transformers 4.57 + PEFT 0.17
# (docs/families.md). Not part of `make test` (no torch there). For configs/tiny-{qwen2-moe,
# qwen3-moe,olmoe}.json (vocab raised to 300 for the byte-level tokenizer; OLMoE also with
# clip_qkv 0.5 and attention_bias, which cut and add there):
#   * `moetrain init` output loads in transformers clean (scripts/check_family_init.py);
#   * a 3-step LoRA run on every target writes a v4 adapter that PEFT loads with no missing,
#     unexpected or ignored key and whose loss equals `moetrain eval`'s (scripts/check_peft.py);
#   * `moetrain merge` of it gives the same eval loss.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MT=$ROOT/build/moetrain
T4PY=${T4PY:-/work/.venv-t4/bin/python}
W=${W:-$(mktemp -d /tmp/family_interop.XXXXXX)}
DATA=$ROOT/scripts/interop/data.jsonl
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
fail=0
"$T4PY" - "$ROOT" "$W" <<'PY' || exit 1
import json, sys
root, w = sys.argv[1], sys.argv[2]
for name, extra in (("qwen2-moe", {}), ("qwen3-moe", {}), ("olmoe", {"clip_qkv": 0.5, "attention_bias": True, "bos_token_id": 1})):
    c = json.load(open(f"{root}/configs/tiny-{name}.json"))
    c.update(vocab_size=300, max_position_embeddings=256, **extra)
    json.dump(c, open(f"{w}/{name}.json", "w"), indent=2)
PY
loss_of() { "$MT" eval --model "$1" ${2:+--adapter "$2"} --data "$DATA" --quant none 2>/dev/null | sed -n 's/^loss=\([0-9.]*\).*/\1/p'; }
for name in qwen2-moe qwen3-moe olmoe; do
    echo "== $name"
    b=$W/$name-base r=$W/$name-run
    "$MT" init --config "$W/$name.json" --out "$b" --dtype f32 --seed 7 >/dev/null || { echo "    init failed"; fail=1; continue; }
    "$T4PY" "$ROOT/scripts/check_family_init.py" "$b" | sed 's/^/    /' || fail=1
    "$MT" train --model "$b" --data "$DATA" --out "$r" --mode lora --r 4 --targets all --quant none --steps 3 \
        --seq 48 --lr 0.02 --seed 5 >"$r.log" 2>&1 || { echo "    train failed"; tail -3 "$r.log"; fail=1; continue; }
    l=$(loss_of "$b" "$r/adapter")
    "$T4PY" "$ROOT/scripts/check_peft.py" --base "$b" --adapter "$r/adapter" --data "$DATA" --loss "$l" 2>&1 |
        grep -E '^(keys|loss|MISMATCH|PEFT WARNING|check_peft)' | sed 's/^/    /'
    [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
    "$MT" merge --model "$b" --adapter "$r/adapter" --out "$W/$name-merged" --dtype f32 >/dev/null 2>&1 || { echo "    merge failed"; fail=1; continue; }
    lm=$(loss_of "$W/$name-merged")
    echo "    merge: eval loss $lm, base + adapter $l $([ "$lm" = "$l" ] && echo same || { echo DIFFERENT; fail=1; })"
done
exit $fail
