#!/usr/bin/env bash
# Writes the build's config.mk (to stdout) from what is installed: run by the Makefile after
# scripts/deps.sh, so no flag is probed before the packages it names exist. What it found goes to
# stderr, once per build folder.
set -euo pipefail
multiarch=$(gcc -print-multiarch)

# OpenBLAS's OpenMP build, named by path so that Debian's alternatives (which may point libblas or
# libopenblas at the pthread build or at reference BLAS) cannot swap in a second thread pool.
blas_inc=/usr/include/$multiarch/openblas-openmp
blas_lib=/usr/lib/$multiarch/openblas-openmp
if [ ! -f "$blas_inc/cblas.h" ] || [ ! -e "$blas_lib/libopenblas.so" ]; then
  echo "configure: OpenBLAS (OpenMP build) not found in $blas_lib: apt-get install libopenblas-openmp-dev" >&2
  exit 1
fi
echo "BLAS_CFLAGS := -I$blas_inc"
echo "BLAS_LIBS := -L$blas_lib -Wl,-rpath,$blas_lib -lopenblas"
echo "configure: BLAS: OpenBLAS (OpenMP) from $blas_lib" >&2

pkgs="libcjson yaml-0.1 criterion libpcre2-8 libutf8proc"
if ! flags=$(pkg-config --cflags $pkgs); then
  echo "configure: pkg-config cannot find one of: $pkgs (scripts/deps.sh installs them)" >&2
  exit 1
fi
echo "PKG_CFLAGS := $flags"

# MPI (Open MPI): without mpicc, comm is single-process only and `make test-mpi` refuses.
if mpi_link=$(mpicc --showme:link 2>/dev/null) && [ -n "$mpi_link" ]; then
  echo "MPI_CFLAGS := $(mpicc --showme:compile)"
  echo "MPI_LIBS := $mpi_link"
  echo "configure: MPI: $(command -v mpicc)" >&2
else
  echo "MPI_CFLAGS :="
  echo "MPI_LIBS :="
  echo "configure: mpicc not found: building without MPI (single-process comm only)" >&2
fi
