#!/usr/bin/env bash
# The README's test command (and CI's, through .ci/run): installs dependencies, builds build/ (CUDA AUTO:
# the CUDA code is compiled and linked whenever the toolkit is present, even with no GPU), runs every ctest
# test, then the CPU-only build check (tests/cpu_only_build.sh) unless ctest already ran it.
# Exits non-zero when any step fails. Environment: as scripts/build.sh, plus MXTRAIN_SKIP_DEPS=1,
# MXTRAIN_CTEST_ARGS (extra ctest arguments, e.g. "-LE slow").
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${MXTRAIN_BUILD_DIR:-$ROOT/build}
export MXTRAIN_BUILD_DIR=$BUILD_DIR
START=$SECONDS
report_time() { local t=$((SECONDS - START)); echo "test.sh: total time $((t / 60))m$((t % 60))s"; }
trap report_time EXIT

step() { echo; echo "==== $* ($((SECONDS - START))s)"; }

if [[ "${MXTRAIN_SKIP_DEPS:-0}" != 1 ]]; then
  step "dependencies"
  bash "$ROOT/scripts/install_deps.sh"
fi

step "build (MXTRAIN_CUDA=${MXTRAIN_CUDA:-AUTO})"
bash "$ROOT/scripts/build.sh" || { echo "test.sh: FAILED: build"; exit 1; }

# Open MPI refuses to run as root unless told (tests may launch mpirun or MPI singletons).
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export NCCL_NVLS_ENABLE=0

failed=()
step "ctest"
# shellcheck disable=SC2086
ctest --test-dir "$BUILD_DIR" --output-on-failure -j2 ${MXTRAIN_CTEST_ARGS:-} || failed+=(ctest)

if ctest --test-dir "$BUILD_DIR" -N -R '^cpu_only_build$' 2>/dev/null | grep -q 'Total Tests: [1-9]'; then
  echo "test.sh: CPU-only build check ran under ctest (cpu_only_build)"
else
  step "CPU-only build check"
  bash "$ROOT/tests/cpu_only_build.sh" "$ROOT" || failed+=(cpu_only_build)
fi

echo
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "test.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "test.sh: all passed"
