#!/usr/bin/env bash
# Configures and builds mxtrain into build/ (Release, all cores). Incremental when build/ exists.
#   MXTRAIN_CUDA=AUTO|ON|OFF   CUDA backend (default AUTO: on when /usr/local/cuda/bin/nvcc is found)
#   MXTRAIN_BUILD_DIR=dir      build directory (default <repo>/build)
#   MXTRAIN_BUILD_TYPE=type    CMAKE_BUILD_TYPE (default Release)
# Extra arguments go to the configure step, e.g. bash scripts/build.sh -DMXTRAIN_BUILD_TESTS=OFF
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${MXTRAIN_BUILD_DIR:-$ROOT/build}
CUDA_MODE=${MXTRAIN_CUDA:-AUTO}
BUILD_TYPE=${MXTRAIN_BUILD_TYPE:-Release}
JOBS=$(nproc 2>/dev/null || echo 2)

# A cache written for another source tree (a moved or re-cloned checkout) makes cmake refuse: start over.
cache="$BUILD_DIR/CMakeCache.txt"
if [[ -f "$cache" ]]; then
  home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache")
  if [[ -n "$home" && "$(cd "$home" 2>/dev/null && pwd || echo "$home")" != "$ROOT" ]]; then
    echo "build.sh: $BUILD_DIR was configured for $home; reconfiguring from scratch"
    rm -rf "$BUILD_DIR"
  fi
fi

cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" -DMXTRAIN_CUDA="$CUDA_MODE" "$@"
cmake --build "$BUILD_DIR" -j "$JOBS"
