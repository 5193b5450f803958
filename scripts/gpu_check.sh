#!/usr/bin/env bash
# scripts/gpu_check.sh — the GPU check: on a lent H100 machine, in one command of at most 10
# minutes, from the repository root, with the bundle `make gpu-bundle` built here carried along.
#
#   make gpu-bundle                          # here: .gpubundle/ (programs + libraries, sm_90a)
#   bash scripts/gpu_check.sh                # there (carry .gpubundle; .whl for PEFT if built)
#   bash scripts/gpu_check.sh --estimate     # the steps, their time estimates and limits; no run
#   bash scripts/gpu_check.sh --rehearse     # here, as root: the whole check in a clean Debian 12
#                                            # root with no -dev packages and no network, up to
#                                            # the first call that needs a GPU
#
# Nothing is compiled there: the GPU machine has the CUDA toolkit, PyTorch and its NVIDIA wheels,
# but no Debian -dev packages and no package registry. cuBLASLt and NCCL are found on the
# machine (the toolkit, the dynamic linker's cache, or PyTorch's nvidia-* wheels); the rest comes
# in the bundle. Every step runs under `timeout`, within a deadline for the whole check
# (MT_GPU_CHECK_DEADLINE, default 540 s), and says PASS, FAIL or SKIP. Results go, as they come, to
# $OUT (the device tool's folder) or to gpu-check-out/: gpu_check.log (everything printed) and
# gpu_check.json (every result so far, rewritten after each step), so a run cut off keeps what it
# measured. Exit 0 when every step passed, 1 otherwise.
#
# Environment: MT_GPU_CHECK_LAYERS (Mixtral layers built, default 4), MT_GPU_CHECK_DEADLINE,
# MT_GPU_BUNDLE_DIR (default .gpubundle), MT_GPU_CHECK_SEQS (case C's lengths, default "4096
# 16384"), MT_GPU_CHECK_BENCH_ARGS (more flags for moetrain_bench_gpu), MT_GPU_CHECK_SKIP (steps
# to skip, by function name: "step_tests step_baseline"; shown as SKIP (asked), not failures),
# MT_GPU_CHECK_PARITY_ARGS (default --bench: also time an 8192³ bf16 GEMM).
# MT_GPU_CHECK_BUILD=DIR runs the programs of a build folder instead of a bundle: with build-sim
# (make SIM=1), make test-sim runs the check's GPU path end to end, CPU-emulated. Internal: MT_GPU_CHECK_REHEARSAL=1 (set by --rehearse
# inside the clean root): a step passes when its program started and reported that there is no
# GPU; a library that does not load fails it, by name.
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${MT_GPU_BUNDLE_DIR:-.gpubundle}
PREFIX=/tmp/mt-gpu                 # where the bundle unpacks (the test suite's compiled-in path)
LAYERS=${MT_GPU_CHECK_LAYERS:-4}
DEADLINE=${MT_GPU_CHECK_DEADLINE:-540}
REHEARSAL=${MT_GPU_CHECK_REHEARSAL:-0}
read -r -a SEQS <<<"${MT_GPU_CHECK_SEQS:-4096 16384}"
read -r -a BENCH_ARGS <<<"${MT_GPU_CHECK_BENCH_ARGS:-}"
BUILD_DIR=${MT_GPU_CHECK_BUILD:-}
# prog NAME: a program of the check, from the unpacked bundle or the build folder.
prog() {
  if [ -z "$BUILD_DIR" ]; then echo "$PREFIX/bin/$1"
  elif [ "$1" = compare_runs ]; then echo "$BUILD_DIR/tests/mpi/compare_runs"
  else echo "$BUILD_DIR/$1"; fi
}
TESTS_LIST=$PREFIX/bin/cuda_tests.txt

