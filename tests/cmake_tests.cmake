# Tests that are scripts, not GoogleTest binaries. Included from tests/CMakeLists.txt.

# Configures and builds the CPU-only variant (MXTRAIN_CUDA=OFF) into <source>/build-cpu (persistent, so
# reruns are incremental) and checks the binary runs and links no CUDA library.
add_test(NAME cpu_only_build COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cpu_only_build.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(cpu_only_build PROPERTIES TIMEOUT 1800 LABELS slow RESOURCE_LOCK build_cpu_dir
                     COST 1000)  # long: ctest starts it first, alongside the unit tests
