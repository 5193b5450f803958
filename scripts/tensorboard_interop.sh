#!/usr/bin/env bash
# scripts/tensorboard_interop.sh — `--report-to tensorboard` read back by TensorBoard itself (part
# of `make interop`; not CI: it needs the tensorboard package). A 20-step run of the tiny model
# with an evaluation every 5 steps, then scripts/check_tensorboard.py: every scalar's count, steps
# and last value in the event file equal metrics.jsonl's.
#   TBPY: a python with tensorboard installed (default /work/.venv-tb/bin/python; make one with
#         python3 -m venv DIR && DIR/bin/pip install tensorboard)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MT=$ROOT/build/moetrain
TBPY=${TBPY:-/work/.venv-tb/bin/python}
W=$(mktemp -d /tmp/tb_interop.XXXXXX)
trap 'rm -rf "$W"' EXIT
if ! "$TBPY" -c 'import tensorboard' 2>/dev/null; then
    echo "tensorboard_interop: no tensorboard in $TBPY (set TBPY)" >&2
    exit 1
fi
"$MT" init --config "$ROOT/configs/tiny.json" --out "$W/tiny" >/dev/null
for i in $(seq 0 39); do echo "{\"text\": \"sample $i: the quick brown fox $((i * 7)) jumps over the lazy dog\"}"; done >"$W/train.jsonl"
head -8 "$W/train.jsonl" >"$W/eval.jsonl"
"$MT" --model "$W/tiny" --data "$W/train.jsonl" --eval-data "$W/eval.jsonl" --eval-every 5 --steps 20 --seq 64 \
    --lr 0.01 --report-to tensorboard --out "$W/run" >/dev/null
"$TBPY" "$ROOT/scripts/check_tensorboard.py" "$W/run"