# --- the steps: name, estimate on an H100 (s), limit (s), function -----------------------------
# Estimates: the bundle unpacks in ~3 s; the probe's NCCL init ~5 s; the parity program's ~250
# small cases ~15 s; the CLI's tiny model 2 x 3 steps ~20 s; the Mixtral step (4 layers): the
# build ~15 s (5 quantizations, the rest device copies), case C at 4k ~1 s a step and at 16k
# ~5 s (the static review's 6-7 s for 32 layers at 4k, attention x4 per token at 16k), 1 warm-up
# + 2 timed each, case A at 4k, the peaks ~10 s, plan --measure on the CPU ~10 s; the PyTorch
# baseline ~60 s (imports ~15 s, matmul and SDPA ~5 s, a 4-layer Mixtral with PEFT built on the
# GPU ~10 s, 5 steps at 4k ~15 s); the 98 CUDA tests ~90 s (CPU references at small sizes, 16 cores).
STEPS=(
  "bundle|5|60|step_bundle"
  "probe (device, versions, 1-rank NCCL)|10|60|step_probe"
  "machine|5|30|step_machine"
  "parity (every CUDA op against its CPU twin, matmul)|20|90|step_parity"
  "CLI: 3 steps on cpu and on cuda, compared|25|120|step_cli"
  "Mixtral-8x7B step, $LAYERS layers, MT_PROFILE=1: case C at ${SEQS[*]}, case A|90|240|step_bench"
  "cuDNN attention (MT_ATTENTION=cudnn): CLI 3 steps compared, the case C step at ${SEQS[*]} (--dequant-cache on --expert-cache all)|40|150|step_cudnn"
  "PyTorch + transformers + PEFT baseline, same shapes|60|180|step_baseline"
  "CUDA tests of the suite|90|200|step_tests"
)

estimate() {
  local total=0 s name est lim
  echo "gpu_check: steps (estimate on an H100 / limit, seconds):"
  for s in "${STEPS[@]}"; do
    IFS='|' read -r name est lim _ <<<"$s"
    printf '  %4d / %4d  %s\n' "$est" "$lim" "$name"
    total=$((total + est))
  done
  printf '  %4d s in all by the estimate (%s minutes; budget 6); the whole check stops at %d s\n' "$total" \
    "$(awk -v t="$total" 'BEGIN { printf "%.1f", t / 60 }')" "$DEADLINE"
  ESTIMATE_TOTAL=$total
}

case "${1:-}" in
  --estimate) estimate; exit 0;;
  --rehearse) shift; exec bash scripts/gpu_rehearse.sh "$@";;
  "") ;;
  *) echo "usage: $0 [--estimate | --rehearse [--plant LIBRARY]]" >&2; exit 2;;
esac

OUTDIR=${OUT:-gpu-check-out}
mkdir -p "$OUTDIR"
LOG="$OUTDIR/gpu_check.log" JSON="$OUTDIR/gpu_check.json"
export MT_GPU_JSONL="$OUTDIR/.results.jsonl"
: >"$MT_GPU_JSONL"
exec > >(tee -a "$LOG") 2>&1
START=$(date +%s)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# One JSON file of every result so far: the programs' lines and the steps' own.
write_json() {
  { printf '{"check":"gpu_check","rehearsal":%s,"started":"%s","results":[\n' \
      "$([ "$REHEARSAL" = 1 ] && echo true || echo false)" "$STARTED"
    paste -sd, "$MT_GPU_JSONL"; printf ']}\n'; } >"$JSON.tmp" && mv "$JSON.tmp" "$JSON"
}
record() { printf '%s\n' "$*" >>"$MT_GPU_JSONL"; write_json; }
STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)

