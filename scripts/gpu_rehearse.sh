#!/usr/bin/env bash
# scripts/gpu_rehearse.sh — `scripts/gpu_check.sh --rehearse`: the GPU check run here, as the GPU
# machine would run it, up to the first call that needs a GPU. The GPU machine is lent for 15
# minutes now and then; a check that fails there for a missing library wastes the loan.
#
#   bash scripts/gpu_check.sh --rehearse                    # must pass
#   bash scripts/gpu_check.sh --rehearse --plant libcjson.so.1
#       # a bundle without that library: the rehearsal must fail and name it (exit 0 when it does)
#
# The root: Debian 12 minbase and nothing else (no compilers, no -dev packages, no Python), no
# network (a new network namespace), the CUDA toolkit bound in read-only as the GPU machine has it
# but with NCCL hidden in it and put where PyTorch's nvidia-nccl wheel puts it (the GPU machine
# may have NCCL only there). The tree travels as the device tool sends it (tracked and untracked
# files that git does not ignore, plus .gpubundle). Inside, gpu_check.sh runs with
# MT_GPU_CHECK_REHEARSAL=1: every program must start, load its libraries and report that there is
# no GPU; the CPU parts (init, a CPU training run, plan --measure) run for real. Needs root.
# The base root is cached as a tarball (rebuilt weekly), as scripts/fresh_check.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
plant=""
case "${1:-}" in
  --plant) plant=${2:?--plant needs a library name, e.g. libcjson.so.1};;
  "") ;;
  *) echo "usage: $0 [--plant LIBRARY]" >&2; exit 2;;
esac
[ "$(id -u)" = 0 ] || { echo "gpu_rehearse: needs root (mmdebstrap, unshare, chroot, mounts)" >&2; exit 1; }
start=$(date +%s)

work=$(mktemp -d /tmp/moetrain-rehearse.XXXXXX)
trap 'rm -rf "$work"' EXIT

# --- the bundle: this tree's, rebuilt when stale; a planted one without a library -------------
bundle=.gpubundle
if [ -n "$plant" ]; then
  bundle="$work/bundle"
  MT_GPU_BUNDLE_DIR="$bundle" MT_GPU_BUNDLE_OMIT="$plant" bash scripts/gpu_bundle.sh | tail -n 2
elif [ ! -f .gpubundle/manifest.txt ] ||
     [ "$(awk '$1 == "sources" {print $2}' .gpubundle/manifest.txt)" != "$(bash scripts/gpu_source_hash.sh)" ]; then
  bash scripts/gpu_bundle.sh | tail -n 2
fi

# The estimate the check prints must fit the device time: ≤ 6 minutes.
est=$(bash scripts/gpu_check.sh --estimate | awk '/s in all by the estimate/ {print $1}')
[ -n "$est" ] && [ "$est" -le 360 ] || { echo "gpu_rehearse: the check's estimate is ${est:-missing} s, over 6 minutes" >&2; exit 1; }
echo "gpu_rehearse: the check's estimate: $est s"
# The clean root has no Python: the PyTorch baseline is at least compiled here.
if [ -f scripts/gpu_baseline.py ]; then python3 -m py_compile scripts/gpu_baseline.py; fi

# --- the root ------------------------------------------------------------------------------------
cache=${MT_FRESH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/moetrain-fresh}
mkdir -p "$cache"
base="$cache/bookworm-minbase.tar"
if [ -z "$(find "$base" -mtime -7 2>/dev/null)" ]; then
  command -v mmdebstrap >/dev/null || {
    echo "gpu_rehearse: installing mmdebstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends mmdebstrap >/dev/null
  }
  echo "gpu_rehearse: building the base root (Debian 12 minbase)"
  mmdebstrap --quiet --format=tar --variant=minbase bookworm "$base.tmp"
  mv "$base.tmp" "$base"
fi
root="$work/root"
mkdir -p "$root"
tar -xf "$base" -C "$root"
if dpkg --root="$root" -l 2>/dev/null | awk '$1 == "ii" && $2 ~ /-dev(:|$)/ {found = 1} END {exit !found}'; then
  echo "gpu_rehearse: the clean root has -dev packages" >&2; exit 1
fi

# The tree as the device tool sends it, with the bundle.
mkdir -p "$root/src/main"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$root/src/main"
mkdir -p "$root/src/main/.gpubundle"
cp -r "$bundle"/. "$root/src/main/.gpubundle/"

cuda=$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")
nccl=$(find "$cuda/" -name 'libnccl.so.2' | sed -n 1p)
[ -n "$nccl" ] || { echo "gpu_rehearse: no libnccl.so.2 in $cuda to play PyTorch's wheel" >&2; exit 1; }
wheel_dir=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib

echo "gpu_rehearse: running the check in a clean Debian 12 root, no network$([ -n "$plant" ] && echo ", bundle without $plant")"
set +e
unshare --net --mount --propagation private bash -euo pipefail -c '
  root=$1; cuda=$2; nccl=$3; wheel_dir=$4
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  mkdir -p "$root/usr/local/cuda" "$root$wheel_dir"
  mount --bind -o ro "$cuda" "$root/usr/local/cuda"
  # NCCL out of the toolkit (its lib folder rebuilt on a tmpfs without it), into the wheel folder.
  lib=$(cd "$cuda" && readlink -f lib64)
  mount -t tmpfs tmpfs "$root/usr/local/cuda/${lib#$cuda/}"
  for f in "$lib"/*; do
    n=$(basename "$f"); t="$root/usr/local/cuda/${lib#$cuda/}/$n"
    case "$n" in libnccl*) continue;; esac
    if [ -L "$f" ]; then cp -P "$f" "$t"
    elif [ -d "$f" ]; then mkdir "$t" && mount --bind -o ro "$f" "$t"
    else touch "$t" && mount --bind -o ro "$f" "$t"; fi
  done
  touch "$root$wheel_dir/libnccl.so.2"
  mount --bind "$nccl" "$root$wheel_dir/libnccl.so.2"
  ip link set lo up 2>/dev/null || true
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    OUT=/tmp/out MT_GPU_CHECK_REHEARSAL=1 bash -c "cd /src/main && bash scripts/gpu_check.sh"
' _ "$root" "$cuda" "$nccl" "$wheel_dir" >"$work/log" 2>&1
rc=$?
set -e
# The whole log with MT_REHEARSE_VERBOSE=1; else the steps and verdicts.
if [ "${MT_REHEARSE_VERBOSE:-0}" = 1 ]; then sed 's/^/  | /' "$work/log"
else sed 's/^/  | /' "$work/log" | grep -E '^  \| (===|gpu_check|  (PASS|FAIL|SKIP))' || true; fi

if [ -n "$plant" ]; then
  if [ $rc != 0 ] && grep -q "MISSING LIBRARY.*$plant" "$work/log"; then
    echo "gpu_rehearse: the planted failure was caught: $(grep -m1 "MISSING LIBRARY.*$plant" "$work/log") ($(( $(date +%s) - start )) s)"
    exit 0
  fi
  tail -n 30 "$work/log"
  echo "gpu_rehearse: FAILED: a bundle without $plant was not refused by name" >&2
  exit 1
fi
if [ $rc != 0 ]; then
  tail -n 40 "$work/log"
  echo "gpu_rehearse: FAILED (exit $rc): the check would not get through on a bare GPU machine" >&2
  exit 1
fi
echo "gpu_rehearse: passed: every program of the check starts on a clean root and finds no GPU ($(( $(date +%s) - start )) s)"
