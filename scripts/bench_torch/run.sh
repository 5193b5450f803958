#!/usr/bin/env bash
# make bench-torch: moetrain beside PyTorch+transformers+PEFT on the same checkpoint and token rows
# (scripts/bench_torch/bench_torch.py). Not part of CI: it needs torch from PyPI, which this
# script installs into $BENCH_TORCH_VENV (default ~/.cache/moetrain-bench-torch) on first use.
# usage: run.sh BUILD/moetrain [bench_torch.py flags...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${BENCH_TORCH_VENV:-$HOME/.cache/moetrain-bench-torch}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, transformers, peft' 2>/dev/null; then
  echo "bench-torch: installing $here/requirements.txt into $venv (torch is a large download)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r "$here/requirements.txt"
fi
exec "$venv/bin/python" "$here/bench_torch.py" --moetrain "$1" "${@:2}"
