// The initial weights' file cache (MXTRAIN_INIT_CACHE, mxtrain/init_cache.hpp): what it reads back is bit for bit
// what init_params_host draws; its key changes with everything the values depend on; a file that is not this
// model's, or a cache that cannot be written, falls back to drawing and never loses the run.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data_test_util.hpp"
#include "mxtrain/init_cache.hpp"
#include "mxtrain/params.hpp"
#include "tiny_config.hpp"

namespace mxt {
namespace {

struct Drawn {
  std::vector<float> dense, expert;
};

// Through the cache into NaN-filled buffers (so an element the cache leaves out shows).
Drawn cached(const std::string& dir, const ParamLayout& layout, const ModelConfig& m, uint64_t seed,
             InitCacheOutcome& o) {
  Drawn d{std::vector<float>(layout.dense_numel, std::nanf("")),
          std::vector<float>(layout.expert_numel, std::nanf(""))};
  o = init_params_cached(dir, layout, m, seed, d.dense.data(), d.expert.data());
  return d;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(InitCache, ReadsBackExactlyWhatItDrew) {
  dtest::TempDir tmp;
  const std::string dir = tmp.path("cache");  // created by the first call
  const ModelConfig m = testing::tiny_model(300, 32, 48);
  const ParamLayout layout = ParamLayout::build(m, 1, 2);  // experts 1 and 2 of 4
  Drawn want;
  init_params_host(layout, m, 41, want.dense, want.expert);

  InitCacheOutcome o;
  const Drawn first = cached(dir, layout, m, 41, o);
  EXPECT_EQ(o.how, InitCacheOutcome::kWritten);
  EXPECT_TRUE(o.problem.empty()) << o.problem;
  EXPECT_TRUE(same_bits(first.dense, want.dense) && same_bits(first.expert, want.expert));
  const std::string path = init_cache_path(dir, init_cache_key(layout, m, 41));
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  EXPECT_EQ(std::filesystem::file_size(path),
            static_cast<uintmax_t>(32 + (layout.dense_numel + layout.expert_numel) * 4));  // header + floats

  EXPECT_EQ(o.path, path);
  const Drawn second = cached(dir, layout, m, 41, o);
  EXPECT_EQ(o.how, InitCacheOutcome::kRead) << o.problem;
  EXPECT_EQ(o.path, path);
  EXPECT_TRUE(o.problem.empty()) << o.problem;
  EXPECT_TRUE(same_bits(second.dense, want.dense)) << "dense weights read back differ";
  EXPECT_TRUE(same_bits(second.expert, want.expert)) << "expert weights read back differ";
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1) << "a temporary file was left behind";
}

TEST(InitCache, KeyChangesWithWhatTheValuesDependOn) {
  const ModelConfig m = testing::tiny_model(300, 32, 48);
  const ParamLayout all = ParamLayout::build(m, 0, 4), part = ParamLayout::build(m, 2, 2);
  ModelConfig wider = m;
  wider.initializer_range = 0.03;
  const ParamLayout other = ParamLayout::build(testing::tiny_model(300, 32, 64), 0, 4);
  const uint64_t k = init_cache_key(all, m, 5);
  EXPECT_EQ(k, init_cache_key(ParamLayout::build(m, 0, 4), m, 5));
  EXPECT_NE(k, init_cache_key(all, m, 6));
  EXPECT_NE(k, init_cache_key(all, wider, 5));
  EXPECT_NE(k, init_cache_key(part, m, 5));
  EXPECT_NE(k, init_cache_key(other, testing::tiny_model(300, 32, 64), 5));
}

TEST(InitCache, AFileThatIsNotThisModelsIsDrawnAgainAndReplaced) {
  dtest::TempDir tmp;
  const ModelConfig m = testing::tiny_model(300, 32, 48);
  const ParamLayout layout = ParamLayout::build(m, 0, 4);
  Drawn want;
  init_params_host(layout, m, 7, want.dense, want.expert);
  const std::string path = init_cache_path(tmp.path(""), init_cache_key(layout, m, 7));
  InitCacheOutcome o;
  {  // the right name, a short file
    std::ofstream(path, std::ios::binary) << "MXTINIT1 and then too little";
    const Drawn d = cached(tmp.path(""), layout, m, 7, o);
    EXPECT_EQ(o.how, InitCacheOutcome::kWritten);
    EXPECT_NE(o.problem.find("drawn again"), std::string::npos) << o.problem;
    EXPECT_TRUE(same_bits(d.dense, want.dense) && same_bits(d.expert, want.expert));
  }
  {  // the right size, another header: as a file of another model would be
    std::vector<char> bytes(std::filesystem::file_size(path), 0);
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    const Drawn d = cached(tmp.path(""), layout, m, 7, o);
    EXPECT_EQ(o.how, InitCacheOutcome::kWritten);
    EXPECT_NE(o.problem.find("drawn again"), std::string::npos) << o.problem;
    EXPECT_TRUE(same_bits(d.dense, want.dense) && same_bits(d.expert, want.expert));
  }
  const Drawn d = cached(tmp.path(""), layout, m, 7, o);  // replaced by the draws above
  EXPECT_EQ(o.how, InitCacheOutcome::kRead) << o.problem;
  EXPECT_TRUE(same_bits(d.dense, want.dense) && same_bits(d.expert, want.expert));
}

TEST(InitCache, ACacheThatCannotBeWrittenStillInitialises) {
  dtest::TempDir tmp;
  const std::string file = tmp.write("not_a_dir", "x");  // a file where the cache directory should be
  const ModelConfig m = testing::tiny_model(300, 32, 48);
  const ParamLayout layout = ParamLayout::build(m, 0, 4);
  Drawn want;
  init_params_host(layout, m, 3, want.dense, want.expert);
  InitCacheOutcome o;
  const Drawn d = cached(file + "/cache", layout, m, 3, o);
  EXPECT_EQ(o.how, InitCacheOutcome::kNotWritten);
  EXPECT_FALSE(o.problem.empty());
  EXPECT_TRUE(same_bits(d.dense, want.dense) && same_bits(d.expert, want.expert));
}

// A cache file stays valid only while init_params_host draws what it drew when the file was written; its key holds
// a generator version for that. These values pin the draws: when they change, bump kGeneratorVersion in
// src/model/init_cache.cpp (or old cache files would hand out the old weights) and update them here.
TEST(InitCache, GeneratorVersionPinsTheDraws) {
  const ModelConfig m = testing::tiny_model(300, 32, 48);
  const ParamLayout layout = ParamLayout::build(m, 0, 4);
  Drawn d;
  init_params_host(layout, m, 2026, d.dense, d.expert);
  const std::vector<float> first_dense = {0x1.beab98p-7f, -0x1.bb473cp-8f, -0x1.0dd5dcp-6f};
  const std::vector<float> last_expert = {-0x1.e715f6p-6f, -0x1.47f4ep-5f, -0x1.d977cep-23f};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(d.dense[i], first_dense[i]) << "dense[" << i << "]: bump kGeneratorVersion (init_cache.cpp)";
    EXPECT_EQ(d.expert[d.expert.size() - 1 - i], last_expert[i])
        << "expert[n - " << 1 + i << "]: bump kGeneratorVersion (init_cache.cpp)";
  }
}

}  // namespace
}  // namespace mxt
