#!/usr/bin/env bash
# CPU-only build check: configures and builds mxtrain with -DMXTRAIN_CUDA=OFF -DMXTRAIN_BUILD_TESTS=OFF into
# a persistent directory (default <source>/build-cpu, so reruns are incremental), then checks that the binary
# exists, that `mxtrain --version` runs, and that it links no CUDA library.
# Usage: tests/cpu_only_build.sh [SOURCE_DIR]   (MXTRAIN_CPU_BUILD_DIR overrides the build directory)
set -euo pipefail

SRC=$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}" && pwd)
BUILD=${MXTRAIN_CPU_BUILD_DIR:-$SRC/build-cpu}
JOBS=$(nproc 2>/dev/null || echo 2)
fail() { echo "cpu_only_build: FAIL: $*" >&2; exit 1; }

mkdir -p "$BUILD"
# One build at a time in this directory (two ctest runs, or ctest and test.sh).
exec 9>"$BUILD/.cpu_only_build.lock"
flock 9

cache="$BUILD/CMakeCache.txt"
if [[ -f "$cache" ]]; then
  home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache")
  if [[ -n "$home" && "$(cd "$home" 2>/dev/null && pwd || echo "$home")" != "$SRC" ]]; then
    echo "cpu_only_build: $BUILD was configured for $home; starting over"
    find "$BUILD" -mindepth 1 -maxdepth 1 ! -name .cpu_only_build.lock -exec rm -rf {} +
  fi
fi

echo "cpu_only_build: configuring $BUILD"
# pipefail: the pipeline fails when cmake does.
if ! cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMXTRAIN_CUDA=OFF -DMXTRAIN_BUILD_TESTS=OFF \
    2>&1 | tee "$BUILD/.configure.log"; then
  fail "configure"
fi
grep -q 'mxtrain: CUDA backend OFF' "$BUILD/.configure.log" || fail "configure did not report 'CUDA backend OFF'"

echo "cpu_only_build: building (-j$JOBS)"
cmake --build "$BUILD" -j "$JOBS" --target mxtrain || fail "build"

BIN="$BUILD/mxtrain"
[[ -x "$BIN" ]] || fail "$BIN missing"

if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
version=$(timeout 60 "$BIN" --version 2>&1) || fail "'mxtrain --version' failed: $version"
echo "cpu_only_build: mxtrain --version: $version"
[[ -n "$version" ]] || fail "'mxtrain --version' printed nothing"

libs=$(ldd "$BIN") || fail "ldd failed"
if grep -E 'libcudart|libcublas|libcuda\.so|libnccl|libcudnn' <<<"$libs"; then
  fail "the CPU-only binary links CUDA libraries (above)"
fi
if grep 'not found' <<<"$libs"; then
  fail "unresolved shared libraries (above)"
fi
echo "cpu_only_build: OK ($BIN, no CUDA libraries)"
