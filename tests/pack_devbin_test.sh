#!/usr/bin/env bash
# scripts/pack_devbin.sh on stand-in builds: packs each NAME's binaries with its VERSION line, refuses a binary
# older than a source of its build (naming both, leaving no archive), and refuses a malformed NAME=DIR.
set -uo pipefail
PACK=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# A source tree and a build of it: mxtrain answers --version as the real one does.
mkdir -p "$TMP/src/src" "$TMP/src/tests" "$TMP/build/tests"
echo "int x;" >"$TMP/src/src/a.cpp"
echo "TEST" >"$TMP/src/tests/t.cpp"
echo "CMAKE_HOME_DIRECTORY:INTERNAL=$TMP/src" >"$TMP/build/CMakeCache.txt"
sleep 1  # the binaries strictly newer than the sources
printf '#!/bin/sh\necho "mxtrain 9.9.9 (commit 0123456789ab)"\n' >"$TMP/build/mxtrain"
printf '#!/bin/sh\necho tests\n' >"$TMP/build/tests/mxtrain_tests"
printf '#!/bin/sh\necho bench\n' >"$TMP/build/tests/bench_x"
chmod +x "$TMP/build/mxtrain" "$TMP/build/tests/mxtrain_tests" "$TMP/build/tests/bench_x"

out=$(bash "$PACK" "$TMP/out/bins.tgz" new="$TMP/build" 2>&1) || fail "pack of a fresh build: $out"
[[ $out == *"new      mxtrain 9.9.9 (commit 0123456789ab)"* ]] || fail "no version line: $out"
mkdir "$TMP/x"
tar xzf "$TMP/out/bins.tgz" -C "$TMP/x" || fail "archive unreadable"
for f in new/mxtrain new/mxtrain_tests new/bench_x new/VERSION; do [[ -f $TMP/x/$f ]] || fail "$f not packed"; done
[[ $(cat "$TMP/x/new/VERSION") == "mxtrain 9.9.9 (commit 0123456789ab)" ]] || fail "VERSION: $(cat "$TMP/x/new/VERSION")"
[[ $("$TMP/x/new/bench_x") == bench ]] || fail "bench_x changed by packing"

# --only: mxtrain (for VERSION) and the listed binaries, nothing else; a bad --only is refused.
out=$(bash "$PACK" --only bench_x "$TMP/out/only.tgz" new="$TMP/build" 2>&1) || fail "pack --only: $out"
mkdir "$TMP/y"
tar xzf "$TMP/out/only.tgz" -C "$TMP/y" || fail "--only archive unreadable"
for f in new/mxtrain new/bench_x new/VERSION; do [[ -f $TMP/y/$f ]] || fail "--only: $f not packed"; done
[[ ! -e $TMP/y/new/mxtrain_tests ]] || fail "--only bench_x packed mxtrain_tests"
out=$(bash "$PACK" --only "" "$TMP/out/bad.tgz" new="$TMP/build" 2>&1)
rc=$?
[[ $rc == 2 && $out == *"--only needs"* && ! -e $TMP/out/bad.tgz ]] || fail "empty --only: rc $rc, $out"

# A test source edited after the build: the test binaries are stale (mxtrain is not: it does not compile tests).
rm -f "$TMP/out/bins.tgz"
sleep 1
touch "$TMP/src/tests/t.cpp"
out=$(bash "$PACK" "$TMP/out/bins.tgz" new="$TMP/build" 2>&1)
rc=$?
[[ $rc == 2 ]] || fail "stale test binary: rc $rc, $out"
[[ $out == *"mxtrain_tests is older than $TMP/src/tests/t.cpp"* ]] || fail "stale message: $out"
[[ ! -e $TMP/out/bins.tgz ]] || fail "an archive was written for a stale build"

out=$(bash "$PACK" "$TMP/out/bins.tgz" "$TMP/build" 2>&1)
rc=$?
[[ $rc == 2 && $out == *"is not NAME=BUILD_DIR"* ]] || fail "malformed spec: rc $rc, $out"
echo "pack_devbin: all passed"