# run_limited LIMIT CMD...: CMD under timeout (TERM, then KILL 10 s later), output shown and kept
# in $WORK/out for the step's verdict.
run_limited() {
  local lim=$1; shift
  timeout -k 10 "$lim" "$@" 2>&1 | tee "$WORK/out"
  return "${PIPESTATUS[0]}"
}
# In a rehearsal a GPU program must start and then say there is no GPU: 0 when that is what
# $WORK/out shows, 1 otherwise (with the reason).
rehearsed_ok() {
  if grep -q 'error while loading shared libraries' "$WORK/out"; then
    echo "gpu_check: MISSING LIBRARY: $(grep -o -m 1 'error while loading shared libraries: [^:]*' "$WORK/out" | sed 's/.*: //')"
    return 1
  fi
  grep -qi 'no CUDA GPU' "$WORK/out" && return 0
  echo "gpu_check: the program did not report 'no CUDA GPU'"
  return 1
}
# gpu_result RC: a GPU program's verdict: its exit status on a GPU; in a rehearsal, whether it
# started and found no GPU (exit 2 or a clean error), never a hang or a crash.
gpu_result() {
  local rc=$1
  if [ "$REHEARSAL" = 1 ]; then
    if [ "$rc" -ge 124 ] && ! grep -q 'error while loading shared libraries' "$WORK/out"; then
      echo "gpu_check: ended by a signal or the limit (exit $rc)"
      return 1
    fi
    rehearsed_ok
    return
  fi
  return "$rc"
}

# --- steps ------------------------------------------------------------------------------------
# find_lib NAME: a CUDA library of this machine: the toolkit, the dynamic linker's cache, then
# /opt, /usr and /root (PyTorch's nvidia-* wheels under site-packages); nothing when absent.
find_lib() {
  local dir found="" cuda_home=${CUDA_HOME:-/usr/local/cuda}
  for dir in "$cuda_home/lib64" "$cuda_home/lib" "$cuda_home/targets/x86_64-linux/lib"; do
    [ -e "$dir/$1" ] && found="$dir/$1" && break
  done
  [ -n "$found" ] || found=$(ldconfig -p 2>/dev/null | awk -v l="$1" '$1 == l && !n++ {print $NF}')
  [ -n "$found" ] || found=$(find /opt /usr/local/lib /usr/lib /root -name "$1" \( -type f -o -type l \) 2>/dev/null | sort | sed -n 1p)
  echo "$found"
}

