#!/usr/bin/env bash
# scripts/gpu_bundle.sh — `make gpu-bundle`: everything scripts/gpu_check.sh runs on a GPU
# machine, built here, for a machine that has the CUDA toolkit and PyTorch's NVIDIA wheels but no
# Debian -dev packages, no compilers' libraries of ours and no package registry.
#
#   bash scripts/gpu_bundle.sh          -> .gpubundle/mt-gpu.tar.gz + .gpubundle/manifest.txt
#
# Carry `.gpubundle` with the tree (the device tool's `carry`); gpu_check.sh unpacks it into
# /tmp/mt-gpu and runs from there. What is in it:
#   bin/  moetrain, its test suite (CUDA tests run there; tests find the repository as "." and the
#         program as /tmp/mt-gpu/bin/moetrain), the step benchmark, the probe, the parity program,
#         the roofline, compare_runs: sm_90a machine code only (Hopper; no PTX to JIT), no MPI
#         (one GPU; NCCL bootstraps a 1-rank world without it), debug info stripped.
#   lib/  every shared library they load except the C library's own, libstdc++/libgcc_s, and the
#         CUDA libraries the machine has (cuBLASLt, NCCL, the driver): gpu_check.sh finds those
#         there, in the toolkit or in the Python wheels. libcudart goes along (the same 13.0 as
#         the build; 1 MB).
#   manifest.txt  the commit, a hash of the sources (gpu_check.sh refuses a bundle of other
#         sources), each file's sha256, and what the machine must provide.
#   whl/  PEFT's wheel (pure Python), for the PyTorch baseline (scripts/gpu_baseline.py): the GPU
#         machine's own PEFT may be too old for target_parameters; pip installs it there offline.
# Environment: MT_GPU_BUNDLE_DIR (default .gpubundle), JOBS (default nproc),
#   MT_GPU_BUNDLE_OMIT=libfoo.so.1 leaves that library out (the rehearsal's planted failure).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${MT_GPU_BUNDLE_DIR:-.gpubundle}
jobs=${JOBS:-$(nproc)}
build=build-gpu
prefix=/tmp/mt-gpu  # where gpu_check.sh unpacks it: the test suite's compiled-in program path
t0=$(date +%s)

# Libraries the machine provides (or must): the C library's family, the C++ runtime, CUDA's own.
system_lib() {
  case "$1" in
    linux-vdso.so.*|ld-linux-x86-64.so.*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*) return 0;;
    libresolv.so.*|libutil.so.*|libstdc++.so.*|libgcc_s.so.*) return 0;;
    libcuda.so.*|libcublasLt.so.*|libcublas.so.*|libnccl.so.*|libcudnn*.so.*) return 0;;
  esac
  return 1
}
# What the machine must provide from CUDA (gpu_check.sh looks for each).
needs="libcublasLt.so.13 libcublas.so.13 libnccl.so.2"
# What the machine may provide: cuDNN (attention's SDPA, dlopened; ~1 GB with its engines, never
# bundled). Without it attention runs on the WMMA kernel, and the probe says so.
optional="libcudnn.so.9"

programs=(moetrain moetrain_tests moetrain_bench_gpu moetrain_gpu_probe cuda_parity moetrain_roofline
          tests/mpi/compare_runs)
log=$build/bundle-build.log
mkdir -p "$build"
echo "gpu_bundle: building ${programs[*]} in $build (sm_90a, no MPI)"
make -j"$jobs" CUDA=1 BUILD="$build" NVCC_ARCH='-gencode=arch=compute_90a,code=sm_90a' MPI_LIBS= MPI_CFLAGS= \
  TEST_BIN_PATH="$prefix/bin/moetrain" TEST_REPO_ROOT=. "${programs[@]/#/$build/}" >"$log" 2>&1 ||
  { tail -30 "$log"; echo "gpu_bundle: build failed (whole log: $log)" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for p in "${programs[@]}"; do
  objcopy --strip-debug "$build/$p" "$stage/bin/$(basename "$p")"
done
# Every library the programs load, as this machine resolves it (ldd follows the whole tree).
declare -A libs=()
for p in "${programs[@]}"; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then echo "gpu_bundle: $p: $name not found here" >&2; exit 1; fi
    system_lib "$name" || libs[$name]=$path
  done < <(ldd "$build/$p")
done
for name in "${!libs[@]}"; do
  if [ "$name" = "${MT_GPU_BUNDLE_OMIT:-}" ]; then echo "gpu_bundle: leaving $name out (MT_GPU_BUNDLE_OMIT)"; continue; fi
  cp -L "${libs[$name]}" "$stage/lib/$name"
done

# The CUDA tests the check runs there (as a Criterion filter), listed where perl and the sources are.
bash tests/cuda_tests.sh "$build/moetrain_tests" | sort -u >"$stage/bin/cuda_tests.txt"
[ -s "$stage/bin/cuda_tests.txt" ] || { echo "gpu_bundle: no CUDA tests listed" >&2; exit 1; }

# The sources the programs were built from: gpu_check.sh hashes the same files of its tree.
src_hash=$(bash scripts/gpu_source_hash.sh)
mkdir -p "$out"
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "sources $src_hash"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) with $(nvcc --version | tail -n 1), sm_90a"
  echo "needs $needs"
  echo "optional $optional"
  (cd "$stage" && find bin lib -type f | sort | xargs sha256sum | sed 's/^/file /')
} >"$out/manifest.txt.tmp"
# PEFT for the baseline: the version it was checked with (a failed download only warns: the
# baseline then uses the machine's PEFT, and says which).
peft=peft==0.21.2
rm -rf "$out/whl"
if ! python3 -m pip download -q --no-deps --only-binary=:all: -d "$out/whl" "$peft" >/dev/null 2>&1; then
  echo "gpu_bundle: WARNING: could not download $peft: the baseline will use the GPU machine's PEFT" >&2
fi
tar -C "$stage" -czf "$out/mt-gpu.tar.gz.tmp" bin lib
mv "$out/mt-gpu.tar.gz.tmp" "$out/mt-gpu.tar.gz"
mv "$out/manifest.txt.tmp" "$out/manifest.txt"
echo "gpu_bundle: $out/mt-gpu.tar.gz: ${#programs[@]} programs, $(ls "$stage/lib" | wc -l) libraries" \
     "($(du -sh "$stage" | cut -f1) unpacked, $(du -h "$out/mt-gpu.tar.gz" | cut -f1) packed) in $(( $(date +%s) - t0 )) s"
echo "gpu_bundle: carry it to the GPU machine with the tree: carry [\"$out\"]; there: bash scripts/gpu_check.sh"
