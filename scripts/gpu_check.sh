#!/usr/bin/env bash
# scripts/gpu_check.sh — on a GPU machine, from the repository root, in one call: show the GPU and
# toolkit, build with CUDA=1, run the CUDA build's test suite, the standalone matmul and op parity
# program (scripts/cuda_parity.c), the benchmarks, three training steps of the CLI on cpu and on
# cuda compared, and the Mixtral-8x7B step benchmark (make bench-gpu); ends with a table of the
# checks and bench-gpu's result lines. Exits non-zero if anything failed.
#
#   bash scripts/gpu_check.sh               # on the GPU machine
#   bash scripts/gpu_check.sh --fetch-debs  # on a machine with apt: put the Debian packages the
#                                           # GPU machine lacks into .gpudeps/ to carry there
#
# A GPU machine may lack Criterion, OpenBLAS, cJSON and libyaml and have no package registry.
# If .gpudeps/*.deb is there (MT_GPU_DEBS names another folder) they are unpacked into
# /tmp/mt-sysroot and used through CPATH, LIBRARY_PATH and LD_LIBRARY_PATH (never into /).
# Without them the script says what is missing and runs what it can: without Criterion the
# full build and the parity program but no suite; without OpenBLAS/cJSON/libyaml only the
# parity program, built from the few core files it needs.
# Environment: BUILD (default build-cuda), JOBS (default: all cores), CUDA_HOME, BENCH_GPU_ARGS
# (flags for moetrain_bench_gpu, e.g. "--case C --seq 2048 --steps 2");
# MT_GPU_CHECK_MINIMAL=1 takes the parity-program-only path even where the packages are there.
set -uo pipefail

DEBS_DIR=${MT_GPU_DEBS:-.gpudeps}
# What the build needs beyond the CUDA toolkit, with the shared libraries those pull in (the
# C library, zlib and the like are left to the machine: mixing those would do harm).
DEB_PKGS=(libcriterion-dev libcriterion3 libnanomsg5 libgit2-1.5 libhttp-parser2.9 libmbedtls14
          libmbedx509-1 libmbedcrypto7 libssh2-1 libgssapi-krb5-2 libkrb5-3 libk5crypto3
          libkrb5support0 libffi8 libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread
          libgfortran5 libcjson-dev libcjson1 libyaml-dev libyaml-0-2)

if [ "${1:-}" = "--fetch-debs" ]; then
  mkdir -p "$DEBS_DIR"
  (cd "$DEBS_DIR" && apt-get download "${DEB_PKGS[@]}") || { echo "gpu_check: apt-get download failed (run 'apt-get update' first?)" >&2; exit 1; }
  echo "gpu_check: $(ls "$DEBS_DIR"/*.deb | wc -l) packages in $DEBS_DIR ($(du -sh "$DEBS_DIR" | cut -f1))."
  echo "gpu_check: ignore it (echo '/$DEBS_DIR/' >> .git/info/exclude) and carry '$DEBS_DIR' to the GPU machine."
  exit 0
fi

[ -f Makefile ] && [ -f core/backend.h ] || { echo "gpu_check: run me from the repository root" >&2; exit 1; }
BUILD=${BUILD:-build-cuda}
JOBS=${JOBS:-$(nproc)}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$CUDA_HOME/bin/nvcc" ] && command -v nvcc >/dev/null; then  # a toolkit elsewhere
  CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
