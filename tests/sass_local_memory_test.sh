#!/usr/bin/env bash
# scripts/sass_local_memory.py on tests/local_memory_sample.cu: each local load and store at its kernel's marked
# line, in its loop or in none; none in a kernel that ptxas gives no stack frame; the spills ptxas counts; a clear
# refusal of a bad file. Then scripts/kernel_cubin.sh on this build's rope.cu (its command line as make runs it).
set -uo pipefail
NVCC=$1 SCRIPT=$2 SAMPLE=$3 CUBINS=$4 BUILD=$5
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
line_of() { grep -n "$1" "$SAMPLE" | cut -d: -f1; }

"$NVCC" -arch=sm_90a -cubin -lineinfo -Xptxas -v -o "$TMP/s.cubin" "$SAMPLE" >"$TMP/ptxas.log" 2>&1 ||
  fail "nvcc: $(cat "$TMP/ptxas.log")"
out=$(python3 "$SCRIPT" "$TMP/s.cubin" --all 2>&1) || fail "script failed: $out"
echo "$out"
section() { awk -v k="$1" '/^[^ ]/{on = index($0, k) == 1} on' <<<"$out"; }

st=$(line_of MARK-STL) ld=$(line_of MARK-LDL)
idx=$(section "indexed_local(")
# The store inside the loop (its backward branch decoded), the load after it.
in_loop="local_memory_sample.cu:$st  LDL 0  STL 1  in a [0-9]+-instruction loop from local_memory_sample.cu:$st "
[[ $idx =~ $in_loop ]] ||
  fail "the store of line $st in its loop not found: $idx"
[[ $idx == *"local_memory_sample.cu:$ld  LDL 1  STL 0  in no loop"* ]] || fail "the load of line $ld not found: $idx"
[[ $(section "in_registers(") == *"0 LDL, 0 STL"* ]] || fail "in_registers: $(section "in_registers(")"

# ptxas's spill bytes for `spilling`: all 4-byte spills here, so 4 bytes per STL / LDL found.
read -r sb lb < <(grep -A1 "Function properties for _Z8spilling" "$TMP/ptxas.log" |
  sed -nE 's/.* ([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads.*/\1 \2/p')
[[ -n ${sb:-} && $sb -gt 0 ]] || fail "ptxas reports no spills for spilling (sample no longer spills?)"
sp=$(section "spilling(")
[[ $sp == *"$((lb / 4)) LDL, $((sb / 4)) STL"* ]] || fail "spilling: ptxas $sb / $lb bytes, found: $sp"
[[ $sp == *"local_memory_sample.cu:$(line_of MARK-SPILL)  LDL "* ]] || fail "no reload on the marked line: $sp"

# The kernel filter, and refusals with rc 2 naming the file.
[[ $(python3 "$SCRIPT" "$TMP/s.cubin" --kernel in_regis) == "no kernel with local-memory"* ]] || fail "--kernel"
echo "not an elf" >"$TMP/bad.cubin"
msg=$(python3 "$SCRIPT" "$TMP/bad.cubin" 2>&1)
[[ $? == 2 && $msg == *"bad.cubin is not a 64-bit"* ]] || fail "a text file: $msg"
msg=$(python3 "$SCRIPT" "$TMP/none.cubin" 2>&1)
[[ $? == 2 && $msg == *"cannot read"*"none.cubin"* ]] || fail "a missing file: $msg"

msg=$(bash "$CUBINS" "$BUILD" "$TMP/k" kernels/rope.cu 2>&1) || fail "kernel_cubin: $msg"
[[ $msg == "kernel_cubin: 1 cubins in $TMP/k" ]] || fail "kernel_cubin: $msg"
grep -q "Function properties for .*rope_kernel" "$TMP/k/rope.ptxas.log" ||
  fail "no ptxas report: $(cat "$TMP/k/rope.ptxas.log")"
[[ $(python3 "$SCRIPT" "$TMP/k/rope.cubin" --all) == *"rope_kernel("*"instructions"* ]] || fail "rope.cubin unread"
msg=$(bash "$CUBINS" "$TMP/nowhere" "$TMP/k2" 2>&1)
[[ $? == 2 && $msg == *"nowhere has no Makefile"* ]] || fail "kernel_cubin without a build: $msg"
echo "sass_local_memory: all passed"
