// fp8_config: MXFP8 on (E4M3 and HYBRID), keep_attention_bf16, and the errors for bad values and shapes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <yaml-cpp/yaml.h>

#include "config_error.hpp"
#include "mxtrain/config.hpp"
#include "mxtrain/mxfp8.hpp"

#ifndef MXTRAIN_SOURCE_DIR
#define MXTRAIN_SOURCE_DIR "/work/main"
#endif

using ::testing::HasSubstr;

namespace mxt {
namespace {

TrainConfig typed(const std::vector<std::string>& overrides) {
  return to_train_config(resolve_config(LoadOptions{"L0_sanity", MXTRAIN_SOURCE_DIR "/configs", overrides}));
}


TEST(ConfigFp8, DefaultsAreOffAndAttentionInFp8WhenOn) {
  const TrainConfig c = typed({});
  EXPECT_FALSE(c.fp8.enabled);
  EXPECT_FALSE(c.fp8.keep_attention_bf16);
}

TEST(ConfigFp8, HybridEnablesE5M2Gradients) {
  const TrainConfig c = typed({"fp8_config.enabled=true", "fp8_config.fp8_format=HYBRID"});
  EXPECT_TRUE(c.fp8.enabled);
  EXPECT_EQ(c.fp8.fp8_format, "HYBRID");
  EXPECT_EQ(mxfp8::forward_format(c.fp8.fp8_format), mxfp8::Format::E4M3);
  EXPECT_EQ(mxfp8::gradient_format(c.fp8.fp8_format), mxfp8::Format::E5M2);
  const TrainConfig e = typed({"fp8_config.enabled=true", "fp8_config.keep_attention_bf16=true"});
  EXPECT_TRUE(e.fp8.keep_attention_bf16);
  EXPECT_EQ(mxfp8::gradient_format(e.fp8.fp8_format), mxfp8::Format::E4M3);
}

TEST(ConfigFp8, BadValuesNameTheKey) {
  EXPECT_THAT(error_of([] { typed({"fp8_config.enabled=true", "fp8_config.fp8_format=E5M2"}); }),
              HasSubstr("fp8_config.fp8_format must be one of E4M3, HYBRID; got 'E5M2'"));
  EXPECT_THAT(error_of([] { typed({"fp8_config.keep_attention_bf16=maybe"}); }),
              HasSubstr("fp8_config.keep_attention_bf16"));
  EXPECT_THAT(error_of([] { typed({"fp8_config.keep_attention_bf16s=true"}); }),
              HasSubstr("fp8_config.keep_attention_bf16s"));  // a misspelt key is still rejected
  EXPECT_THAT(error_of([] { typed({"fp8_config.enabled=true", "fp8_config.fp8_recipe=Float8CurrentScaling"}); }),
              HasSubstr("fp8_config.fp8_recipe"));
  EXPECT_THAT(error_of([] { typed({"fp8_config.enabled=true", "fp8_config.hopper_gemm=fp16"}); }),
              HasSubstr("fp8_config.hopper_gemm must be one of fp8, bf16; got 'fp16'"));
  EXPECT_EQ(typed({}).fp8.hopper_gemm, "bf16");
  EXPECT_EQ(typed({"fp8_config.hopper_gemm=fp8"}).fp8.hopper_gemm, "fp8");
}

TEST(ConfigFp8, ShapesMustHoldWholeBlocks) {
  EXPECT_THAT(error_of([] { typed({"fp8_config.enabled=true", "config_kwargs.intermediate_size=48"}); }),
              HasSubstr("config_kwargs.intermediate_size (48) to be a multiple of 32"));
  EXPECT_THAT(error_of([] { typed({"fp8_config.enabled=true", "dataset.max_seq_length=100"}); }),
              HasSubstr("dataset.micro_batch_size x dataset.max_seq_length"));
  // Attention kept in bf16: tokens per micro-batch are free (expert token counts are padded).
  EXPECT_NO_THROW(typed({"fp8_config.enabled=true", "fp8_config.keep_attention_bf16=true",
                         "dataset.max_seq_length=100"}));
  EXPECT_NO_THROW(typed({"config_kwargs.intermediate_size=48"}));  // fp8 off: no constraint
}

}  // namespace
}  // namespace mxt
