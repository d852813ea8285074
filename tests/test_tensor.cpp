#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "host_test_util.hpp"
#include "mxtrain/tensor.hpp"

using mxt::DType;
using mxt::Tensor;

namespace {

std::string thrown_message(const std::function<void()>& f) { return mxt::testing::invalid_argument_message(f); }

}  // namespace

TEST(Tensor, ShapeNumelAndDims) {
  std::vector<float> buf(24);
  Tensor t(buf.data(), DType::F32, {2, 3, 4});
  EXPECT_EQ(t.ndim, 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.bytes(), 96u);
  EXPECT_EQ(t.dim(0), 2);
  EXPECT_EQ(t.dim(2), 4);
  EXPECT_EQ(t.dim(-1), 4);
  EXPECT_EQ(t.dim(-3), 2);
  EXPECT_THROW(t.dim(3), std::out_of_range);
  EXPECT_THROW(t.dim(-4), std::out_of_range);
  EXPECT_EQ(t.shape_str(), "[2, 3, 4]");
  EXPECT_EQ(t.device, mxt::Device::CPU);
}

TEST(Tensor, EmptyTensorHasNoElements) {
  Tensor e;
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.bytes(), 0u);
  EXPECT_EQ(e.shape_str(), "[]");
  Tensor z(nullptr, DType::F32, {0, 5});
  EXPECT_EQ(z.numel(), 0);
}

TEST(Tensor, RejectsTooManyOrNegativeDims) {
  EXPECT_THROW(Tensor(nullptr, DType::F32, {1, 2, 3, 4, 5}), std::invalid_argument);
  EXPECT_THROW(Tensor(nullptr, DType::F32, {2, -1}), std::invalid_argument);
  Tensor four(nullptr, DType::U8, {1, 2, 3, 4});
  EXPECT_EQ(four.numel(), 24);
  EXPECT_EQ(four.bytes(), 24u);
}

TEST(Tensor, TypedAccessChecksDtype) {
  std::vector<float> f(4);
  std::vector<int32_t> i(4);
  Tensor tf(f.data(), DType::F32, {4});
  Tensor ti(i.data(), DType::I32, {4});
  EXPECT_EQ(tf.f32(), f.data());
  EXPECT_EQ(ti.i32(), i.data());
  const std::string m1 = thrown_message([&] { tf.i32(); });
  EXPECT_NE(m1.find("i32"), std::string::npos) << m1;
  EXPECT_NE(m1.find("f32"), std::string::npos) << m1;
  Tensor tb(f.data(), DType::BF16, {4});
  const std::string m2 = thrown_message([&] { tb.f32(); });
  EXPECT_NE(m2.find("bf16"), std::string::npos) << m2;
  EXPECT_NE(m2.find("f32"), std::string::npos) << m2;
}

TEST(Tensor, DtypeNames) {
  EXPECT_STREQ(mxt::dtype_name(DType::F32), "f32");
  EXPECT_STREQ(mxt::dtype_name(DType::BF16), "bf16");
  EXPECT_STREQ(mxt::dtype_name(DType::I32), "i32");
  EXPECT_STREQ(mxt::dtype_name(DType::U8), "u8");
}

TEST(Tensor, ViewKeepsBufferAndChecksNumel) {
  std::vector<float> buf(12);
  Tensor t(buf.data(), DType::F32, {3, 4});
  Tensor v = t.view({2, 2, 3});
  EXPECT_EQ(v.data, t.data);
  EXPECT_EQ(v.ndim, 3);
  EXPECT_EQ(v.shape_str(), "[2, 2, 3]");
  EXPECT_EQ(v.dtype, DType::F32);
  EXPECT_THROW(t.view({5, 2}), std::invalid_argument);
}

TEST(Tensor, RowsOffsetsByRowSize) {
  std::vector<int32_t> buf(2 * 3 * 5);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<int32_t>(i);
  Tensor t(buf.data(), DType::I32, {5, 2, 3});
  Tensor r = t.rows(2, 3);
  EXPECT_EQ(r.shape_str(), "[3, 2, 3]");
  EXPECT_EQ(r.i32()[0], 12);
  EXPECT_EQ(r.i32()[r.numel() - 1], 29);
  EXPECT_EQ(t.rows(5, 0).numel(), 0);
  EXPECT_THROW(t.rows(4, 2), std::out_of_range);
  EXPECT_THROW(t.rows(-1, 1), std::out_of_range);
  EXPECT_EQ(t.shape[0], 5);  // the original is untouched
}
