#!/usr/bin/env bash
# scripts/interop.sh — `make interop`: moetrain's adapters against the Hugging Face stacks.
# Not part of `make test` (CI has no torch). Needs two venvs:
#   T5PY: the newest transformers 5 + PEFT + bitsandbytes   (default /work/.venv-t5/bin/python)
#   T4PY: transformers 4.57 + PEFT 0.17                      (default /work/.venv-t4/bin/python)
# For each target selection it trains a tiny odd-sized model twice with the same seed, writing
# a v4 and a v5 adapter, and checks:
#   * moetrain eval gives the same loss on both layouts;
#   * check_peft.py: the v4 adapter on the 4.57 stack and the v5 adapter on the 5.x stack load
#     with no missing/unexpected/ignored key and PEFT's loss equals moetrain eval's to 1e-4
#     (the v4 adapter on 5.x, through PEFT's own converter, is reported, not required);
#   * merge (f32) of the v5 adapter equals merge of the v4 adapter to 1e-6.
# FIXTURES=1 also rewrites tests/data/peft_v5/ (a v4 adapter and PEFT's v5 conversion of it).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MT=$ROOT/build/moetrain
T5PY=${T5PY:-/work/.venv-t5/bin/python}
T4PY=${T4PY:-/work/.venv-t4/bin/python}
W=${W:-$(mktemp -d /tmp/interop.XXXXXX)}
DATA=$ROOT/scripts/interop/data.jsonl
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
fail=0

"$MT" init --config "$ROOT/scripts/interop/config.json" --out "$W/base" --dtype f32 --seed 7 >/dev/null || exit 1

loss_of() { "$MT" eval --model "$W/base" --adapter "$1" --data "$DATA" --quant none 2>/dev/null | sed -n 's/^loss=\([0-9.]*\).*/\1/p'; }

check() {  # name python adapter loss required
    local out
    out=$("$2" "$ROOT/scripts/check_peft.py" --base "$W/base" --adapter "$3" --data "$DATA" --loss "$4" 2>&1)
    local rc=$?
    local crash=""
    echo "$out" | grep -q '^check_peft:' || crash=" | CRASHED: $(echo "$out" | grep -E 'Error' | tail -1 | cut -c1-200)"
    printf '    %-28s %s%s\n' "$1" "$(echo "$out" | grep -E '^(stack|keys|loss|MISMATCH|PEFT WARNING|check_peft)' | tr '\n' ';' | sed 's/;/ | /g')" "$crash"
    if [ $rc -ne 0 ] && [ "$5" = required ]; then fail=1; fi
}

