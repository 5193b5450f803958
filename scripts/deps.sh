#!/usr/bin/env bash
# Checks that the Debian packages moetrain builds against are present. As root it installs what
# is missing with apt-get; otherwise it prints the exact command to run and fails.
set -euo pipefail
# package -> a file (or glob) that proves it is installed; clang and its runtime are for `make fuzz`
declare -A probe=(
  [libcriterion-dev]=/usr/include/criterion/criterion.h
  [libopenblas-dev]=/usr/include/x86_64-linux-gnu/cblas.h
  [libopenmpi-dev]=/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h
  [openmpi-bin]=/usr/bin/mpirun
  [libcjson-dev]=/usr/include/cjson/cJSON.h
  [libyaml-dev]=/usr/include/yaml.h
  [libsentencepiece-dev]=/usr/include/sentencepiece_processor.h
  [pkg-config]=/usr/bin/pkg-config
  [clang]=/usr/bin/clang
  [libclang-rt-14-dev]='/usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a'
)
missing=()
for pkg in "${!probe[@]}"; do
  compgen -G "${probe[$pkg]}" >/dev/null || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
IFS=$'\n' missing=($(sort <<<"${missing[*]}")); unset IFS
cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" = 0 ]; then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  $cmd >/dev/null
else
  echo "deps: missing packages: ${missing[*]}" >&2
  echo "deps: run as root:  apt-get update && $cmd" >&2
  exit 1
fi