fi
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"
FAILED=()
STEPS=() STEP_OK=()  # every step's title, and 0 once a failure happened under it: the final table
step() { echo; echo "=== $*"; STEPS+=("$*"); STEP_OK+=(1); }
fail() {
  echo "gpu_check: FAILED: $*"; FAILED+=("$*")
  [ ${#STEP_OK[@]} -gt 0 ] && STEP_OK[${#STEP_OK[@]}-1]=0
}

step "machine"
if command -v nvidia-smi >/dev/null; then nvidia-smi || fail "nvidia-smi"; else fail "nvidia-smi not found (no NVIDIA driver?)"; fi
if command -v nvcc >/dev/null; then nvcc --version | tail -n 2; else fail "nvcc not found under $CUDA_HOME/bin or on PATH"; fi
${CC:-cc} --version | head -n 1

# --- carried packages, and CUDA libraries that live outside the toolkit (pip wheels) ---------
SYSROOT=/tmp/mt-sysroot
if compgen -G "$DEBS_DIR/*.deb" >/dev/null; then
  step "unpacking carried packages from $DEBS_DIR into $SYSROOT"
  mkdir -p "$SYSROOT"
  for f in "$DEBS_DIR"/*.deb; do dpkg-deb -x "$f" "$SYSROOT" || fail "unpack $f"; done
  A=x86_64-linux-gnu
  export CPATH="$SYSROOT/usr/include:$SYSROOT/usr/include/$A:$SYSROOT/usr/include/$A/openblas-pthread${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$SYSROOT/usr/lib/$A:$SYSROOT/usr/lib/$A/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# The Makefile links -lcublasLt -lnccl from $CUDA_HOME; where the toolkit lacks one, use a copy
# from elsewhere on the machine (PyTorch's nvidia-* wheels carry both) through a link folder.
LINKDIR=/tmp/mt-cudalibs
for lib in cublasLt nccl; do
  if ! compgen -G "$CUDA_HOME/lib*/lib$lib.so" >/dev/null && ! ldconfig -p 2>/dev/null | grep -q "lib$lib.so "; then
    found=$(find /usr /opt -name "lib$lib.so*" -type f 2>/dev/null | head -n 1)
    if [ -n "$found" ]; then
      mkdir -p "$LINKDIR" && ln -sf "$found" "$LINKDIR/lib$lib.so"
      ln -sf "$found" "$LINKDIR/$(basename "$found")"
      echo "gpu_check: lib$lib.so is not in $CUDA_HOME; using $found"
      export LIBRARY_PATH="$LINKDIR${LIBRARY_PATH:+:$LIBRARY_PATH}"
      LD_LIBRARY_PATH="$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; export LD_LIBRARY_PATH
    else
      echo "gpu_check: lib$lib.so not found anywhere: linking will fail"
    fi
  fi
done

# --- what this machine can build --------------------------------------------------------------
step "dependencies"
have_header() {  # $1: a header path under an include directory
  local d
  for d in /usr/include /usr/include/x86_64-linux-gnu /usr/include/x86_64-linux-gnu/openblas-pthread \
           /usr/local/include ${CPATH:+${CPATH//:/ }}; do
    [ -e "$d/$1" ] && return 0
  done
  return 1
}
BASE_OK=1; CRITERION_OK=1
for h in cblas.h cjson/cJSON.h yaml.h; do
  if have_header "$h"; then echo "found    $h"; else echo "MISSING  $h"; BASE_OK=0; fi
done
if have_header criterion/criterion.h; then echo "found    criterion/criterion.h"; else echo "MISSING  criterion/criterion.h"; CRITERION_OK=0; fi
if [ $CRITERION_OK = 0 ]; then
  echo "gpu_check: Criterion is not installed here, so the test suite cannot be built; running the"
  echo "gpu_check: standalone parity program instead. To run the suite, carry the packages:"
  echo "gpu_check:   bash scripts/gpu_check.sh --fetch-debs   (on the development machine)"
fi
if [ "${MT_GPU_CHECK_MINIMAL:-0}" = 1 ]; then
  echo "gpu_check: MT_GPU_CHECK_MINIMAL=1: building only the CUDA backend and the parity program."
  BASE_OK=0
elif [ $BASE_OK = 0 ]; then
  echo "gpu_check: OpenBLAS, cJSON or libyaml is missing: the moetrain binary cannot be built here;"
  echo "gpu_check: building only the CUDA backend and the parity program (carry .gpudeps for the rest)."
fi

PARITY=""
if [ $BASE_OK = 1 ]; then
  # scripts/deps.sh would try apt-get, which cannot reach anything here; the probes above did its job.
  mkdir -p "$BUILD" && touch "$BUILD/.deps-ok"
  step "make CUDA=1 BUILD=$BUILD -j$JOBS"
  if make CUDA=1 BUILD="$BUILD" -j"$JOBS"; then
    step "parity program (linked against $BUILD's objects)"
    # One extra rule beside the Makefile's own, so that flags, objects and libraries are the same.
    if printf '$(BUILD)/cuda_parity: $(BUILD)/scripts/cuda_parity.o $(LIB_OBJ)\n\t$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)\n' |
        make CUDA=1 BUILD="$BUILD" -j"$JOBS" -f Makefile -f - "$BUILD/cuda_parity"; then
      PARITY="$BUILD/cuda_parity"
    else
      fail "build of the parity program"
    fi
    if [ $CRITERION_OK = 1 ]; then
      step "test suite: $BUILD/moetrain_tests"
      if make CUDA=1 BUILD="$BUILD" -j"$JOBS" "$BUILD/moetrain_tests"; then
        # The CUDA tests first and verbose, so that each shows; on a GPU none may be skipped.
        out=$("$BUILD/moetrain_tests" --filter 'cuda/*' --verbose 2>&1); rc=$?
        echo "$out"
        [ $rc = 0 ] || fail "CUDA tests (exit $rc)"
        if grep -q '^\[SKIP\] cuda::' <<<"$out"; then fail "CUDA tests were skipped on a GPU machine"; fi
        "$BUILD/moetrain_tests" --jobs "$JOBS" || fail "test suite"
      else
        fail "build of the test suite"
      fi
    fi
  else
    fail "make CUDA=1"
  fi
fi

if [ -z "$PARITY" ] && [ $BASE_OK = 0 ]; then
  step "parity program (from the core files it needs)"
  OBJ=/tmp/mt-parity; rm -rf "$OBJ"; mkdir -p "$OBJ"
  CFLAGS_MIN="-std=c11 -O2 -g -Wall -Wextra -D_GNU_SOURCE -DMT_CUDA -I. -I$CUDA_HOME/include"
  # backend.c names the cpu backend, which needs OpenBLAS; the parity program does not use it.
  printf '#include "core/backend.h"\n#include "core/common.h"\nmt_backend *mt_backend_cpu_new(void) {\n    mt_error_set("cpu backend not built (no OpenBLAS)");\n    return NULL;\n}\n' >"$OBJ/cpu_stub.c"
  ok=1
  # The op kernels and the CPU twins that need no library; the LoRA and AdamW cases (OpenBLAS,
  # cJSON) report themselves skipped (CUDA_OPS_NO_HOST_LIBS).
  for src in core/backend_cuda.cu model/ops_cuda.cu model/parts_cuda.cu moe/moe_cuda.cu; do
    nvcc -O2 -g -std=c++17 -I. -DMT_CUDA -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
         -Xcompiler -Wall,-Wextra -c "$src" -o "$OBJ/$(basename "${src%.cu}")_cu.o" || ok=0
  done
  for src in core/common.c core/dtype.c core/ledger.c core/backend.c core/backend_null.c \
             model/embedding.c model/rmsnorm.c model/rope.c model/attention.c model/cross_entropy.c model/bias.c \
             moe/router.c moe/aux_loss.c moe/permute.c moe/swiglu.c scripts/cuda_parity.c "$OBJ/cpu_stub.c"; do
    ${CC:-cc} $CFLAGS_MIN -fopenmp -DCUDA_OPS_NO_HOST_LIBS -c "$src" -o "$OBJ/$(basename "${src%.c}").o" || ok=0
  done
  if [ $ok = 1 ] && ${CC:-cc} -fopenmp "$OBJ"/*.o -o "$OBJ/cuda_parity" -lm -L"$CUDA_HOME/lib64" \
       -Wl,-rpath,"$CUDA_HOME/lib64" -lcublasLt -lcudart -lstdc++; then
    PARITY="$OBJ/cuda_parity"
  else
    fail "build of the parity program"
  fi
fi

if [ -n "$PARITY" ]; then
  step "matmul and op parity: $PARITY --bench"
  "$PARITY" --bench || fail "matmul/op parity (exit $?)"
fi

if [ $BASE_OK = 1 ] && grep -q '^bench:' Makefile && { [ -f scripts/bench.sh ] || [ -f scripts/bench.c ]; }; then
  step "make CUDA=1 bench"
  make CUDA=1 BUILD="$BUILD" -j"$JOBS" bench || fail "make CUDA=1 bench"
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if [ $BASE_OK = 1 ] && [ -x "$BUILD/moetrain" ]; then
  # The whole step through the CLI: the same 3 steps on cpu and cuda, losses and adapters compared.
  # --device cuda starts a 1-rank NCCL communicator, so this is also the 1-rank NCCL check.
  step "train 3 steps on cpu and on cuda, compared (and a 1-rank NCCL run completes)"
  if make CUDA=1 BUILD="$BUILD" -j"$JOBS" "$BUILD/tests/mpi/compare_runs" >/dev/null &&
     "$BUILD/moetrain" init --config configs/tiny.json --out "$TMP/tiny" --seed 3 >/dev/null; then
    for i in $(seq 0 63); do
      printf '{"messages":[{"role":"user","content":"w%03d"},{"role":"assistant","content":"%03d"}]}\n' \
        "$i" $(( (i * 7) % 1000 ))
    done >"$TMP/data.jsonl"
    args=(--model "$TMP/tiny" --data "$TMP/data.jsonl" --mode lora --r 4 --quant nf4 --seq 64 --batch 4
          --dropout 0 --lr 1e-3 --steps 3)
    for dev in cpu cuda; do
      "$BUILD/moetrain" train "${args[@]}" --device $dev --out "$TMP/run-$dev" || fail "train --device $dev (exit $?)"
    done
    # Loss to 1e-2 and tensors to 5% relative L2: fp32 on both, but different summation orders
    # and cuBLASLt's kernels over 3 steps of Adam (whose first steps amplify tiny differences).
    "$BUILD/tests/mpi/compare_runs" "$TMP/run-cpu" "$TMP/run-cuda" 1e-2 0.05 || fail "cpu and cuda runs differ"
  else
    fail "build of compare_runs or moetrain init"
  fi

  step "make CUDA=1 bench-gpu (roofline projection, then the Mixtral-8x7B step measured: cases C, A, B)"
  make CUDA=1 BUILD="$BUILD" -j"$JOBS" bench-gpu 2>&1 | tee "$TMP/bench_gpu.log" || fail "make CUDA=1 bench-gpu"
fi

echo
echo "gpu_check: summary"
for i in "${!STEPS[@]}"; do
  printf '  %-4s  %s\n' "$([ "${STEP_OK[$i]}" = 1 ] && echo PASS || echo FAIL)" "${STEPS[$i]}"
done
# The projection's totals beside the measured lines: the gap between them is the next work.
grep -h '^PROJECTION seq\|^bench_gpu: ' "$TMP/bench_gpu.log" 2>/dev/null | sed 's/^/  /'
if [ ${#FAILED[@]} -eq 0 ]; then
  echo "gpu_check: all passed"
  exit 0
fi
echo "gpu_check: ${#FAILED[@]} failed:"
printf '  - %s\n' "${FAILED[@]}"
exit 1
