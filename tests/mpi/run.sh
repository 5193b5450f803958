#!/usr/bin/env bash
# tests/mpi/run.sh BUILD — the multi-rank checks of core/comm (`make test-mpi`).
# Runs tests/mpi's programs under `mpirun -np 2` and `-np 4 --oversubscribe`, each under
# `timeout 30`, and checks the exit code, the wall time and the message of every case.
# Prints one line per case and "test-mpi: N passed, M failed"; exits 1 when any failed.
set -uo pipefail
build=${1:-build}
bin=$build/tests/mpi
mpirun=(mpirun --oversubscribe)
if [ "$(id -u)" = 0 ]; then mpirun+=(--allow-run-as-root); fi
passed=0
failed=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# check NAME NP WANT MAX_S PATTERN [VAR=VALUE ...] -- PROGRAM [ARGS]
#   WANT: ok (exit 0), fail (non-zero, not the timeout's 124), or an exact exit code.
#   The run must end within MAX_S seconds and its output match PATTERN (grep -E; "" for any).
check() {
  local name=$1 np=$2 want=$3 max=$4 pattern=$5
  shift 5
  local env=()
  while [ "$1" != "--" ]; do env+=("$1"); shift; done
  shift
  local t0 t1 rc ms why=""
  t0=$(date +%s%N)
  env "${env[@]}" timeout 30 "${mpirun[@]}" -np "$np" "$@" >"$out" 2>&1
  rc=$?
  t1=$(date +%s%N)
  ms=$(( (t1 - t0) / 1000000 ))
  case $want in
    ok) [ "$rc" = 0 ] || why="exit code $rc, expected 0" ;;
    fail) { [ "$rc" != 0 ] && [ "$rc" != 124 ]; } || why="exit code $rc, expected a failure" ;;
    *) [ "$rc" = "$want" ] || why="exit code $rc, expected $want" ;;
  esac
  [ "$rc" = 124 ] && why="hung: killed by timeout 30"
  [ -z "$why" ] && [ "$ms" -gt $((max * 1000)) ] && why="took ${ms} ms, limit ${max} s"
  [ -z "$why" ] && [ -n "$pattern" ] && ! grep -Eq "$pattern" "$out" &&
    why="no line matches /$pattern/"
  if [ -z "$why" ]; then
    passed=$((passed + 1))
    printf 'ok    %-38s np=%d  rc=%-3d %5d ms\n' "$name" "$np" "$rc" "$ms"
  else
    failed=$((failed + 1))
    printf 'FAIL  %-38s np=%d  rc=%-3d %5d ms: %s\n' "$name" "$np" "$rc" "$ms" "$why"
    sed 's/^/      | /' "$out" | tail -30
  fi
}

for np in 2 4; do
  check "collectives" "$np" ok 20 "mpi_ops np=$np: [0-9]+ passed, 0 failed" \
    MT_COMM_TIMEOUT=20 -- "$bin/mpi_ops" "$np"
done
check "collectives with MT_COMM_CHECK=1" 4 ok 20 "passed, 0 failed" \
  MT_COMM_TIMEOUT=20 MT_COMM_CHECK=1 -- "$bin/mpi_ops" 4

for np in 2 4; do
  last=$((np - 1))
  check "rank 1 exits before mt_comm_init" "$np" 4 10 "non-zero (exit code|status)" \
    -- "$bin/mpi_fail" early
  check "rank 1 calls exit(3)" "$np" fail 10 "world rank 1 is exiting \(status 3\)" \
    -- "$bin/mpi_fail" exit
  check "rank 1 killed by SIGKILL" "$np" fail 10 "process rank 1 .*signal 9" \
    -- "$bin/mpi_fail" kill
  check "rank 1 stalls: deadline 2 s" "$np" fail 15 \
    "collective all_reduce #2 .* did not complete within 2\.0 s" \
    MT_COMM_TIMEOUT=2 -- "$bin/mpi_fail" stall
  check "check_same refuses rank $last" "$np" fail 10 \
    "config differs .* but rank $last \(0000000000000bad\) differs" \
    -- "$bin/mpi_fail" mismatch
done
check "MT_COMM_CHECK: different collectives" 2 fail 10 \
  "ranks disagree on collective #2: rank 0: all_reduce of 10 f32 sum; rank 1: broadcast" \
  MT_COMM_TIMEOUT=10 MT_COMM_CHECK=1 -- "$bin/mpi_fail" check
check "MT_COMM_CHECK: all_to_all_v counts" 4 fail 10 \
  "rank 0 sends 2 rows here but this rank expects 3" \
  MT_COMM_TIMEOUT=10 MT_COMM_CHECK=1 -- "$bin/mpi_fail" counts
check "mt_comm_abort(code 7) on rank 0" 4 7 10 "rank 0/4 .*rank-local failure" \
  MT_COMM_TIMEOUT=10 -- "$bin/mpi_fail" abort

echo "test-mpi: $passed passed, $failed failed"
[ "$failed" = 0 ]
