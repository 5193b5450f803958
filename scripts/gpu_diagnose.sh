#!/usr/bin/env bash
# scripts/gpu_diagnose.sh — on the GPU machine, after scripts/gpu_check.sh (which unpacks the
# bundle into /tmp/mt-gpu): what the check's failures need to be understood, in one short call.
#   1. cuDNN's own log of the attention graphs the probe builds (why an engine refused one);
#   2. compute-sanitizer's memcheck on chosen CUDA tests (which kernel made a bad access);
#   3. the CLI's 3-step cpu/cuda comparison again with one stream (MT_PROFILE=1) and with
#      cuDNN attention (MT_ATTENTION=cudnn): which part of the step makes a difference.
# Usage: bash scripts/gpu_diagnose.sh [TEST_FILTER...]   (Criterion filters; defaults below)
# Output: $OUT (or gpu-check-out/): diagnose.log and the files it names.
set -u
PREFIX=/tmp/mt-gpu
OUTDIR=${OUT:-gpu-check-out}
mkdir -p "$OUTDIR"
exec > >(tee -a "$OUTDIR/diagnose.log") 2>&1
[ -x "$PREFIX/bin/moetrain" ] || { echo "gpu_diagnose: no $PREFIX/bin/moetrain: run scripts/gpu_check.sh first"; exit 1; }
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export LD_LIBRARY_PATH="$PREFIX/lib:$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PATH:$CUDA_HOME/bin"
bin=$PREFIX/bin
t0=$(date +%s)
since() { echo "($(( $(date +%s) - t0 )) s)"; }

echo "=== 1. cuDNN log of the probe's graphs $(since)"
CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG="$OUTDIR/cudnn.log" timeout 60 "$bin/moetrain_gpu_probe" >"$OUTDIR/probe.txt" 2>&1
echo "probe exit $?; $(wc -c <"$OUTDIR/cudnn.log" 2>/dev/null || echo 0) bytes of log"
grep -n -i -E 'not.?supported|reason|error|fail' "$OUTDIR/cudnn.log" 2>/dev/null | cut -c1-400 | sort -u -t: -k2 | head -n 60
gzip -9f "$OUTDIR/cudnn.log" 2>/dev/null

echo "=== 2. compute-sanitizer memcheck $(since)"
[ $# -eq 0 ] && set -- 'cuda/whole_step_matches_cpu'
# One test at a time, each under a hard limit (TERM, then KILL): run 2 of 2026-11-27 ran four at
# once in the background and one of them held the call to its end.
for f in "$@"; do
  echo "--- $f"
  timeout -k 10 "${MT_DIAG_SANITIZER_S:-60}" compute-sanitizer --tool memcheck --print-limit 4 --target-processes all \
    "$bin/moetrain_tests" --filter "$f" --jobs 1 >"$OUTDIR/sanitizer.txt" 2>&1
  echo "exit $?"
  grep -E '^=========|Synthesis|^\[FAIL\]|fatal' "$OUTDIR/sanitizer.txt" | cut -c1-300 | head -n 40
done
rm -f "$OUTDIR/sanitizer.txt"

echo "=== 3. the CLI comparison, one stream / cuDNN attention $(since)"
d=$(mktemp -d)
"$bin/moetrain" init --config configs/tiny.json --out "$d/tiny" --seed 3 >/dev/null 2>&1 || echo "init failed"
for i in $(seq 0 63); do
  printf '{"messages":[{"role":"user","content":"w%03d"},{"role":"assistant","content":"%03d"}]}\n' "$i" $(( (i * 7) % 1000 ))
done >"$d/data.jsonl"
args=(--model "$d/tiny" --data "$d/data.jsonl" --mode lora --r 4 --quant nf4 --seq 64 --batch 4 --dropout 0 --lr 1e-3 --steps 3)
timeout 60 "$bin/moetrain" train "${args[@]}" --device cpu --out "$d/cpu" 2>&1 | grep '^step='
for v in "plain:" "one-stream:MT_PROFILE=1" "cudnn:MT_ATTENTION=cudnn"; do
  name=${v%%:*} envs=${v#*:}
  echo "--- $name ($envs)"
  env $envs timeout 60 "$bin/moetrain" train "${args[@]}" --device cuda --out "$d/$name" 2>&1 | grep -E '^step=|fatal'
  "$bin/compare_runs" "$d/cpu" "$d/$name" 1e-2 0.25 2>&1 | tail -n 2
done
rm -rf "$d"
echo "=== done $(since)"
