// MXTRAIN_GEMM_ALGO's parser and scope (kernels/gemm_algo_pick.hpp), on the host: which GEMMs take the
// heuristic's k-th algorithm, and errors that name the variable for every malformed value.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "gemm_algo_pick.hpp"

namespace mxt::testing {
namespace {

TEST(GemmAlgoPick, DefaultIsTheHeuristicsFirst) {
  for (const char* v : {static_cast<const char*>(nullptr), "", "0", "0@65536"}) {
    const GemmAlgoPick p = parse_gemm_algo_pick(v);
    EXPECT_EQ(p.index, 0) << (v ? v : "null");
    EXPECT_FALSE(p.applies(4096, 128256, 4096)) << (v ? v : "null");
  }
}

TEST(GemmAlgoPick, IndexAndSmallestDimension) {
  const GemmAlgoPick all = parse_gemm_algo_pick("2");
  EXPECT_EQ(all.index, 2);
  EXPECT_EQ(all.min_dim, 0);
  EXPECT_TRUE(all.applies(64, 64, 64));
  const GemmAlgoPick lm = parse_gemm_algo_pick("1@65536");
  EXPECT_EQ(lm.index, 1);
  EXPECT_EQ(lm.min_dim, 65536);
  EXPECT_TRUE(lm.applies(4096, 128256, 4096));   // LM head forward: N = vocab
  EXPECT_TRUE(lm.applies(128256, 4096, 32768));  // its weight gradient: M = vocab
  EXPECT_TRUE(lm.applies(4096, 4096, 128256));   // its dgrad: K = vocab
  EXPECT_FALSE(lm.applies(4096, 6144, 4096));    // a QKV projection
  EXPECT_TRUE(parse_gemm_algo_pick("15@1").applies(1, 1, 1));
}

TEST(GemmAlgoPick, OneContractionLength) {
  const GemmAlgoPick w = parse_gemm_algo_pick("2@K=32768");
  EXPECT_EQ(w.index, 2);
  EXPECT_EQ(w.only_k, 32768);
  EXPECT_TRUE(w.applies(128256, 4096, 32768));   // the LM head's weight gradient over 8 micro-batches
  EXPECT_FALSE(w.applies(128256, 4096, 4096));   // ... over one
  EXPECT_FALSE(w.applies(4096, 4096, 128256));   // its dgrad
  EXPECT_FALSE(w.applies(32768, 32768, 4096));   // M, N are not K
  EXPECT_FALSE(parse_gemm_algo_pick("0@K=32768").applies(128256, 4096, 32768));
}

TEST(GemmAlgoPick, MalformedValuesNameTheVariable) {
  for (const char* v : {"x", "-1", "16", "1@", "@5", "1@0", "1@-3", "1.5", "1@2@3", " 1", "99999999999", "1@K=",
                        "1@K=0", "1@k=5", "1@K=x", "1@KK=5", "1@K=5@3"}) {
    try {
      parse_gemm_algo_pick(v);
      ADD_FAILURE() << "'" << v << "' accepted";
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("MXTRAIN_GEMM_ALGO"), std::string::npos) << m;
      EXPECT_NE(m.find(std::string("'") + v + "'"), std::string::npos) << m;
    }
  }
}

}  // namespace
}  // namespace mxt::testing
