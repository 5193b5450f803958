#!/usr/bin/env bash
# scripts/family_interop_peft.sh — PEFT adapters of gpt-oss and the DeepSeek-style families
# (issues 29, 30; docs/families.md "Adapters"), the sibling of scripts/family_interop.sh. Not
# part of `make test` (no torch there). For the tiny configs of tests/data/golden/{gpt_oss,
# deepseek_v2,deepseek_v3,glm4_moe,glm4_moe_lite} (scripts/make_*_goldens.py: every part on; vocab raised to
# 300 for the byte-level tokenizer; gpt-oss's swiglu_limit back to 7.0, the only value transformers
# 4.57 uses):
#   * `moetrain init`, then per layout a 3-step `train --mode lora --targets all` (one seed):
#     gpt-oss writes one layout for both --peft-format values (checked: the files are equal);
#   * `moetrain eval --adapter` of v4 and v5 give the same loss;
#   * scripts/check_peft.py: PEFT 0.17 on transformers 4.57 loads v4, PEFT 0.21 on transformers
#     5 loads v5 (gpt-oss: the one layout on both), no missing, unexpected or ignored key, every
#     tensor bit for bit, loss equal to eval's to 1e-4;
#   * DeepSeek-style: `moetrain merge` of each adapter against PEFT's merge_and_unload() of it
#     (scripts/check_peft_merge.py, logits), and merge's eval loss against base + adapter.
#     gpt-oss too (its fused experts folded back by trainer/cmd/fused_write.c).
#   * glm4_moe_lite (GLM-4.7-Flash) is in transformers 5 only: its v4 layout is written and
#     evaluated, but checked against PEFT on transformers 5 alone.
# T4PY / T5PY: the two stacks' pythons.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MT=$ROOT/build/moetrain
T4PY=${T4PY:-/work/.venv-t4cfg/bin/python}
T5PY=${T5PY:-/work/.venv-t5cfg/bin/python}
W=${W:-$(mktemp -d /tmp/family_interop_peft.XXXXXX)}
mkdir -p "$W"
DATA=$ROOT/scripts/interop/data.jsonl
FAMILIES=${FAMILIES:-"gpt_oss deepseek_v2 deepseek_v3 glm4_moe glm4_moe_lite"}
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
fail=0
"$T5PY" - "$ROOT" "$W" $FAMILIES <<'PY' || exit 1
import json, sys
root, w = sys.argv[1], sys.argv[2]
for fam in sys.argv[3:]:
    c = json.load(open(f"{root}/tests/data/golden/{fam}/config.json"))
    c.pop("transformers_version", None)
    c.update(vocab_size=300, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if fam == "gpt_oss":  # transformers 4.57's GptOssExperts hard-codes limit 7.0 whatever the config says
        c["swiglu_limit"] = 7.0
    json.dump(c, open(f"{w}/{fam}.json", "w"), indent=2)
PY
loss_of() { "$MT" eval --model "$1" ${2:+--adapter "$2"} --data "$DATA" --quant none 2>/dev/null | sed -n 's/^loss=\([0-9.]*\).*/\1/p'; }
check() {  # label python base adapter loss
    local out
    out=$("$2" "$ROOT/scripts/check_peft.py" --base "$3" --adapter "$4" --data "$DATA" --loss "$5" 2>&1)
    local rc=$? crash=""
    echo "$out" | grep -q '^check_peft:' || crash=" | CRASHED: $(echo "$out" | grep -E 'Error' | tail -1 | cut -c1-300)"
    printf '    %-24s %s%s\n' "$1" "$(echo "$out" | grep -E '^(keys|loss|MISMATCH|PEFT WARNING|check_peft|  missing|  ignored)' | tr '\n' ';' | sed 's/;/ | /g')" "$crash"
    [ $rc -eq 0 ] || fail=1
}
for fam in $FAMILIES; do
    echo "== $fam"
    b=$W/$fam-base d=$W/$fam
    "$MT" init --config "$W/$fam.json" --out "$b" --dtype f32 --seed 7 >/dev/null || { echo "  init failed"; fail=1; continue; }
    for f in v4 v5; do
        "$MT" train --model "$b" --data "$DATA" --out "$d/$f" --mode lora --r 4 --targets all --quant none --steps 3 \
            --seq 48 --lr 0.02 --seed 5 --peft-format $f >"$d.$f.log" 2>&1 || { echo "  train $f failed"; tail -3 "$d.$f.log"; fail=1; continue 2; }
    done
    l4=$(loss_of "$b" "$d/v4/adapter"); l5=$(loss_of "$b" "$d/v5/adapter"); lb=$(loss_of "$b")
    echo "  moetrain eval: base $lb, v4 adapter $l4, v5 adapter $l5 $([ "$l4" = "$l5" ] && echo "(same)" || { echo DIFFERENT; fail=1; })"
    if [ "$fam" = gpt_oss ]; then
        for x in adapter_config.json adapter_model.safetensors; do
            cmp -s "$d/v4/adapter/$x" "$d/v5/adapter/$x" || { echo "  v4 and v5 $x differ"; fail=1; }
        done
        echo "  --peft-format v4 and v5: the same files (the fused layout, PEFT's only one for gpt-oss)"
        check "on transformers 4.57" "$T4PY" "$b" "$d/v4/adapter" "$l4"
        check "on transformers 5" "$T5PY" "$b" "$d/v5/adapter" "$l5"
    else
        [ "$fam" = glm4_moe_lite ] || check "v4 on transformers 4.57" "$T4PY" "$b" "$d/v4/adapter" "$l4"
        check "v5 on transformers 5" "$T5PY" "$b" "$d/v5/adapter" "$l5"
    fi
    for f in v4 v5; do
        [ "$fam" = glm4_moe_lite ] && [ $f = v4 ] && continue  # no transformers 4 model to merge against
        py=$T5PY; [ $f = v4 ] && py=$T4PY
        "$MT" merge --model "$b" --adapter "$d/$f/adapter" --out "$d/m$f" --dtype f32 >"$d.m$f.log" 2>&1 || { echo "    merge $f failed: $(tail -1 "$d.m$f.log")"; fail=1; continue; }
        lm=$(loss_of "$d/m$f")
        echo "    merge $f: moetrain eval of the merged model $lm, base + adapter $l4 $([ "$lm" = "$l4" ] && echo "(same)" || echo "(differs)")"
        out=$("$py" "$ROOT/scripts/check_peft_merge.py" --base "$b" --adapter "$d/$f/adapter" --merged "$d/m$f" --data "$DATA" 2>&1)
        echo "$out" | grep -q '^merge:' || { echo "    PEFT merge check CRASHED: $(echo "$out" | grep Error | tail -1 | cut -c1-300)"; fail=1; continue; }
        echo "    $f vs PEFT merge_and_unload: $(echo "$out" | grep '^merge:' | cut -c8-)"
        echo "$out" | grep -q 'OK$' || fail=1
    done
done
echo "family_interop_peft: $([ $fail = 0 ] && echo OK || echo FAILED) (work folder $W)"
exit $fail
