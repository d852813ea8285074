#!/usr/bin/env bash
# scripts/device_call_lib.sh on a CPU, against stand-ins for the device's binaries and bench_trainer.py: the
# binaries unpacked from devbin/bins.tgz, a step's variables and exit status in its log, steps past their deadline
# skipped and said so, a step's time cut to CALL_END and nothing started after it, the trainer runs' arguments (ours
# alone, beside HF), every log in $OUT/logs.tgz, and gg_summary's rows.
set -uo pipefail
LIB=$1
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkdir -p "$root/pack/main" "$root/repo/devbin" "$root/repo/scripts" "$root/out"
cat > "$root/pack/main/fake_tests" <<'EOF'
#!/usr/bin/env bash
echo "MODE=${MODE:-unset} args $*"
echo "  [half units] BN 256 cluster 2 y: 5 of 10 values differ"
echo "| 8x7B | fwd x@W13^T | sm90 128x256 c2, alternating with dense  |  2.9 | 0.95 |"
echo "| 8x7B | fwd x@W13^T | sm90 128x128 c1 | 4.1 |"
echo "[  PASSED  ] 3 tests."
sleep "${FAKE_SLEEP:-0}"
exit "${FAKE_RC:-0}"
EOF
chmod +x "$root/pack/main/fake_tests"
echo "mxtrain 0.0.0 (commit test)" > "$root/pack/main/VERSION"
tar czf "$root/repo/devbin/bins.tgz" -C "$root/pack" main
cat > "$root/repo/scripts/bench_trainer.py" <<'EOF'
import os, sys
print("| 8x7B-2layer | 123 | args", " ".join(sys.argv[1:]), "| MODE", os.environ.get("MODE", "unset"))
EOF

cat > "$root/repo/call.sh" <<EOF
source "$LIB"
call_begin libtest
step 30 tests_a MODE=on -- m/main/fake_tests --one
step 30 tests_b FAKE_RC=3 -- m/main/fake_tests
step 30 tests_gg -- m/main/fake_tests
step 30 gg_x -- m/main/fake_tests
trainer 100 ours 8x7B-2layer MODE=off
trainer 100 beside 8x7B-2layer --hf MODE=on
trainer 100 set 8x7B-2layer --hf --set a=1 --set b.c=x MODE=two
CALL_END=\$((SECONDS + 7))
step 60 tests_cut FAKE_SLEEP=20 -- m/main/fake_tests
trainer 1000 past_end 8x7B-2layer
CALL_END=578
SECONDS=500
trainer 420 late 8x7B-2layer
ok 450 "a late bench" && echo "ran a late bench" >> "\$W/timeline.txt"
SECONDS=575
step 60 tests_late -- m/main/fake_tests
call_end
trainer_summary
gg_summary
EOF
(cd "$root/repo" && OUT="$root/out" bash call.sh) > "$root/summary.txt" 2>&1 || fail "the call script failed: $(cat "$root/summary.txt")"
mkdir "$root/logs" && tar xzf "$root/out/logs.tgz" -C "$root/logs" || fail "no logs.tgz under \$OUT"
L=$root/logs
grep -q "commit test" "$L/versions.txt" || fail "versions.txt lacks the packed VERSION"
grep -q "MODE=on args --one" "$L/tests_a.txt" || fail "step did not pass its variable and arguments: $(cat "$L/tests_a.txt")"
grep -q "^rc 0$" "$L/tests_a.txt" || fail "tests_a's exit status not logged"
grep -q "^rc 3$" "$L/tests_b.txt" || fail "tests_b's exit status 3 not logged"
grep -q -- "--hf-baseline none .*--out .*tr_ours 8x7B-2layer | MODE off" "$L/tr_ours.txt" || fail "ours-alone run: $(cat "$L/tr_ours.txt")"
grep -q -- "--hf-baseline m/main/hf_baseline.py .* | MODE on" "$L/tr_beside.txt" || fail "beside-HF run: $(cat "$L/tr_beside.txt")"
grep -q -- "--hf-baseline m/main/hf_baseline.py --set a=1 --set b.c=x --sample-gpu .* | MODE two" "$L/tr_set.txt" \
  || fail "a run with config overrides: $(cat "$L/tr_set.txt")"
grep -q "^rc 124$" "$L/tests_cut.txt" || fail "a step was not cut at CALL_END: $(cat "$L/tests_cut.txt")"
grep -q "skipped: trainer past_end" "$L/timeline.txt" || fail "a trainer after CALL_END was not skipped"
grep -q "skipped: trainer late" "$L/timeline.txt" || fail "a trainer past its deadline was not skipped"
[ ! -f "$L/tr_late.txt" ] || fail "a trainer past its deadline ran"
grep -q "skipped: a late bench" "$L/timeline.txt" || fail "ok did not refuse a step past its deadline"
grep -q "ran a late bench" "$L/timeline.txt" && fail "a step past its deadline ran"
grep -q "skipped: tests_late" "$L/timeline.txt" || fail "a step with under 5 s left was not skipped"
grep -q "tests_a.txt: \[  PASSED  \] 3 tests." "$root/summary.txt" || fail "summary lacks the test result: $(cat "$root/summary.txt")"
grep -q "^tr_ours: | 8x7B-2layer | 123" "$root/summary.txt" || fail "trainer_summary lacks the run: $(cat "$root/summary.txt")"
grep -q "^  \[half units\] BN 256" "$root/summary.txt" || fail "gg_summary lacks the half-units line"
grep -A1 -- "^-- gg_x.txt$" "$root/summary.txt" | grep -q "^| 8x7B | fwd x@W13^T | sm90 128x256 c2, alternating with dense | 2.9 | 0.95 |$" \
  || fail "gg_summary lacks the bench's CTA-pair row, squeezed: $(cat "$root/summary.txt")"
grep -q "sm90 128x128 c1" "$root/summary.txt" && fail "gg_summary kept a row that is not the CTA pairs'"
echo "ok: device_call_lib.sh unpacks, time-boxes, skips, logs and archives"
