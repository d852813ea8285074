# Tests that are scripts, not GoogleTest binaries. Included from tests/CMakeLists.txt.

# Configures and builds the CPU-only variant (MXTRAIN_CUDA=OFF) into <source>/build-cpu (persistent, so
# reruns are incremental) and checks the binary runs and links no CUDA library.
add_test(NAME cpu_only_build COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cpu_only_build.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(cpu_only_build PROPERTIES TIMEOUT 1800 LABELS slow RESOURCE_LOCK build_cpu_dir
                     COST 1000)  # long: ctest starts it first, alongside the unit tests

# The L1 projection parses a committed shortened-model log (stage and NCCL timing) and prints its table.
find_program(MXT_PYTHON3 python3)
if(MXT_PYTHON3)
  add_test(NAME project_l1 COMMAND ${MXT_PYTHON3} ${CMAKE_SOURCE_DIR}/scripts/project_l1.py
           ${CMAKE_SOURCE_DIR}/docs/data/8x7b_ep2_8_fp8_true.log)
  set_tests_properties(project_l1 PROPERTIES PASS_REGULAR_EXPRESSION "8-rank imbalance \\(g=2.5\\) \\| [0-9.]+ \\| [0-9]+")
endif()

# The power summary parses committed nvidia-smi samples (gzipped) over a committed bench_trainer.py call's run
# windows (written on a UTC machine: the samples' timestamps are local time).
if(MXT_PYTHON3)
  add_test(NAME gpu_samples COMMAND ${MXT_PYTHON3} ${CMAKE_SOURCE_DIR}/scripts/gpu_samples.py
           ${CMAKE_SOURCE_DIR}/docs/data/s24_smi_bench.csv.gz ${CMAKE_SOURCE_DIR}/docs/data/s24_bench_trainer.jsonl)
  set_tests_properties(gpu_samples PROPERTIES ENVIRONMENT TZ=UTC
                       PASS_REGULAR_EXPRESSION "8x7B-2layer mxtrain \\| 15 \\| 1440 \\| 689 / 706 \\| 100%.*8x7B-2layer HF \\| 23 \\| 1725")
endif()

# scripts/pack_devbin.sh on stand-in builds: packs each build with its --version line, refuses stale binaries.
add_test(NAME pack_devbin COMMAND bash ${CMAKE_SOURCE_DIR}/tests/pack_devbin_test.sh
         ${CMAKE_SOURCE_DIR}/scripts/pack_devbin.sh)
set_tests_properties(pack_devbin PROPERTIES PASS_REGULAR_EXPRESSION "pack_devbin: all passed")
add_test(NAME device_script_sections COMMAND bash ${CMAKE_SOURCE_DIR}/tests/device_script_sections.sh
         ${CMAKE_SOURCE_DIR}/scripts/device_dist_checks.sh)
# Session 55's model of the grouped GEMM's static schedule (docs/perf.md) builds on the kernels' schedule functions and
# still gives the figures the notes quote: forced balance 0.9505, half units last at 0.65 0.9858, in place 0.9994.
if(MXTRAIN_HAVE_CUDA)
  add_test(NAME half_schedule_model COMMAND bash -c
           "d=$(mktemp -d) && \"$0\" -std=c++17 -O2 -I \"$1/kernels\" -I \"$2\" \"$1/docs/data/s55_half_schedule_model.cpp\" -o \"$d/m\" && \"$d/m\"; rc=$?; rm -rf \"$d\"; exit $rc"
           ${CMAKE_CXX_COMPILER} ${CMAKE_SOURCE_DIR} ${CUDAToolkit_INCLUDE_DIRS})
  set_tests_properties(half_schedule_model PROPERTIES PASS_REGULAR_EXPRESSION
                       "h 0\\.65: 0\\.9994.*moved last, static schedule: 0\\.9858.*forced balance[^:]*: 0\\.9505")
endif()
# scripts/device_call_lib.sh (the device calls' helpers) against stand-in binaries and bench_trainer.py.
if(MXT_PYTHON3)
  add_test(NAME device_call_lib COMMAND bash ${CMAKE_SOURCE_DIR}/tests/device_call_lib_test.sh
           ${CMAKE_SOURCE_DIR}/scripts/device_call_lib.sh)
  set_tests_properties(device_call_lib PROPERTIES PASS_REGULAR_EXPRESSION "ok: device_call_lib.sh")
endif()

# The ncu table parses session 41's committed raw metrics (the single-call weight gradient, with and without its
# epilogue) and derives the least cycles the L2 needs for its dW adds.
if(MXT_PYTHON3)
  add_test(NAME ncu_table COMMAND bash -c
           "d=$(mktemp -d) && tar xzf \"$0\" -C \"$d\" ./wg_raw.csv ./wg_noepi_raw.csv && \"$1\" \"$2\" c1=\"$d/wg_raw.csv\" noepi=\"$d/wg_noepi_raw.csv\"; rc=$?; rm -rf \"$d\"; exit $rc"
           ${CMAKE_SOURCE_DIR}/docs/data/s41_ncu_wgrad.tgz ${MXT_PYTHON3} ${CMAKE_SOURCE_DIR}/scripts/ncu_table.py)
  set_tests_properties(ncu_table PROPERTIES
                       PASS_REGULAR_EXPRESSION "\\| c1 \\| 9\\.26 \\| 1\\.56 \\| 78\\.1 \\| 88\\.5 \\| 44\\.6 \\| 3\\.76 \\| 1\\.14 \\|.*\\| noepi \\| 7\\.64 \\|")
  # A file of two launches (ncu -c 2: one header and one units row, then a row per launch) gives a row each.
  add_test(NAME ncu_table_launches COMMAND bash -c
           "d=$(mktemp -d) && tar xzf \"$0\" -C \"$d\" ./wg_raw.csv && { cat \"$d/wg_raw.csv\"; tail -n +3 \"$d/wg_raw.csv\"; } > \"$d/two.csv\" && \"$1\" \"$2\" two=\"$d/two.csv\"; rc=$?; rm -rf \"$d\"; exit $rc"
           ${CMAKE_SOURCE_DIR}/docs/data/s41_ncu_wgrad.tgz ${MXT_PYTHON3} ${CMAKE_SOURCE_DIR}/scripts/ncu_table.py)
  set_tests_properties(ncu_table_launches PROPERTIES
                       PASS_REGULAR_EXPRESSION "\\| two \\| 9\\.26 \\|.*\\| two#2 \\| 9\\.26 \\|")
  # scripts/ncu_sass_ops.py on a sample of session 61's per-instruction exports (W13's single call, with and
  # without its epilogue; each file's first kernel has predicated rows, and a second kernel follows that must not
  # count): the difference of the two, then the first alone.
  add_test(NAME ncu_sass_ops COMMAND bash -c
           "d=$(mktemp -d) && tar xzf \"$0\" -C \"$d\" && \"$1\" \"$2\" \"$d/sample_W13_c2m_sass.csv\" \"$d/sample_W13_c2m_noepi_sass.csv\" && \"$1\" \"$2\" \"$d/sample_W13_c2m_sass.csv\"; rc=$?; rm -rf \"$d\"; exit $rc"
           ${CMAKE_SOURCE_DIR}/docs/data/s61_ncu_sass_sample.tgz ${MXT_PYTHON3} ${CMAKE_SOURCE_DIR}/scripts/ncu_sass_ops.py)
  set_tests_properties(ncu_sass_ops PROPERTIES
                       PASS_REGULAR_EXPRESSION "samples: 1724 - 1713 = \\+11.*\\| IMAD\\.U32 \\| 1089 \\| 1039 \\| \\+50 \\|.*\\| IMAD\\.IADD \\| 97 \\| 5\\.6% \\|")
endif()

# scripts/sass_local_memory.py (spill sites by source line, no disassembler) on a sample of known lines, and
# scripts/kernel_cubin.sh on this build.
if(MXT_PYTHON3 AND MXTRAIN_HAVE_CUDA)
  add_test(NAME sass_local_memory COMMAND bash ${CMAKE_SOURCE_DIR}/tests/sass_local_memory_test.sh
           ${CMAKE_CUDA_COMPILER} ${CMAKE_SOURCE_DIR}/scripts/sass_local_memory.py
           ${CMAKE_SOURCE_DIR}/tests/local_memory_sample.cu ${CMAKE_SOURCE_DIR}/scripts/kernel_cubin.sh
           ${CMAKE_BINARY_DIR})
  set_tests_properties(sass_local_memory PROPERTIES PASS_REGULAR_EXPRESSION "sass_local_memory: all passed")
endif()