step_bundle() {
  local lim=$1
  if [ -n "$BUILD_DIR" ]; then  # a build folder of this machine: its programs, its test list
    local p
    for p in moetrain moetrain_tests moetrain_bench_gpu moetrain_gpu_probe cuda_parity moetrain_roofline compare_runs; do
      [ -x "$(prog $p)" ] || { echo "gpu_check: $(prog $p) is missing: build it first"; return 1; }
    done
    TESTS_LIST=$WORK/cuda_tests.txt
    bash tests/cuda_tests.sh "$(prog moetrain_tests)" | sort -u >"$TESTS_LIST"
    echo "gpu_check: the programs of $BUILD_DIR, $(wc -l <"$TESTS_LIST") CUDA tests listed"
    return 0
  fi
  [ -f "$BUNDLE/mt-gpu.tar.gz" ] && [ -f "$BUNDLE/manifest.txt" ] ||
    { echo "gpu_check: no bundle in $BUNDLE: run 'make gpu-bundle' on the development machine and carry $BUNDLE"; return 1; }
  sed -n '1,4p' "$BUNDLE/manifest.txt"
  local want have
  want=$(awk '$1 == "sources" {print $2}' "$BUNDLE/manifest.txt")
  have=$(bash scripts/gpu_source_hash.sh)
  [ "$want" = "$have" ] || { echo "gpu_check: the bundle was built from other sources ($want, this tree $have): rebuild it (make gpu-bundle)"; return 1; }
  rm -rf "$PREFIX" && mkdir -p "$PREFIX" && timeout "$lim" tar -C "$PREFIX" -xzf "$BUNDLE/mt-gpu.tar.gz" || return 1
  (cd "$PREFIX" && awk '$1 == "file" {print $2 "  " $3}' "$OLDPWD/$BUNDLE/manifest.txt" | sha256sum --quiet -c -) ||
    { echo "gpu_check: the bundle's files differ from its manifest"; return 1; }
  # CUDA's own libraries, found on this machine: the toolkit, the linker's cache, PyTorch's wheels.
  local lib found
  LIBPATH="$PREFIX/lib"
  for lib in $(awk '$1 == "needs" {$1 = ""; print}' "$BUNDLE/manifest.txt"); do
    found=$(find_lib "$lib")
    if [ -z "$found" ]; then echo "gpu_check: $lib not found on this machine (toolkit, ldconfig, /opt, /usr)"; return 1; fi
    echo "gpu_check: $lib: $found"
    LIBPATH="$LIBPATH:$(dirname "$found")"
  done
  # Optional (dlopened): cuDNN for attention; without it the WMMA kernel runs, said once.
  for lib in $(awk '$1 == "optional" {$1 = ""; print}' "$BUNDLE/manifest.txt"); do
    found=$(find_lib "$lib")
    if [ -z "$found" ]; then echo "gpu_check: $lib not found on this machine (optional: attention on the WMMA kernel)"; continue; fi
    echo "gpu_check: $lib: $found"
    LIBPATH="$LIBPATH:$(dirname "$found")"
  done
  export LD_LIBRARY_PATH="$LIBPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # Every program must load: a library the bundle lacks is named here, not inside a step. Exit 3
  # then: the step fails, but the programs that do load still run (one loan, as much learnt).
  local p bad=0
  for p in "$PREFIX"/bin/*; do
    [ -x "$p" ] || continue
    if grep -q 'not found' <(ldd "$p"); then
      echo "gpu_check: MISSING LIBRARY for $(basename "$p"): $(ldd "$p" | awk '/not found/ {print $1}' | paste -sd' ')"
      bad=3
    fi
  done
  return $bad
}

step_machine() {
  local lim=$1
  if ! command -v nvidia-smi >/dev/null; then
    echo "gpu_check: nvidia-smi not found (no NVIDIA driver)"
    [ "$REHEARSAL" = 1 ]; return
  fi
  run_limited "$lim" nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  local rc=$?
  timeout 10 nvidia-smi | sed -n 1,20p
  command -v nvcc >/dev/null && nvcc --version | tail -n 1
  return $rc
}

step_probe() {
  NCCL_DEBUG=WARN run_limited "$1" "$(prog moetrain_gpu_probe)"
  gpu_result $?
}

step_parity() {
  run_limited "$1" "$(prog cuda_parity)" ${MT_GPU_CHECK_PARITY_ARGS---bench}
  gpu_result $?
}

step_cli() {
  local lim=$1 bin="$(prog moetrain)" d="$WORK/cli" dev rc
  mkdir -p "$d"
  "$bin" init --config configs/tiny.json --out "$d/tiny" --seed 3 >"$d/init.log" 2>&1 ||
    { cat "$d/init.log"; return 1; }
  for i in $(seq 0 63); do
    printf '{"messages":[{"role":"user","content":"w%03d"},{"role":"assistant","content":"%03d"}]}\n' "$i" $(( (i * 7) % 1000 ))
  done >"$d/data.jsonl"
  local args=(--model "$d/tiny" --data "$d/data.jsonl" --mode lora --r 4 --quant nf4 --seq 64 --batch 4 --dropout 0
              --lr 1e-3 --steps 3)
  run_limited "$lim" "$bin" train "${args[@]}" --device cpu --out "$d/cpu" || { echo "gpu_check: train --device cpu failed"; return 1; }
  run_limited "$lim" "$bin" train "${args[@]}" --device cuda --out "$d/cuda"
  rc=$?
  if [ "$REHEARSAL" = 1 ]; then gpu_result $rc; return; fi
  [ $rc = 0 ] || return $rc
  # The CUDA step is bf16, the CPU's fp32: losses to 1e-2; the adapters to 25% relative L2 (Adam's
  # first steps normalise each gradient element, so the bf16 roundings of the tiny ones show in
  # full: 7% seen CPU-emulated with cuDNN's attention stand-in, 15.3% with the WMMA kernels'
  # bf16 P, the default since 2026-11-27; the H100's broken run 1 was 138%).
  "$(prog compare_runs)" "$d/cpu" "$d/cuda" 1e-2 0.25
}

step_bench() {
  local lim=$1 seqargs=() s
  for s in "${SEQS[@]}"; do seqargs+=(--seq "$s"); done
  local dev=() name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
  case "$name" in *H200*) dev=(--device h200);; esac  # the card's model (scripts/step_time.h)
  "$(prog moetrain_roofline)" "${dev[@]}" || echo "gpu_check: the roofline projection failed"
  if [ "$REHEARSAL" = 1 ]; then
    # The same program on the tiny model with the emulator's sizes would need a GPU too: here it
    # must start and find none.
    run_limited "$lim" "$(prog moetrain_bench_gpu)" --layers "$LAYERS" --case C "${seqargs[@]}" --case A --steps 2 \
      "${BENCH_ARGS[@]}"
    gpu_result $?; return
  fi
  MT_PROFILE=1 run_limited "$lim" "$(prog moetrain_bench_gpu)" \
    --layers "$LAYERS" --case C "${seqargs[@]}" --case A --steps 2 "${BENCH_ARGS[@]}"
}

# The same CLI comparison and case C step with cuDNN's SDPA in both directions (a refusal is
# fatal under MT_ATTENTION=cudnn, so a pass means cuDNN ran). The step keeps attention's 4-bit
# weights and every layer's experts in bf16 (--dequant-cache on --expert-cache all, the experts
# dequantized by the warm-up): beside step_bench's, what dequantizing them costs.
step_cudnn() {
  local lim=$1 bin="$(prog moetrain)" d="$WORK/cli" rc seqargs=() s
  for s in "${SEQS[@]}"; do seqargs+=(--seq "$s"); done
  if [ -f "$d/cpu/adapter/adapter_model.safetensors" ] || [ "$REHEARSAL" = 1 ]; then
    local args=(--model "$d/tiny" --data "$d/data.jsonl" --mode lora --r 4 --quant nf4 --seq 64 --batch 4 --dropout 0
                --lr 1e-3 --steps 3)
    MT_ATTENTION=cudnn run_limited "$lim" "$bin" train "${args[@]}" --device cuda --out "$d/cudnn"
    rc=$?
    if [ "$REHEARSAL" = 1 ]; then gpu_result $rc; return; fi
    [ $rc = 0 ] || return $rc
    "$(prog compare_runs)" "$d/cpu" "$d/cudnn" 1e-2 0.25 || return 1
  else
    echo "gpu_check: no CPU run of the CLI step to compare with: the case C step only"
  fi
  MT_ATTENTION=cudnn MT_PROFILE=1 run_limited "$lim" "$(prog moetrain_bench_gpu)" \
    --layers "$LAYERS" --case C "${seqargs[@]}" --steps 2 --no-overlap --dequant-cache on --expert-cache all \
    "${BENCH_ARGS[@]}"
}

step_baseline() {
  local lim=$1
  if ! command -v python3 >/dev/null || ! python3 -c 'import torch' 2>/dev/null; then
    echo "gpu_check: no python3 with torch here"
    [ "$REHEARSAL" = 1 ] && { echo "gpu_check: (rehearsal: the clean root has no PyTorch; --rehearse compiled the script outside)"; return 0; }
    return 1
  fi
  [ -f scripts/gpu_baseline.py ] || { echo "gpu_check: scripts/gpu_baseline.py is missing"; return 1; }
  # PEFT as carried (gpu_wheels.sh), over whatever version the machine has.
  if compgen -G "$BUNDLE/whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/mt-site \
      "$BUNDLE"/whl/*.whl && export PYTHONPATH="/tmp/mt-site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  PYTHONUNBUFFERED=1 run_limited "$lim" python3 scripts/gpu_baseline.py --layers "$LAYERS" --seq "${SEQS[0]}" \
    --json "$MT_GPU_JSONL"
}

# Tests that read the device-wide free memory (cudaMemGetInfo): run alone after the others, whose
# allocations would move the driver's count under them (seen on the H100, 2026-11-27).
SOLO_TESTS=(cuda::ledger_matches_driver)

step_tests() {
  local lim=$1 filter t rc2
  grep -vxF "${SOLO_TESTS[@]/#/-e}" "$TESTS_LIST" >"$WORK/parallel.txt"
  filter=$(bash tests/criterion_filter.sh "$WORK/parallel.txt")  # groups: Criterion's extglob takes ≤ 100 alternatives
  run_limited "$lim" "$(prog moetrain_tests)" --jobs "$(nproc)" --filter "$filter" --tap="$WORK/tests.tap"
  local rc=$?
  [ "$rc" -ge 124 ] && return "$rc"
  # Criterion lists the tests its filter left out as skipped: the solo tests' lines come from their own run.
  grep -v -F "${SOLO_TESTS[@]/#/-e- }" "$WORK/tests.tap" >"$WORK/tests.par"
  for t in "${SOLO_TESTS[@]}"; do
    grep -qxF "$t" "$TESTS_LIST" || continue
    run_limited 60 "$(prog moetrain_tests)" --jobs 1 --filter "${t/::/\/}" --tap="$WORK/solo.tap"
    rc2=$?
    [ "$rc2" = 0 ] || rc=$rc2
    grep -F -e "- $t " "$WORK/solo.tap" >>"$WORK/tests.par"
  done
  mv "$WORK/tests.par" "$WORK/tests.tap"
  # Criterion lists the tests its filter left out as skipped: count the listed ones only.
  local want passed skipped failed emu
  want=$(wc -l <"$TESTS_LIST")
  sed -E -n 's/^(not )?ok - ([^ ]+)(.*)$/\2 \1\3/p' "$WORK/tests.tap" 2>/dev/null | sed 's|/|::|' |
    awk 'NR == FNR { want[$0] = 1; next } ($1 in want)' "$TESTS_LIST" - >"$WORK/tests.mine"
  # A test of the emulator's own stand-ins (a planted refusal) skips on a GPU by design, saying so.
  emu=$(grep '# SKIP' "$WORK/tests.mine" | grep -c -i 'emulat')
  skipped=$(( $(grep -c '# SKIP' "$WORK/tests.mine") - emu ))
  failed=$(grep -c ' not ' "$WORK/tests.mine")
  passed=$(( $(wc -l <"$WORK/tests.mine") - skipped - failed - emu ))
  echo "gpu_check: CUDA tests: $want listed, $(wc -l <"$WORK/tests.mine") ran: $passed passed, $skipped skipped," \
    "$failed failed; $emu of the emulator's stand-ins only (skipped by design)"
  grep '# SKIP' "$WORK/tests.mine" | cut -c1-200
  if [ "$REHEARSAL" = 1 ]; then
    # Criterion forks each test: one that could not load a library would crash, not skip.
    grep -q 'error while loading shared libraries' "$WORK/out" && { rehearsed_ok; return; }
    # One grep, no pipe: under pipefail a `grep -q` reader that stops early makes the writer's
    # SIGPIPE (141) the pipeline's status (CI, 2026-11-27).
    [ "$rc" = 0 ] && grep -qi '# SKIP.*no CUDA GPU' "$WORK/tests.mine"
    return
  fi
  # On a GPU every CUDA test must run and pass: a skip there is a failure.
  [ "$rc" = 0 ] && [ "$failed" = 0 ] && [ "$skipped" = 0 ] && [ "$((passed + emu))" = "$want" ]
}

# --- the run ------------------------------------------------------------------------------------
echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(nproc) cores$([ "$REHEARSAL" = 1 ] && echo ', REHEARSAL (no GPU expected)')"
estimate
record "{\"part\":\"plan\",\"estimate_s\":$ESTIMATE_TOTAL,\"deadline_s\":$DEADLINE,\"layers\":$LAYERS}"
NAMES=() VERDICTS=()
for s in "${STEPS[@]}"; do
  IFS='|' read -r name est lim fn <<<"$s"
  left=$((DEADLINE - ($(date +%s) - START) - 10))  # 10 s kept for the summary
  if [[ " ${MT_GPU_CHECK_SKIP:-} " == *" $fn "* ]]; then
    echo; echo "=== $name: SKIP (asked: MT_GPU_CHECK_SKIP)"
    NAMES+=("$name") VERDICTS+=("SKIP (asked)")
    record "{\"part\":\"step\",\"name\":\"$name\",\"verdict\":\"SKIP\",\"why\":\"asked\"}"
    continue
  fi
  if [ "$left" -lt 15 ] || { [ "$fn" != step_bundle ] && [ "${BUNDLE_OK:-0}" != 1 ]; }; then
    verdict=SKIP
    why=$([ "$left" -lt 15 ] && echo "no time left" || echo "no bundle")
    echo; echo "=== $name: SKIP ($why)"
    NAMES+=("$name") VERDICTS+=("SKIP ($why)")
    record "{\"part\":\"step\",\"name\":\"$name\",\"verdict\":\"SKIP\",\"why\":\"$why\"}"
    continue
  fi
  [ "$lim" -gt "$left" ] && lim=$left
  echo; echo "=== $name (estimate ${est} s, limit ${lim} s)"
  t0=$(date +%s)
  "$fn" "$lim"
  rc=$?
  dt=$(( $(date +%s) - t0 ))
  if [ $rc = 0 ]; then verdict=PASS; elif [ $rc = 124 ] || [ $rc = 137 ]; then verdict="FAIL (limit ${lim} s)"; else verdict="FAIL (exit $rc)"; fi
  [ "$fn" = step_bundle ] && { [ $rc = 0 ] || [ $rc = 3 ]; } && BUNDLE_OK=1
  echo "=== $name: $verdict in ${dt} s (estimate ${est} s)"
  NAMES+=("$name") VERDICTS+=("$verdict")
  record "{\"part\":\"step\",\"name\":\"$name\",\"verdict\":\"${verdict%% *}\",\"rc\":$rc,\"seconds\":$dt,\"estimate_s\":$est}"
done

echo
echo "gpu_check: summary ($(( $(date +%s) - START )) s of the ${ESTIMATE_TOTAL} s estimated)"
failed=0
for i in "${!NAMES[@]}"; do
  printf '  %-22s %s\n' "${VERDICTS[$i]}" "${NAMES[$i]}"
  [ "${VERDICTS[$i]}" = PASS ] || [ "${VERDICTS[$i]}" = "SKIP (asked)" ] || failed=1
done
grep -h '^PROJECTION\|^bench_gpu: \|^baseline: ' "$LOG" 2>/dev/null | sed 's/^/  /'
# The goal: case C's tokens/s against transformers + PEFT's on the same model and sequence length.
if command -v python3 >/dev/null; then
  python3 - "$MT_GPU_JSONL" "${SEQS[0]}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
ours = [r for r in rows if r.get("part") == "step" and r.get("case") == "C" and r.get("seq") == int(sys.argv[2]) and "tokens_per_s" in r]
theirs = [r for r in rows if r.get("part") == "baseline_train" and r.get("ok")]
if ours and theirs:
    a, b = ours[0]["tokens_per_s"], theirs[0]["tokens_per_s"]
    with open(sys.argv[1], "a") as f:
        f.write(json.dumps({"part": "ratio", "seq": int(sys.argv[2]), "moetrain_tokens_per_s": a,
                            "transformers_peft_tokens_per_s": b, "ratio": round(a / b, 3), "goal": 5.0}) + "\n")
    print(f"gpu_check: case C at seq {sys.argv[2]}: moetrain {a} tokens/s, transformers + PEFT {b}: {a / b:.2f}x (goal 5x)")
else:
    print("gpu_check: no ratio: moetrain's case C or the baseline's training figure is missing")
PY
fi
write_json
echo "gpu_check: results in $LOG and $JSON"
[ $failed = 0 ] && echo "gpu_check: all passed$([ "$REHEARSAL" = 1 ] && echo ' (rehearsal)')"
exit $failed
