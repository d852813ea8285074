#pragma once
// A file cache of the drawn initial weights, for runs that start the same model again and again (benchmarks, A/B
// runs on a lent GPU: drawing the 8x7B bench's 3.95 B values took 11.9 s of an 18 s run, session 51). Opt-in:
// MXTRAIN_INIT_CACHE=DIR. One file per key (the layout, seed, initializer_range and the generator's version):
// DIR/init-<key>.f32, a header and then the dense and expert floats exactly as init_params_host draws them.
#include <cstdint>
#include <string>

#include "mxtrain/config.hpp"
#include "mxtrain/params.hpp"

namespace mxt {

// Everything init_params_host's values depend on, hashed.
uint64_t init_cache_key(const ParamLayout& layout, const ModelConfig& m, uint64_t seed);

// The file for that key under dir.
std::string init_cache_path(const std::string& dir, uint64_t key);

// What init_params_cached did: read the key's file, or drew the values and wrote it, or drew them and could not.
struct InitCacheOutcome {
  enum How { kRead, kWritten, kNotWritten } how;
  std::string path;     // the key's file
  std::string problem;  // what went wrong, for the log (a file of another model, a cache that cannot be written)
};

// init_params_host through the cache in dir (created if missing): reads the key's file when its header and size
// match, else draws and writes it (to a temporary name, then renamed, so no reader sees half a file). A cache that
// cannot be read or written never fails the run: the values are drawn, and `problem` says why.
InitCacheOutcome init_params_cached(const std::string& dir, const ParamLayout& layout, const ModelConfig& m,
                                    uint64_t seed, float* dense, float* expert);

}  // namespace mxt
