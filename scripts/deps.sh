#!/usr/bin/env bash
# Checks that the Debian packages moetrain builds against are installed. As root it installs what
# is missing with apt-get; otherwise it prints the exact command to run and fails.
#
# It asks dpkg, never the file system: a header such as cblas.h can come from another package
# (reference BLAS provides it through Debian's alternatives), which once made a fresh machine look
# as if OpenBLAS were there.
set -euo pipefail
packages=(
  build-essential pkg-config
  libopenblas-openmp-dev   # OpenBLAS built on libgomp: BLAS and our OpenMP loops share one pool
  libcjson-dev libyaml-dev
  libsentencepiece-dev
  libpcre2-dev libutf8proc-dev   # tokenizer.json: pre-tokenizer regexes, NFC (data/bpe.c)
  libcriterion-dev         # make test
  libopenmpi-dev openmpi-bin   # comm over MPI, the NCCL bootstrap, make test-mpi
  clang libclang-rt-14-dev     # make fuzz (libFuzzer)
)
installed() {
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}
missing=()
for pkg in "${packages[@]}"; do installed "$pkg" || missing+=("$pkg"); done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
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