SELECTIONS=(
    "experts (default)|--targets experts"
    "--experts 0,3,5|--targets experts --experts 0,3,5"
    "--layers 1 --targets all|--layers 1 --targets all"
    "routers only|--targets gate"
    "attention only|--targets attn"
    "--targets all|--targets all"
    "--layers 0 --targets w2|--layers 0 --targets w2"
    "--targets w1,w3,q --rslora|--targets w1,w3,q --rslora --alpha 6"
)
for sel in "${SELECTIONS[@]}"; do
    name=${sel%%|*}
    case "$name" in *"${ONLY:-}"*) ;; *) continue ;; esac  # ONLY=text: the selections whose name holds it
    flags=${sel#*|}
    d=$W/$(echo "$name" | tr -c 'a-z0-9' '_')
    echo "== $name"
    for f in v4 v5; do
        # shellcheck disable=SC2086
        "$MT" train --model "$W/base" --data "$DATA" --out "$d/$f" --mode lora --r 4 $flags --quant none \
            --steps 3 --seq 48 --lr 0.02 --seed 5 --peft-format $f >"$d.$f.log" 2>&1 || { echo "   train $f failed"; tail -3 "$d.$f.log"; fail=1; continue 2; }
    done
    l4=$(loss_of "$d/v4/adapter"); l5=$(loss_of "$d/v5/adapter")
    echo "    moetrain eval: v4 loss=$l4 v5 loss=$l5 $([ "$l4" = "$l5" ] && echo same || { echo DIFFERENT; fail=1; })"
    check "v4 on transformers 4.57" "$T4PY" "$d/v4/adapter" "$l4" required
    check "v5 on transformers 5" "$T5PY" "$d/v5/adapter" "$l5" required
    check "v4 on 5 (PEFT converter)" "$T5PY" "$d/v4/adapter" "$l4" info
    "$MT" merge --model "$W/base" --adapter "$d/v4/adapter" --out "$d/m4" --dtype f32 >/dev/null 2>&1 &&
    "$MT" merge --model "$W/base" --adapter "$d/v5/adapter" --out "$d/m5" --dtype f32 >/dev/null 2>&1 || { echo "    merge failed"; fail=1; }
    "$T5PY" - "$d/m4" "$d/m5" <<'PY' || fail=1
import sys
from safetensors.numpy import load_file
a = load_file(sys.argv[1] + "/model.safetensors"); b = load_file(sys.argv[2] + "/model.safetensors")
assert a.keys() == b.keys(), "different tensors"
d = max(float(abs(a[k].astype("float64") - b[k].astype("float64")).max()) for k in a)
print("    merge v5 vs v4 (f32): max |diff| %.3g over %d tensors %s" % (d, len(a), "OK" if d <= 1e-6 else "FAILED"))
sys.exit(0 if d <= 1e-6 else 1)
PY
done

# bnb-4bit checkpoints written by `moetrain quantize` (README's matrix; reported, not required):
# per-expert 4-bit experts load on 4.57, not on 5.x (upstream); attention-only 4-bit loads on both.
echo "== bnb-4bit checkpoints (moetrain quantize) loaded by transformers"
for qt in "experts,attn" "attn"; do
    q=$W/q4_${qt/,/_}
    "$MT" quantize --model "$W/base" --out "$q" --quant-targets "$qt" >/dev/null 2>&1 || { echo "    quantize failed"; fail=1; continue; }
    for py in "$T4PY" "$T5PY"; do
        "$py" - "$q" "$qt" <<'PY' 2>/dev/null | tail -1
import sys, transformers
from transformers import AutoModelForCausalLM
try:
    m = AutoModelForCausalLM.from_pretrained(sys.argv[1])
    n4 = sum(type(p).__name__ == "Params4bit" for p in m.parameters())
    print("    --quant-targets %-13s transformers %-7s loads (%d Params4bit)" % (sys.argv[2], transformers.__version__, n4))
except Exception as e:
    print("    --quant-targets %-13s transformers %-7s does not load: %s" % (sys.argv[2], transformers.__version__, type(e).__name__))
PY
    done
done

if [ "${FIXTURES:-0}" = 1 ]; then
    FX=$ROOT/tests/data/peft_v5
    rm -rf "$FX"; mkdir -p "$FX"
    src=$(ls -d "$W"/__targets_all*/v4/adapter | head -1)
    cp "$src/adapter_config.json" "$src/adapter_model.safetensors" "$FX/"
    "$T5PY" - "$W/base" "$FX" <<'PY' || fail=1
import json, os, sys, transformers, peft, torch
from transformers import AutoModelForCausalLM
from peft import PeftModel
base, fx = sys.argv[1], sys.argv[2]
m = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), fx)
out = os.path.join(fx, "peft_v5")
m.save_pretrained(out)
for name in os.listdir(out):
    if name not in ("adapter_model.safetensors", "adapter_config.json"): os.remove(os.path.join(out, name))
json.dump({"made_by": "scripts/interop.sh FIXTURES=1", "transformers": transformers.__version__, "peft": peft.__version__,
           "what": "adapter_model.safetensors: moetrain's v4 adapter (--targets all, r 4); peft_v5/: PEFT's conversion of it to transformers 5's layout, saved by save_pretrained"},
          open(os.path.join(fx, "meta.json"), "w"), indent=1)
print("fixtures: wrote", fx)
PY
fi
echo "interop: $([ $fail = 0 ] && echo OK || echo FAILED) (work folder $W)"
exit $fail
