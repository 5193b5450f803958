#!/usr/bin/env bash
# Runs README.md's two commands, exactly as written there, in a clean Debian 12 root: what a new
# user's machine is, not this one with whatever was installed by hand. A green CI on a used machine
# can hide a missing install step; this cannot.
#
#   scripts/fresh_check.sh            check HEAD (a git clone of it, as a user gets it)
#   scripts/fresh_check.sh --dirty    also apply the working tree's uncommitted changes
#
# The root is Debian 12 minbase plus what the CI machines' image has that matters here: make, the
# compilers (build-essential) and reference BLAS (libblas-dev, whose cblas.h once passed for
# OpenBLAS). The CUDA toolkit is bind-mounted read-only, as the image has it. Needs root.
# Cached (safe: they hold nothing of the project's): the base root as a tarball, rebuilt weekly or
# when its package list changes, and apt's downloaded .debs (apt checks their signatures and dpkg
# installs them afresh every run).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dirty=0
case "${1:-}" in --dirty) dirty=1;; "") ;; *) echo "usage: $0 [--dirty]" >&2; exit 2;; esac
[ "$(id -u)" = 0 ] || { echo "fresh_check: needs root (mmdebstrap, chroot, mounts)" >&2; exit 1; }
start=$(date +%s)

base_pkgs="make,build-essential,ca-certificates,libblas-dev"
cache=${MT_FRESH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/moetrain-fresh}
mkdir -p "$cache/debs"
base="$cache/bookworm-$(echo "$base_pkgs" | sha1sum | cut -c1-12).tar"
if [ -z "$(find "$base" -mtime -7 2>/dev/null)" ]; then
  command -v mmdebstrap >/dev/null || {
    echo "fresh_check: installing mmdebstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends mmdebstrap >/dev/null
  }
  echo "fresh_check: building the base root (Debian 12 minbase + $base_pkgs)"
  mmdebstrap --quiet --format=tar --variant=minbase --include="$base_pkgs" bookworm "$base.tmp"
  mv "$base.tmp" "$base"
fi

work=$(mktemp -d /tmp/moetrain-fresh.XXXXXX)
trap 'rm -rf "$work"' EXIT
root="$work/root"
mkdir -p "$root"
tar -xf "$base" -C "$root"
cp /etc/resolv.conf "$root/etc/resolv.conf"
git clone -q "$repo" "$work/main"
if [ "$dirty" = 1 ]; then git -C "$repo" diff HEAD --binary | git -C "$work/main" apply --allow-empty; fi
echo "fresh_check: checking $(git -C "$work/main" log -1 --format='%h %s' | cut -c1-70)$([ "$dirty" = 1 ] && echo ' + uncommitted changes')"

# README's two commands: the first line of each of the first two ``` blocks after its heading.
mapfile -t cmds < <(awk '/^## The two commands/{on=1; next} on && /^## /{exit}
  on && /^```/{inblk=!inblk; if (inblk) {getline; print}}' "$repo/README.md")
[ ${#cmds[@]} -eq 2 ] || { echo "fresh_check: README.md's two commands not found" >&2; exit 1; }

cuda=${CUDA_HOME:-/usr/local/cuda}
log="$work/log"
# A private mount namespace: every mount below disappears with it, whatever happens.
run_in_root() {
  unshare --mount --propagation private bash -euo pipefail -c '
    root=$1; src=$2; cuda=$3; debs=$4; cmd=$5
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs tmpfs "$root/dev/shm"
    mkdir -p "$root/src/main" "$root/usr/local/cuda"
    mount --bind "$src" "$root/src/main"
    if [ -d "$cuda" ]; then mount --bind -o ro "$cuda" "$root/usr/local/cuda"; fi
    mount --bind "$debs" "$root/var/cache/apt/archives"
    chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      bash -c "cd /src/main && $cmd"
  ' _ "$root" "$work/main" "$cuda" "$cache/debs" "$1"
}
for cmd in "${cmds[@]}"; do
  t0=$(date +%s)
  echo "fresh_check: \$ $cmd"
  if ! run_in_root "$cmd" >"$log" 2>&1; then
    tail -40 "$log"
    echo "fresh_check: FAILED: '$cmd' in a clean Debian 12 root ($(( $(date +%s) - t0 )) s)"
    exit 1
  fi
  tail -3 "$log" | sed 's/^/  | /'
  echo "fresh_check: ok ($(( $(date +%s) - t0 )) s)"
done
echo "fresh_check: passed: README's two commands work on a clean machine ($(( $(date +%s) - start )) s)"
