#!/usr/bin/env bash
# Packs prebuilt binaries for a device call (the GPU machine builds nothing): each NAME=BUILD_DIR gets NAME/ with
# mxtrain and, where built, mxtrain_tests and the bench binaries (stripped), plus the HF baseline script when
# ../shared/bench has it. Writes the archive in the foreground and prints what each NAME's mxtrain is
# (`--version`: the source commit), which is also stored as NAME/VERSION; a build older than its sources is refused.
# Session 28 measured a stale pack: the archive was still being written when the call started.
#   bash scripts/pack_devbin.sh devbin/bins.tgz wip=build main=/tmp/wt-main/build
#   bash scripts/pack_devbin.sh --only mxtrain_tests,bench_grouped_gemm devbin/bins.tgz wip=build main=...
# --only LIST: mxtrain and only these of the test and bench binaries (two full builds exceed the device tool's
# 64 MiB carry: session 52); an archive over 64 MiB gets a warning naming the biggest files.
# On the device: mkdir m && tar xzf devbin/bins.tgz -C m; then m/wip/mxtrain ...
set -euo pipefail
die() { echo "pack_devbin.sh: $*" >&2; exit 2; }
only=""
if [[ ${1:-} == --only ]]; then
  [[ $# -ge 2 && -n $2 ]] || die "--only needs a comma-separated list of binaries"
  only=",$2,"
  shift 2
fi
[[ $# -ge 2 ]] || die "usage: pack_devbin.sh [--only BIN,...] OUT.tgz NAME=BUILD_DIR [NAME=BUILD_DIR ...]"
out=$1
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for spec in "$@"; do
  [[ $spec == *=* ]] || die "'$spec' is not NAME=BUILD_DIR"
  name=${spec%%=*} dir=${spec#*=}
  [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || die "name '$name': letters, digits, '.', '_' and '-' only"
  [[ -x $dir/mxtrain ]] || die "$dir/mxtrain: not found or not executable (build it first)"
  dir=$(cd "$dir" && pwd)
  # The sources this build compiles (its CMake cache names them): a binary older than any of them is a build
  # that was not rerun after an edit or a checkout.
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$dir/CMakeCache.txt" 2>/dev/null || true)
  mkdir -p "$stage/$name"
  files=()
  for f in "$dir/mxtrain" "$dir"/tests/mxtrain_tests "$dir"/tests/bench_*; do
    [[ -f $f && -x $f ]] || continue
    [[ -z $only || $(basename "$f") == mxtrain || $only == *",$(basename "$f"),"* ]] || continue
    if [[ -n $src ]]; then
      dirs=(src kernels include configs cmake CMakeLists.txt)
      [[ $(basename "$f") == mxtrain ]] || dirs+=(tests)
      newer=$(cd "$src" && { find "${dirs[@]}" -type f -newer "$f" -print -quit 2>/dev/null || true; })
      [[ -z $newer ]] || die "$f is older than $src/$newer: rebuild before packing"
    fi
    cp "$f" "$stage/$name/"
    strip "$stage/$name/$(basename "$f")" 2>/dev/null || true
    files+=("$(basename "$f")")
  done
  if [[ -f $root/../shared/bench/hf_baseline.py ]]; then
    cp "$root/../shared/bench/hf_baseline.py" "$stage/$name/"
    files+=(hf_baseline.py)
  fi
  "$stage/$name/mxtrain" --version >"$stage/$name/VERSION" 2>&1 || die "$dir/mxtrain --version failed"
  printf '%-8s %s  (%s)\n' "$name" "$(cat "$stage/$name/VERSION")" "${files[*]}"
done
mkdir -p "$(dirname "$out")"
tar czf "$out.tmp" -C "$stage" .
mv "$out.tmp" "$out"
echo "pack_devbin.sh: $out, $(du -h "$out" | cut -f1)"
if [[ $(stat -c %s "$out") -gt $((64 * 1024 * 1024)) ]]; then
  echo "pack_devbin.sh: warning: $out is over the device tool's 64 MiB carry; the largest files (--only leaves some out):" >&2
  tar tzvf "$out" | sort -k3 -n -r | head -5 | awk '{print "  " $3 " " $6}' >&2
fi
