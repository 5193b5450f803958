#!/usr/bin/env bash
# scripts/family_interop.sh — each non-Mixtral family against both Hugging Face stacks
# (docs/families.md "Adapters"). Not part of `make test` (no torch there). For configs/tiny-{qwen2-moe,
# qwen3-moe,olmoe}.json (vocab raised to 300 for the byte-level tokenizer; OLMoE also with
# clip_qkv 0.5 and attention_bias, which cut and add there):
#   * `moetrain init` output loads in transformers 4.57 clean (scripts/check_family_init.py);
#   * per target selection, a 3-step LoRA run written as v4 and as v5 (same seed): moetrain eval
#     gives both the same loss; PEFT 0.17 on transformers 4.57 loads the v4 adapter and PEFT 0.21
#     on transformers 5 the v5 one, each with no missing, unexpected or ignored key and moetrain
#     eval's loss (scripts/check_peft.py); PEFT's own converter on the v4 adapter under
#     transformers 5 is reported, not required;
#   * `moetrain merge` of each gives the same eval loss.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MT=$ROOT/build/moetrain
T4PY=${T4PY:-/work/.venv-t4/bin/python}
T5PY=${T5PY:-/work/.venv-t5/bin/python}
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
check() {  # name python base adapter loss required
    local out rc
    out=$("$2" "$ROOT/scripts/check_peft.py" --base "$3" --adapter "$4" --data "$DATA" --loss "$5" 2>&1)
    rc=$?
    local crash=""
    echo "$out" | grep -q '^check_peft:' || crash=" | CRASHED: $(echo "$out" | grep -E 'Error' | tail -1 | cut -c1-200)"
    printf '      %-26s %s%s\n' "$1" "$(echo "$out" | grep -E '^(keys|loss|MISMATCH|PEFT WARNING|check_peft)' | tr '\n' ';' | sed 's/;/ | /g')" "$crash"
    if [ $rc -ne 0 ] && [ "$6" = required ]; then fail=1; fi
}
# name|flags: every target; and a subset (layer 0 and 1, two experts, gate and up only) that makes
# the target lists name full paths and leaves experts' slots zero in the fused tensors
SELECTIONS=("--targets all|--targets all" "--layers 0,1 --experts 0,2 --targets w1,w3,q|--layers 0,1 --experts 0,2 --targets w1,w3,q")
for name in qwen2-moe qwen3-moe olmoe; do
    echo "== $name"
    b=$W/$name-base
    "$MT" init --config "$W/$name.json" --out "$b" --dtype f32 --seed 7 >/dev/null || { echo "    init failed"; fail=1; continue; }
    "$T4PY" "$ROOT/scripts/check_family_init.py" "$b" | sed 's/^/    /' || fail=1
    for sel in "${SELECTIONS[@]}"; do
        flags=${sel#*|}
        d=$W/$name-$(echo "${sel%%|*}" | tr -c 'a-z0-9' '_')
        echo "    -- ${sel%%|*}"
        for f in v4 v5; do
            # shellcheck disable=SC2086
            "$MT" train --model "$b" --data "$DATA" --out "$d/$f" --mode lora --r 4 $flags --quant none --steps 3 \
                --seq 48 --lr 0.02 --seed 5 --peft-format $f >"$d.$f.log" 2>&1 || { echo "      train $f failed"; tail -3 "$d.$f.log"; fail=1; continue 2; }
        done
        l4=$(loss_of "$b" "$d/v4/adapter"); l5=$(loss_of "$b" "$d/v5/adapter")
        echo "      moetrain eval: v4 loss=$l4 v5 loss=$l5 $([ "$l4" = "$l5" ] && echo same || { echo DIFFERENT; fail=1; })"
        check "v4 on transformers 4.57" "$T4PY" "$b" "$d/v4/adapter" "$l4" required
        check "v5 on transformers 5" "$T5PY" "$b" "$d/v5/adapter" "$l5" required
        check "v4 on 5 (PEFT converter)" "$T5PY" "$b" "$d/v4/adapter" "$l4" info
        for f in v4 v5; do
            "$MT" merge --model "$b" --adapter "$d/$f/adapter" --out "$d/m$f" --dtype f32 >/dev/null 2>&1 || { echo "      merge $f failed"; fail=1; continue; }
            lm=$(loss_of "$d/m$f")
            echo "      merge $f: eval loss $lm, base + adapter $l4 $([ "$lm" = "$l4" ] && echo same || { echo DIFFERENT; fail=1; })"
        done
    done
done
echo "family_interop: $([ $fail = 0 ] && echo OK || echo FAILED) (work folder $W)"
exit $fail
