#!/usr/bin/env bash
# Kernel benchmarks on the GPU machine: runs every built benchmark executable (tests/bench/bench_*.cpp ->
# <build>/tests/bench_*), writes each full log under the log folder, and prints the tables last. Builds nothing.
# Before the runs it disassembles the grouped GEMM benchmarks (when cuobjdump is on the machine) and counts the
# Hopper instructions their sm90 kernels must contain: HGMMA / QGMMA (bf16 / FP8 wgmma) and UTMALDG (TMA loads).
#
#   scripts/bench_kernels.sh [build dir (default build)] [log dir (default <build>/bench_logs)]
#   BENCH_FILTER=grouped scripts/bench_kernels.sh     # only benchmarks whose name contains "grouped"
#   BENCH_TIMEOUT=500                                  # seconds per benchmark (default 540)
set -uo pipefail

build=${1:-build}
logs=${2:-$build/bench_logs}
filter=${BENCH_FILTER:-}
limit=${BENCH_TIMEOUT:-540}
mkdir -p "$logs"

mapfile -t benches < <(find "$build" -maxdepth 2 -type f -name 'bench_*' -perm -u+x | sort)
if [ ${#benches[@]} -eq 0 ]; then
  echo "bench_kernels.sh: no bench_* executables under $build (a CUDA build makes them from tests/bench/)" >&2
  exit 1
fi

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>/dev/null | tee "$logs/gpu.txt"

objdump=$(command -v cuobjdump || true)
[ -z "$objdump" ] && [ -x /usr/local/cuda/bin/cuobjdump ] && objdump=/usr/local/cuda/bin/cuobjdump
for b in "${benches[@]}"; do
  case "$(basename "$b")" in
    bench_grouped_gemm)
      if [ -n "$objdump" ]; then
        "$objdump" --dump-sass "$b" > "$logs/grouped_gemm.sass" 2>&1
        echo "SASS of $(basename "$b"): HGMMA $(grep -c HGMMA "$logs/grouped_gemm.sass"), UTMALDG" \
             "$(grep -c UTMALDG "$logs/grouped_gemm.sass"), local-memory LDL/STL $(grep -cE '\b(LDL|STL)\b' "$logs/grouped_gemm.sass")"
      else
        echo "no cuobjdump on this machine: SASS not checked"
      fi
      ;;
    bench_mxfp8_gemm)
      # The MXFP8 sm90 kernels must contain FP8 wgmma (QGMMA) and TMA loads; spills show as LDL/STL.
      if [ -n "$objdump" ]; then
        "$objdump" --dump-sass "$b" > "$logs/mxfp8_gemm.sass" 2>&1
        echo "SASS of $(basename "$b"): QGMMA $(grep -c QGMMA "$logs/mxfp8_gemm.sass"), UTMALDG" \
             "$(grep -c UTMALDG "$logs/mxfp8_gemm.sass"), local-memory LDL/STL $(grep -cE '\b(LDL|STL)\b' "$logs/mxfp8_gemm.sass")"
      fi
      ;;
  esac
done

status=0
for b in "${benches[@]}"; do
  name=$(basename "$b")
  [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
  echo "== $name (log: $logs/$name.log)"
  timeout "$limit" "$b" > "$logs/$name.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "$name exited with $rc; last lines:" >&2
    tail -n 20 "$logs/$name.log" >&2
    status=1
    if [ "$name" = bench_grouped_gemm ]; then  # a failing 2-CTA-cluster variant must not cost the other rows
      mv "$logs/$name.log" "$logs/$name.failed.log"
      echo "== $name --no-cluster (after the failure above)"
      timeout "$limit" "$b" --no-cluster > "$logs/$name.log" 2>&1 || echo "$name --no-cluster exited with $?" >&2
    fi
  fi
done

echo
for b in "${benches[@]}"; do
  name=$(basename "$b")
  [ -f "$logs/$name.log" ] || continue
  echo "### $name"
  grep '^|' "$logs/$name.log" || tail -n 20 "$logs/$name.log"
  echo
done
exit $status
