#!/usr/bin/env bash
# Cubins of the CUDA sources with line tables, compiled with a build's own nvcc command lines (as make would run
# them), each beside its ptxas -v log: the input of scripts/sass_local_memory.py. Works without a GPU.
#   bash scripts/kernel_cubin.sh BUILD_DIR OUT_DIR [kernels/x.cu ...]   (default: every .cu of mxtrain_core)
set -uo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: kernel_cubin.sh BUILD_DIR OUT_DIR [SOURCE.cu ...]" >&2
  exit 2
fi
build=$1 out=$2
shift 2
if [[ ! -f $build/Makefile ]]; then
  echo "kernel_cubin: $build has no Makefile (configure it with scripts/build.sh)" >&2
  exit 2
fi
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
# make -B -n prints every compile line of the target without running it (each after its `cd` into the object dir).
cmds=$(make -B -n -C "$build" mxtrain_core 2>/dev/null | grep -E '(^|&& )[^ ]*nvcc .* -x cu -c [^ ]+\.cu ')
[[ -n $cmds ]] || { echo "kernel_cubin: no nvcc compile lines in $build's mxtrain_core (a CUDA build?)" >&2; exit 2; }
want=("$@")
made=0 failed=0
while IFS= read -r cmd; do
  src=$(sed -E 's/.* -x cu -c ([^ ]+\.cu) .*/\1/' <<<"$cmd")
  if [[ ${#want[@]} -gt 0 ]]; then
    hit=0
    for w in "${want[@]}"; do [[ $src == *"$w" ]] && hit=1; done
    [[ $hit == 1 ]] || continue
  fi
  name=$(basename "$src" .cu)
  # One sm_90a cubin instead of the object: no depfile, line tables, ptxas's per-kernel report.
  c=$(sed -E -e 's/ -MD -MT [^ ]+ -MF [^ ]+//' \
    -e 's/--generate-code=arch=compute_90a,code=\[compute_90a,sm_90a\]/-arch=sm_90a -cubin/' \
    -e 's/--generate-code=[^ ]+//g' -e "s# -x cu -c ([^ ]+) -o [^ ]+# -x cu \\1 -o $out/$name.cubin#" <<<"$cmd")
  c="$c -lineinfo -Xptxas -v"
  if (cd "$build" && bash -c "$c") >"$out/$name.ptxas.log" 2>&1; then
    made=$((made + 1))
  else
    failed=$((failed + 1))
    echo "kernel_cubin: $src failed to compile; see $out/$name.ptxas.log" >&2
  fi
done <<<"$cmds"
echo "kernel_cubin: $made cubins in $out$([[ $failed == 0 ]] || echo ", $failed failed")"
[[ $made -gt 0 && $failed == 0 ]]
