// MXFP8 CPU twin: FP8 encode/decode against a brute-force nearest-value oracle, the E8M0 scale rule against
// an independent ceil(log2) oracle, quantiser edge cases (zero, huge, 448 and above, denormals, NaN, Inf, -0),
// dequantisation error bounds, layouts, and the fp64 GEMM references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "mxtrain/mxfp8.hpp"
#include "thrown_message.hpp"

namespace mxt::mxfp8 {
namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::string thrown(const std::function<void()>& f) { return mxt::testing::thrown_message<std::invalid_argument>(f); }

// The nearest finite FP8 value to x by search over all codes (ties to the even code), saturating above max:
// an oracle independent of encode's bit arithmetic. Returns the positive code; the caller adds the sign.
uint8_t nearest_code(float x, Format f) {
  const double a = std::fabs(static_cast<double>(x));
  if (a >= format_max(f)) return format_max_code(f);
  uint8_t best = 0;
  double best_d = a;
  for (int c = 1; c <= format_max_code(f); ++c) {
    const double d = std::fabs(static_cast<double>(decode(static_cast<uint8_t>(c), f)) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_d = d;
    }
  }
  return best;
}

// Scale oracle: the smallest power of two >= t = fl(amax * fl(1/max)), as a biased exponent clamped to
// [0, 254] (2^-127 is the smallest E8M0; nothing above 2^127 is finite).
uint8_t scale_oracle(float amax, Format f) {
  const float t = amax * format_inv_max(f);
  if (t == 0) return 0;
  int ex;
  const double m = std::frexp(static_cast<double>(t), &ex);  // t = m 2^ex, m in [0.5, 1)
  int k = m == 0.5 ? ex - 1 : ex;                              // ceil(log2 t)
  return static_cast<uint8_t>(std::clamp(k + 127, 0, 254));
}

struct Quantised {
  MxHost row, col;
};
Quantised quantise_both(const std::vector<float>& x, int64_t batch, int64_t rows, int64_t cols, Format f) {
  Quantised q{MxHost(batch, rows, cols, f, Direction::Rowwise), MxHost(batch, rows, cols, f, Direction::Columnwise)};
  MxView rv = q.row.view(), cv = q.col.view();
  quantize(x.data(), batch, rows, cols, &rv, &cv);
  return q;
}
MxHost quantise_rows(const std::vector<float>& x, int64_t rows, int64_t cols, Format f) {
  MxHost q(1, rows, cols, f, Direction::Rowwise);
  MxView v = q.view();
  quantize(x.data(), 1, rows, cols, &v, nullptr);
  return q;
}

// ---- FP8 values -------------------------------------------------------------------------------------------

TEST(Mxfp8Format, KnownCodes) {
  EXPECT_EQ(encode(1.0f, Format::E4M3), 0x38);
  EXPECT_EQ(encode(448.0f, Format::E4M3), 0x7E);
  EXPECT_EQ(encode(-448.0f, Format::E4M3), 0xFE);
  EXPECT_EQ(encode(std::ldexp(1.0f, -6), Format::E4M3), 0x08);  // smallest normal
  EXPECT_EQ(encode(std::ldexp(1.0f, -9), Format::E4M3), 0x01);  // smallest subnormal
  EXPECT_EQ(encode(0.0f, Format::E4M3), 0x00);
  EXPECT_EQ(encode(-0.0f, Format::E4M3), 0x80);
  EXPECT_EQ(encode(kNaN, Format::E4M3), kNaNCode);
  EXPECT_EQ(encode(1.0f, Format::E5M2), 0x3C);
  EXPECT_EQ(encode(57344.0f, Format::E5M2), 0x7B);
  EXPECT_EQ(encode(std::ldexp(1.0f, -16), Format::E5M2), 0x01);
  EXPECT_EQ(encode(std::ldexp(1.0f, -14), Format::E5M2), 0x04);
  EXPECT_EQ(decode(0x7E, Format::E4M3), 448.0f);
  EXPECT_EQ(decode(0x01, Format::E4M3), std::ldexp(1.0f, -9));
  EXPECT_EQ(decode(0x07, Format::E4M3), 7 * std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(decode(0x7F, Format::E4M3)));
  EXPECT_TRUE(std::isnan(decode(0xFF, Format::E4M3)));
  EXPECT_EQ(decode(0x7C, Format::E5M2), kInf);
  EXPECT_EQ(decode(0xFC, Format::E5M2), -kInf);
  EXPECT_TRUE(std::isnan(decode(0x7D, Format::E5M2)));
  EXPECT_TRUE(std::signbit(decode(0x80, Format::E4M3)));
  EXPECT_EQ(decode(0x80, Format::E4M3), 0.0f);
}

TEST(Mxfp8Format, EveryCodeRoundTrips) {
  for (Format f : {Format::E4M3, Format::E5M2}) {
    int finite = 0;
    for (int c = 0; c < 256; ++c) {
      const uint8_t code = static_cast<uint8_t>(c);
      const float v = decode(code, f);
      if (std::isnan(v) || std::isinf(v)) continue;
      ++finite;
      EXPECT_EQ(encode(v, f), code) << format_name(f) << " code " << c << " value " << v;
    }
    EXPECT_EQ(finite, f == Format::E4M3 ? 254 : 248) << format_name(f);
  }
}

// Midpoints between neighbouring codes go to the even code; a hair either side goes to the nearer one.
TEST(Mxfp8Format, RoundToNearestEvenAtEveryMidpoint) {
  for (Format f : {Format::E4M3, Format::E5M2}) {
    for (int c = 0; c < format_max_code(f); ++c) {
      const float lo = decode(static_cast<uint8_t>(c), f), hi = decode(static_cast<uint8_t>(c + 1), f);
      const float mid = (lo + hi) / 2;  // exact in fp32
      const uint8_t even = static_cast<uint8_t>((c & 1) ? c + 1 : c);
      EXPECT_EQ(encode(mid, f), even) << format_name(f) << " between codes " << c << " and " << c + 1;
      EXPECT_EQ(encode(-mid, f), even | 0x80);
      EXPECT_EQ(encode(std::nextafter(mid, 0.0f), f), c);
      EXPECT_EQ(encode(std::nextafter(mid, kInf), f), c + 1);
    }
  }
}

TEST(Mxfp8Format, SaturatesAtAndAboveMax) {
  for (float v : {448.0f, std::nextafter(448.0f, kInf), 449.0f, 463.99f, 464.0f, 465.0f, 480.0f, 1e6f, 3e38f, kInf})
    EXPECT_EQ(encode(v, Format::E4M3), 0x7E) << v;
  EXPECT_EQ(encode(-kInf, Format::E4M3), 0xFE);
  EXPECT_EQ(encode(std::nextafter(448.0f, 0.0f), Format::E4M3), 0x7E);
  EXPECT_EQ(encode(431.9f, Format::E4M3), 0x7D);  // below the 416/448 midpoint
  EXPECT_EQ(encode(432.0f, Format::E4M3), 0x7E);  // the midpoint: to even (448)
  for (float v : {57344.0f, 61439.0f, 61440.0f, 65536.0f, 1e10f, kInf}) EXPECT_EQ(encode(v, Format::E5M2), 0x7B) << v;
  EXPECT_EQ(encode(-kInf, Format::E5M2), 0xFB);
}

// The subnormal range and the underflow threshold, both formats.
TEST(Mxfp8Format, Subnormals) {
  const float s = std::ldexp(1.0f, -9);  // E4M3 smallest subnormal
  EXPECT_EQ(encode(s / 2, Format::E4M3), 0x00);                    // tie -> even (0)
  EXPECT_EQ(encode(std::nextafter(s / 2, 1.0f), Format::E4M3), 0x01);
  EXPECT_EQ(encode(-s / 2, Format::E4M3), 0x80);                   // negative underflow keeps its sign
  EXPECT_EQ(encode(1.5f * s, Format::E4M3), 0x02);                 // tie between 1 and 2 -> 2
  EXPECT_EQ(encode(2.5f * s, Format::E4M3), 0x02);                 // tie between 2 and 3 -> 2
  EXPECT_EQ(encode(7.5f * s, Format::E4M3), 0x08);                 // largest subnormal + half -> smallest normal
  EXPECT_EQ(encode(1e-40f, Format::E4M3), 0x00);                   // an fp32 subnormal
  const float s5 = std::ldexp(1.0f, -16);
  EXPECT_EQ(encode(s5 / 2, Format::E5M2), 0x00);
  EXPECT_EQ(encode(1.5f * s5, Format::E5M2), 0x02);
  EXPECT_EQ(encode(3.5f * s5, Format::E5M2), 0x04);
}

// encode against the brute-force oracle on values spread log-uniformly over (and beyond) each format's range.
TEST(Mxfp8Format, EncodeMatchesNearestValueOracle) {
  std::mt19937 rng(11);
  for (Format f : {Format::E4M3, Format::E5M2}) {
    const double lo = f == Format::E4M3 ? -12 : -19, hi = f == Format::E4M3 ? 10 : 17;
    std::uniform_real_distribution<double> ex(lo, hi);
    for (int i = 0; i < 200000; ++i) {
      float x = static_cast<float>(std::exp2(ex(rng)));
      if (i & 1) x = -x;
      const uint8_t want = static_cast<uint8_t>(nearest_code(x, f) | (std::signbit(x) ? 0x80 : 0));
      ASSERT_EQ(encode(x, f), want) << format_name(f) << " x=" << x;
    }
  }
}

// ---- the scale rule ---------------------------------------------------------------------------------------

TEST(Mxfp8Scale, SpecialCases) {
  for (Format f : {Format::E4M3, Format::E5M2}) {
    EXPECT_EQ(scale_from_amax_bits(0, f), 0x00);
    EXPECT_EQ(scale_from_amax_bits(abs_bits(kNaN), f), 0xFF);
    EXPECT_EQ(scale_from_amax_bits(abs_bits(-kNaN), f), 0xFF);
    EXPECT_EQ(scale_from_amax_bits(abs_bits(kInf), f), 0xFE);
    EXPECT_EQ(scale_from_amax_bits(abs_bits(std::numeric_limits<float>::max()), f),
              scale_oracle(std::numeric_limits<float>::max(), f));
  }
  EXPECT_EQ(scale_from_amax_bits(abs_bits(448.0f), Format::E4M3), 127);  // 448 * fl(1/448) rounds to 1
  EXPECT_EQ(scale_from_amax_bits(abs_bits(std::nextafter(448.0f, kInf)), Format::E4M3), 128);
  EXPECT_EQ(scale_from_amax_bits(abs_bits(896.0f), Format::E4M3), 128);
  EXPECT_EQ(scale_from_amax_bits(abs_bits(1.0f), Format::E4M3), 127 - 8);  // 1/448 in (2^-9, 2^-8]
  EXPECT_EQ(scale_from_amax_bits(abs_bits(57344.0f), Format::E5M2), 127);
  // t exactly 2^-127 keeps e = 0; t just above it rounds up to e = 1 (the subnormal branch of the rule).
  EXPECT_EQ(scale_from_amax_bits(0x00400000u, Format::E4M3), scale_oracle(scale_value(0), Format::E4M3));
  const float amax_e1 = 3e-36f;  // t = 3e-36 / 448 in (2^-127, 2^-126)
  EXPECT_EQ(scale_from_amax_bits(abs_bits(amax_e1), Format::E4M3), 1);
  EXPECT_EQ(scale_from_amax_bits(abs_bits(1e-40f), Format::E4M3), 0);  // fp32 subnormal amax
}

TEST(Mxfp8Scale, MatchesCeilLog2OracleEverywhere) {
  std::mt19937 rng(12);
  std::uniform_int_distribution<uint32_t> bits(1, 0x7F7FFFFFu);  // every positive finite fp32
  for (Format f : {Format::E4M3, Format::E5M2}) {
    for (int i = 0; i < 300000; ++i) {
      const uint32_t b = i < 1000 ? (static_cast<uint32_t>(i % 254 + 1) << 23) : bits(rng);  // powers of two too
      const float amax = bits_f32(b);
      ASSERT_EQ(scale_from_amax_bits(b, f), scale_oracle(amax, f)) << format_name(f) << " amax=" << amax;
      // The scaled block max never exceeds the format max by more than the fp32 reciprocal's rounding.
      const uint8_t e = scale_from_amax_bits(b, f);
      if (e > 0 && e < 0xFE) {
        ASSERT_LE(static_cast<double>(amax) / std::ldexp(1.0, e - 127), format_max(f) * (1 + 1e-6));
      }
    }
  }
  for (int k = -100; k <= 100; ++k) {  // amax = 448 * 2^k lands exactly on 2^k
    EXPECT_EQ(scale_from_amax_bits(abs_bits(std::ldexp(448.0f, k)), Format::E4M3), 127 + k) << k;
    EXPECT_EQ(scale_from_amax_bits(abs_bits(std::ldexp(57344.0f, k)), Format::E5M2), 127 + k) << k;
  }
}

TEST(Mxfp8Scale, ValuesAndMultipliers) {
  EXPECT_EQ(scale_value(127), 1.0f);
  EXPECT_EQ(scale_value(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(scale_value(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(scale_value(255)));
  for (int e = 0; e < 255; ++e) {
    EXPECT_EQ(quant_multiplier(static_cast<uint8_t>(e)), std::ldexp(1.0f, 127 - e)) << e;
  }
}

// ---- quantiser edge cases ---------------------------------------------------------------------------------

// One row of 64: block 0 under test, block 1 ordinary values (exact in both formats) that must be unaffected.
float block1_value(int j) { return 0.5f * static_cast<float>(j % 8 - 4); }
struct TwoBlocks {
  std::vector<float> x = std::vector<float>(64);
  TwoBlocks() {
    for (int j = 0; j < 32; ++j) x[32 + j] = block1_value(j);
  }
  MxHost q(Format f = Format::E4M3) const { return quantise_rows(x, 1, 64, f); }
};
void expect_block1_untouched(const MxHost& q) {
  EXPECT_EQ(q.scales[1], scale_oracle(2.0f, q.format));  // amax of block1_value is 2
  for (int j = 0; j < 32; ++j) EXPECT_EQ(dequantize_at(q.view(), 0, 0, 32 + j), block1_value(j));
}

TEST(Mxfp8Quantize, AllZeroBlock) {
  TwoBlocks t;
  const MxHost q = t.q();
  EXPECT_EQ(q.scales[0], 0x00);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q.data[j], 0x00);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(dequantize_at(q.view(), 0, 0, j), 0.0f);
  expect_block1_untouched(q);
}

TEST(Mxfp8Quantize, NegativeZero) {
  TwoBlocks t;
  for (int j = 0; j < 32; ++j) t.x[j] = -0.0f;
  MxHost q = t.q();
  EXPECT_EQ(q.scales[0], 0x00);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(q.data[j], 0x80);
    EXPECT_TRUE(std::signbit(dequantize_at(q.view(), 0, 0, j)));
  }
  // A tiny negative value in a block with amax 1 underflows to -0.
  t.x[0] = 1.0f;
  t.x[1] = -1e-30f;
  q = t.q();
  EXPECT_EQ(q.data[1], 0x80);
  EXPECT_TRUE(std::signbit(dequantize_at(q.view(), 0, 0, 1)));
}

TEST(Mxfp8Quantize, OneHugeValue) {
  TwoBlocks t;
  for (int j = 0; j < 32; ++j) t.x[j] = 0.01f * static_cast<float>(j);
  t.x[5] = 1e30f;
  const MxHost q = t.q();
  const uint8_t e = scale_oracle(1e30f, Format::E4M3);
  ASSERT_EQ(q.scales[0], e);
  const float deq = dequantize_at(q.view(), 0, 0, 5);
  EXPECT_LE(std::fabs(deq - 1e30f), 1e30f / 16);  // no overflow, within the E4M3 bound
  EXPECT_NE(q.data[5], 0x7E) << "the scale is rounded up, so the huge value needs no saturation here";
  for (int j = 0; j < 32; ++j)
    if (j != 5) {
      EXPECT_EQ(dequantize_at(q.view(), 0, 0, j), 0.0f) << j;  // far below the block's resolution
    }
  expect_block1_untouched(q);
}

TEST(Mxfp8Quantize, At448AndJustAbove) {
  TwoBlocks t;
  t.x[0] = 448.0f;
  t.x[1] = -448.0f;
  t.x[2] = 1.0f;
  MxHost q = t.q();
  EXPECT_EQ(q.scales[0], 127);
  EXPECT_EQ(q.data[0], 0x7E);
  EXPECT_EQ(q.data[1], 0xFE);
  EXPECT_EQ(dequantize_at(q.view(), 0, 0, 0), 448.0f);
  EXPECT_EQ(dequantize_at(q.view(), 0, 0, 2), 1.0f);
  // Just above 448 the scale doubles (RCEIL), so nothing saturates and 448 itself stays exact.
  for (float above : {std::nextafter(448.0f, kInf), 449.0f, 464.0f, 480.0f}) {
    t.x[0] = above;
    q = t.q();
    EXPECT_EQ(q.scales[0], 128) << above;
    EXPECT_EQ(dequantize_at(q.view(), 0, 0, 1), -448.0f) << above;
    EXPECT_LE(std::fabs(dequantize_at(q.view(), 0, 0, 0) - above), above / 16) << above;
  }
  expect_block1_untouched(q);
}

TEST(Mxfp8Quantize, Fp32Denormals) {
  TwoBlocks t;
  // A block of fp32 subnormals: amax == tiny, t underflows to (near) zero, scale 2^-127, multiplier 2^127.
  for (int j = 0; j < 32; ++j) t.x[j] = static_cast<float>(j + 1) * 1e-41f;
  MxHost q = t.q();
  EXPECT_EQ(q.scales[0], 0x00);
  for (int j = 0; j < 32; ++j) {
    const float x = t.x[j], d = dequantize_at(q.view(), 0, 0, j);
    EXPECT_GT(d, 0.0f) << "subnormal inputs must not flush to zero: " << x;
    EXPECT_LE(std::fabs(d - x), std::fabs(x) / 16 + std::ldexp(1.0f, -137)) << x;
  }
  // A block whose scale comes from the subnormal-t branch (t in (2^-127, 2^-126) -> e = 1).
  for (int j = 0; j < 32; ++j) t.x[j] = 3e-36f * static_cast<float>(j) / 31;
  q = t.q();
  EXPECT_EQ(q.scales[0], 1);
  EXPECT_LE(std::fabs(dequantize_at(q.view(), 0, 0, 31) - 3e-36f), 3e-36f / 16);
  expect_block1_untouched(q);
}

TEST(Mxfp8Quantize, E4m3Subnormals) {
  TwoBlocks t;
  const float s = std::ldexp(1.0f, -9);
  t.x[0] = 448.0f;  // scale 1: values go to FP8 unchanged
  const float in[] = {s, 1.5f * s, s / 2, 1.25f * s, 7.5f * s, -s, 7 * s, s / 4};
  const uint8_t want[] = {0x01, 0x02, 0x00, 0x01, 0x08, 0x81, 0x07, 0x00};
  for (int i = 0; i < 8; ++i) t.x[1 + i] = in[i];
  const MxHost q = t.q();
  ASSERT_EQ(q.scales[0], 127);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(q.data[1 + i], want[i]) << in[i];
    EXPECT_EQ(dequantize_at(q.view(), 0, 0, 1 + i), decode(want[i], Format::E4M3));
  }
}

TEST(Mxfp8Quantize, NaNPoisonsItsBlocksInBothDirections) {
  std::vector<float> x(64 * 64);
  std::mt19937 rng(3);
  std::normal_distribution<float> d;
  for (auto& v : x) v = d(rng);
  x[40 * 64 + 7] = kNaN;  // row 40, col 7: row block (40, 0), column block (rows 32..63, col 7)
  const Quantised q = quantise_both(x, 1, 64, 64, Format::E4M3);
  const MxView rv = q.row.view(), cv = q.col.view();
  EXPECT_EQ(q.row.scales[rv.scale_index(0, 40, 0)], 0xFF);
  EXPECT_EQ(q.col.scales[cv.scale_index(0, 32, 7)], 0xFF);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(q.row.data[rv.data_index(0, 40, j)], kNaNCode);
    EXPECT_TRUE(std::isnan(dequantize_at(rv, 0, 40, j)));
    EXPECT_EQ(q.col.data[cv.data_index(0, 32 + j, 7)], kNaNCode);
    EXPECT_TRUE(std::isnan(dequantize_at(cv, 0, 32 + j, 7)));
  }
  int nan_row = 0, nan_col = 0;
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 64; ++c) {
      nan_row += std::isnan(dequantize_at(rv, 0, r, c));
      nan_col += std::isnan(dequantize_at(cv, 0, r, c));
    }
  EXPECT_EQ(nan_row, 32);  // only the one block in each direction
  EXPECT_EQ(nan_col, 32);
}

TEST(Mxfp8Quantize, InfSaturatesAndDequantisesToInf) {
  for (Format f : {Format::E4M3, Format::E5M2}) {
    TwoBlocks t;
    t.x[0] = kInf;
    t.x[1] = -kInf;
    t.x[2] = 1.0f;
    t.x[3] = 3e38f;
    const MxHost q = t.q(f);
    EXPECT_EQ(q.scales[0], 0xFE);
    EXPECT_EQ(q.data[0], format_max_code(f));
    EXPECT_EQ(q.data[1], 0x80 | format_max_code(f));
    EXPECT_EQ(dequantize_at(q.view(), 0, 0, 0), kInf);
    EXPECT_EQ(dequantize_at(q.view(), 0, 0, 1), -kInf);
    EXPECT_EQ(dequantize_at(q.view(), 0, 0, 2), 0.0f);  // 1 * 2^-127 is far below FP8's range
    EXPECT_LE(std::fabs(dequantize_at(q.view(), 0, 0, 3) - 3e38f), 3e38f / 8);  // huge finite values survive
    expect_block1_untouched(q);
  }
}

TEST(Mxfp8Quantize, RejectsPartialBlocksWithAClearError) {
  std::vector<float> x(40 * 48, 1.0f);
  MxHost dummy(1, 32, 32, Format::E4M3, Direction::Rowwise);
  std::string msg = thrown([&] { MxHost(1, 40, 48, Format::E4M3, Direction::Rowwise); });
  EXPECT_NE(msg.find("cols (48)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("multiple of 32"), std::string::npos) << msg;
  msg = thrown([&] { MxHost(1, 40, 64, Format::E4M3, Direction::Columnwise); });
  EXPECT_NE(msg.find("rows (40)"), std::string::npos) << msg;
  // The free dim may be anything.
  EXPECT_NO_THROW(MxHost(1, 40, 64, Format::E4M3, Direction::Rowwise));
  EXPECT_NO_THROW(MxHost(1, 64, 40, Format::E4M3, Direction::Columnwise));
  // A view of the wrong shape or direction.
  MxView v = dummy.view();
  msg = thrown([&] { quantize(x.data(), 1, 40, 48, &v, nullptr); });
  EXPECT_NE(msg.find("shape"), std::string::npos) << msg;
  msg = thrown([&] { quantize(x.data(), 1, 32, 32, nullptr, &v); });
  EXPECT_NE(msg.find("direction"), std::string::npos) << msg;
  msg = thrown([&] { quantize(x.data(), 1, 32, 32, nullptr, nullptr); });
  EXPECT_NE(msg.find("no output"), std::string::npos) << msg;
  EXPECT_EQ(thrown([] { gradient_format("E5M2"); }),
            "fp8_config.fp8_format: expected E4M3 or HYBRID, got 'E5M2'");
  EXPECT_EQ(gradient_format("HYBRID"), Format::E5M2);
  EXPECT_EQ(forward_format("HYBRID"), Format::E4M3);
  EXPECT_EQ(gradient_format("E4M3"), Format::E4M3);
}

// ---- layouts ----------------------------------------------------------------------------------------------

// The columnwise copy of x is, byte for byte, the rowwise copy of x^T (per batch entry); a free dim that is
// not a multiple of 32 works in either direction.
TEST(Mxfp8Quantize, ColumnwiseIsRowwiseOfTranspose) {
  const int64_t B = 2, R = 64, C = 96;
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.f, 3.f);
  std::vector<float> x(B * R * C), xt(B * R * C);
  for (auto& v : x) v = d(rng) * std::exp2(static_cast<float>(rng() % 20) - 10.f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) xt[(b * C + c) * R + r] = x[(b * R + r) * C + c];
  for (Format f : {Format::E4M3, Format::E5M2}) {
    const Quantised q = quantise_both(x, B, R, C, f);
    MxHost rt(B, C, R, f, Direction::Rowwise);
    MxView rtv = rt.view();
    quantize(xt.data(), B, C, R, &rtv, nullptr);
    EXPECT_EQ(q.col.data, rt.data);
    EXPECT_EQ(q.col.scales, rt.scales);
    // One read for both copies gives the same bytes as two separate calls.
    MxHost r1(B, R, C, f, Direction::Rowwise), c1(B, R, C, f, Direction::Columnwise);
    MxView r1v = r1.view(), c1v = c1.view();
    quantize(x.data(), B, R, C, &r1v, nullptr);
    quantize(x.data(), B, R, C, nullptr, &c1v);
    EXPECT_EQ(q.row.data, r1.data);
    EXPECT_EQ(q.row.scales, r1.scales);
    EXPECT_EQ(q.col.data, c1.data);
    EXPECT_EQ(q.col.scales, c1.scales);
  }
  // Rowwise with 40 rows, columnwise with 40 cols.
  std::vector<float> y(40 * 64);
  for (auto& v : y) v = d(rng);
  const MxHost qr = quantise_rows(y, 40, 64, Format::E4M3);
  MxHost qc(1, 64, 40, Format::E4M3, Direction::Columnwise);
  MxView qcv = qc.view();
  quantize(y.data(), 1, 64, 40, nullptr, &qcv);  // y seen as [64, 40]
  const std::vector<float> dr = dequantize(qr.view()), dc = dequantize(qcv);
  ASSERT_EQ(dr.size(), y.size());
  ASSERT_EQ(dc.size(), y.size());
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_LE(std::fabs(dr[i] - y[i]), 0.5f) << i;
    ASSERT_LE(std::fabs(dc[i] - y[i]), 0.5f) << i;
  }
}

TEST(Mxfp8Quantize, Bf16InputMatchesWidenedFp32) {
  const int64_t R = 64, C = 64;
  std::mt19937 rng(6);
  std::normal_distribution<float> d;
  std::vector<uint16_t> xb(R * C);
  std::vector<float> xf(R * C);
  for (int64_t i = 0; i < R * C; ++i) {
    xb[i] = static_cast<uint16_t>(f32_bits(d(rng)) >> 16);
    xf[i] = bits_f32(static_cast<uint32_t>(xb[i]) << 16);
  }
  xb[17] = 0x7FC0;  // NaN
  xf[17] = kNaN;
  const Quantised want = quantise_both(xf, 1, R, C, Format::E4M3);
  MxHost r(1, R, C, Format::E4M3, Direction::Rowwise), c(1, R, C, Format::E4M3, Direction::Columnwise);
  MxView rv = r.view(), cv = c.view();
  quantize_bf16(xb.data(), 1, R, C, &rv, &cv);
  EXPECT_EQ(r.data, want.row.data);
  EXPECT_EQ(r.scales, want.row.scales);
  EXPECT_EQ(c.data, want.col.data);
  EXPECT_EQ(c.scales, want.col.scales);
}

// ---- dequantisation error bounds --------------------------------------------------------------------------
// For a block with amax A and scale s = 2^(e-127), x/s lies in (max/2, max] at the top (s is the smallest power
// of two >= A/max), so the top binade of x/s is [256, 512) or [128, 256) for E4M3. Round-to-nearest errs by at
// most half an ulp there: 16 s when A/s >= 256 (so <= 16 A/256 = 2^-4 A) and 8 s when A/s in (224, 256)
// (< 8 A/224 < 2^-4 A). So |deq - x| <= 2^-4 A for E4M3; for E5M2 (2 mantissa bits, max 57344) the same
// argument gives 2^-3 A. Per element: the relative half-ulp 2^-(mant+1) |x| in the normal range, plus half the
// smallest subnormal, 2^-10 s (E4M3) or 2^-17 s (E5M2), below it.

struct BoundStats {
  double worst_block = 0, worst_elem = 0;  // error / bound, worst over all
};

BoundStats check_bounds(const std::vector<float>& x, const MxHost& q) {
  const MxView v = q.view();
  const int mant = q.format == Format::E4M3 ? 3 : 2;
  const double rel = std::ldexp(1.0, -(mant + 1));
  const double sub = std::ldexp(1.0, q.format == Format::E4M3 ? -10 : -17);
  BoundStats st;
  const int64_t R = v.op_rows(), K = v.op_k();
  for (int64_t i = 0; i < R; ++i)
    for (int64_t kb = 0; kb < K; kb += kBlock) {
      double amax = 0, err_max = 0;
      const double s = scale_value(q.scales[v.scale_index(0, v.dir == Direction::Rowwise ? i : kb,
                                                          v.dir == Direction::Rowwise ? kb : i)]);
      for (int64_t k = kb; k < kb + kBlock; ++k) {
        const int64_t r = v.dir == Direction::Rowwise ? i : k, c = v.dir == Direction::Rowwise ? k : i;
        const double xv = x[r * v.cols + c], d = dequantize_at(v, 0, r, c);
        const double err = std::fabs(d - xv);
        amax = std::max(amax, std::fabs(xv));
        err_max = std::max(err_max, err);
        const double eb = rel * std::fabs(xv) + sub * s;
        EXPECT_LE(err, eb) << "element (" << r << ", " << c << ") x=" << xv << " deq=" << d;
        st.worst_elem = std::max(st.worst_elem, err / eb);
      }
      if (amax > 0) {
        const double bb = 2 * rel * amax;
        EXPECT_LE(err_max, bb) << "block " << i << "/" << kb;
        st.worst_block = std::max(st.worst_block, err_max / bb);
      }
    }
  return st;
}

TEST(Mxfp8Quantize, DequantisationErrorBounds) {
  const int64_t R = 128, C = 256;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uni(-1.f, 1.f), ex(-30.f, 30.f);
  for (int dist = 0; dist < 3; ++dist) {
    std::vector<float> x(R * C);
    for (auto& v : x) {
      if (dist == 0) v = normal(rng);
      if (dist == 1) v = uni(rng) * std::exp2(ex(rng));  // values spread over 60 binades: subnormal FP8 use
      if (dist == 2) v = normal(rng) * 1e-3f * (rng() % 64 == 0 ? 1000.f : 1.f);  // outliers
    }
    for (Format f : {Format::E4M3, Format::E5M2}) {
      const Quantised q = quantise_both(x, 1, R, C, f);
      for (const MxHost* h : {&q.row, &q.col}) {
        const BoundStats st = check_bounds(x, *h);
        // The bounds are not vacuous: some element comes close to the per-element bound.
        EXPECT_GT(st.worst_elem, 0.8) << "distribution " << dist << " " << format_name(f);
        EXPECT_GT(st.worst_block, 0.3) << "distribution " << dist << " " << format_name(f);
      }
      // The scale is the smallest that avoids overflow: every normal block's largest element lands in the top
      // binade of the format, (max/2, max].
      for (const MxHost* h : {&q.row, &q.col}) {
        const MxView v = h->view();
        for (int64_t i = 0; i < v.op_rows(); ++i)
          for (int64_t kb = 0; kb < v.op_k(); kb += kBlock) {
            float top = 0;
            for (int64_t k = kb; k < kb + kBlock; ++k)
              top = std::max(top, std::fabs(decode(h->data[i * v.op_k() + k], f)));
            EXPECT_GT(top, format_max(f) / 2 * 0.99f);
            EXPECT_LE(top, format_max(f));
          }
      }
    }
  }
}

// ---- GEMM references --------------------------------------------------------------------------------------

std::vector<float> random_matrix(int64_t n, uint32_t seed, float spread_binades) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::uniform_real_distribution<float> ex(-spread_binades, spread_binades);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng) * std::exp2(ex(rng));
  return x;
}

// Independent fp64 product of dequantised logical matrices, summed in reverse order; the reference must agree
// to within fp64 rounding: |diff| <= 2 K eps sum|a b|.
void expect_fp64_equal(double got, double want, double abs_sum, int64_t K, const char* what, int64_t i) {
  const double tol = 2.0 * static_cast<double>(K) * std::numeric_limits<double>::epsilon() * abs_sum;
  ASSERT_LE(std::fabs(got - want), tol) << what << " element " << i << ": " << got << " vs " << want;
}

TEST(Mxfp8GemmRef, PlainGemmMatchesFp64OfDequantised) {
  const int64_t M = 48, N = 40, K = 96;  // M, N free; K a multiple of 32
  const std::vector<float> a = random_matrix(M * K, 21, 4.f), b = random_matrix(N * K, 22, 4.f);
  const MxHost qa = quantise_rows(a, M, K, Format::E4M3), qb = quantise_rows(b, N, K, Format::E5M2);
  const std::vector<double> c = gemm_ref(qa.view(), 0, qb.view(), 0);
  const std::vector<float> da = dequantize(qa.view()), db = dequantize(qb.view());
  double num = 0, den = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, abs_sum = 0, exact = 0;
      for (int64_t k = K - 1; k >= 0; --k) {
        s += double(da[m * K + k]) * db[n * K + k];
        abs_sum += std::fabs(double(da[m * K + k]) * db[n * K + k]);
        exact += double(a[m * K + k]) * b[n * K + k];
      }
      expect_fp64_equal(c[m * N + n], s, abs_sum, K, "gemm_ref", m * N + n);
      num += (c[m * N + n] - exact) * (c[m * N + n] - exact);
      den += exact * exact;
    }
  // And it is an MXFP8 approximation of the unquantised product (E4M3 x E5M2: a few percent).
  EXPECT_LT(std::sqrt(num / den), 0.08);
  std::printf("gemm_ref relative L2 error vs the unquantised product: %.4f\n", std::sqrt(num / den));
  EXPECT_GT(std::sqrt(num / den), 1e-4) << "quantisation should show";
}

// The three expert GEMMs with mxfp8.md's operand copies, grouped over uneven and empty experts.
TEST(Mxfp8GemmRef, GroupedForwardDgradWgradWithUnevenAndEmptyExperts) {
  const int64_t T = 160, in = 64, out = 96, E = 4;
  const std::vector<int32_t> off = {0, 70, 70, 101, 150};  // expert 1 empty; rows 150..159 are padding
  const std::vector<float> x = random_matrix(T * in, 31, 2.f), w = random_matrix(E * out * in, 32, 2.f),
                           dy = random_matrix(T * out, 33, 2.f);
  const Quantised qx = quantise_both(x, 1, T, in, Format::E4M3);
  const Quantised qw = quantise_both(w, E, out, in, Format::E4M3);
  const Quantised qdy = quantise_both(dy, 1, T, out, Format::E5M2);  // HYBRID gradients
  auto deq = [](const MxHost& h) { return dequantize(h.view()); };

  // forward y = x W_e^T: x rowwise, W rowwise.
  {
    const std::vector<double> y = grouped_gemm_ref(qx.row.view(), qw.row.view(), off);
    const std::vector<float> dx = deq(qx.row), dw = deq(qw.row);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t t = off[e]; t < off[e + 1]; ++t)
        for (int64_t o = 0; o < out; ++o) {
          double s = 0, as = 0;
          for (int64_t i = in - 1; i >= 0; --i) {
            const double p = double(dx[t * in + i]) * dw[(e * out + o) * in + i];
            s += p;
            as += std::fabs(p);
          }
          expect_fp64_equal(y[t * out + o], s, as, in, "forward", t * out + o);
        }
    for (int64_t t = off[E]; t < T; ++t)
      for (int64_t o = 0; o < out; ++o) ASSERT_EQ(y[t * out + o], 0.0);
  }
  // dgrad dx = dy W_e: dy rowwise (blocks along out), W columnwise (blocks along out).
  {
    const std::vector<double> g = grouped_gemm_ref(qdy.row.view(), qw.col.view(), off);
    const std::vector<float> ddy = deq(qdy.row), dw = deq(qw.col);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t t = off[e]; t < off[e + 1]; ++t)
        for (int64_t i = 0; i < in; ++i) {
          double s = 0, as = 0;
          for (int64_t o = out - 1; o >= 0; --o) {
            const double p = double(ddy[t * out + o]) * dw[(e * out + o) * in + i];
            s += p;
            as += std::fabs(p);
          }
          expect_fp64_equal(g[t * in + i], s, as, out, "dgrad", t * in + i);
        }
  }
  // wgrad dW_e = dy_e^T x_e: dy and x columnwise (blocks along tokens); ragged groups are fine here.
  {
    const std::vector<double> g = grouped_gemm_wgrad_ref(qdy.col.view(), qx.col.view(), off);
    ASSERT_EQ(g.size(), static_cast<size_t>(E * out * in));
    const std::vector<float> ddy = deq(qdy.col), dx = deq(qx.col);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
          double s = 0, as = 0;
          for (int64_t t = off[e + 1] - 1; t >= off[e]; --t) {
            const double p = double(ddy[t * out + o]) * dx[t * in + i];
            s += p;
            as += std::fabs(p);
          }
          expect_fp64_equal(g[(e * out + o) * in + i], s, as, T, "wgrad", (e * out + o) * in + i);
          if (e == 1) {
            ASSERT_EQ(g[(e * out + o) * in + i], 0.0);
          }
        }
  }
  EXPECT_NE(thrown([&] { grouped_gemm_ref(qx.row.view(), qw.row.view(), {0, 1, 2}); }).find("offsets"),
            std::string::npos);
  EXPECT_NE(thrown([&] { grouped_gemm_ref(qx.row.view(), qw.col.view(), off); }).find("contraction"),
            std::string::npos);
}

// cuBLASLt's scale tiles (mxfp8.md): positions worked out by hand from the layout's description, for a scale
// matrix with C = 8 (two 4-column tiles per 128-row band).
TEST(Mxfp8ScaleTiles, KnownPositions) {
  const int64_t C = 8;
  struct Case { int64_t r, c, at; };
  for (const Case& k : {Case{0, 0, 0}, Case{0, 1, 1}, Case{0, 3, 3}, Case{0, 4, 512}, Case{1, 0, 16},
                        Case{31, 0, 496}, Case{32, 0, 4}, Case{64, 2, 10}, Case{127, 3, 511}, Case{128, 0, 1024},
                        Case{130, 5, 1569}, Case{255, 7, 2047}})
    EXPECT_EQ(tiled_scale_offset(k.r, k.c, C), k.at) << "r " << k.r << " c " << k.c;
  EXPECT_EQ(tiled_scale_bytes(1, 1), 512);
  EXPECT_EQ(tiled_scale_bytes(128, 4), 512);
  EXPECT_EQ(tiled_scale_bytes(129, 5), 2048);
  EXPECT_EQ(tiled_scale_bytes(4096, 128), 4096 * 128);
}

// Every scale of ragged shapes lands in its own byte of the padded tiles, the padding is zero, and reading the
// tiles back through the offsets gives every batch entry's scales.
TEST(Mxfp8ScaleTiles, TileScalesIsABijectionWithZeroPadding) {
  std::mt19937 rng(7);
  for (const auto& [batch, rows, C] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {2, 200, 6}, {3, 128, 4},
                                       {1, 300, 130}}) {
    std::vector<uint8_t> s(static_cast<size_t>(batch * rows * C));
    for (uint8_t& v : s) v = static_cast<uint8_t>(1 + rng() % 254);  // never 0, so padding is told apart
    const int64_t tiled = tiled_scale_bytes(rows, C);
    std::vector<uint8_t> out(static_cast<size_t>(batch * tiled), 0xAB);
    tile_scales(s.data(), batch, rows, C, out.data());
    std::vector<int> hits(static_cast<size_t>(tiled), 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t at = tiled_scale_offset(r, c, C);
        ASSERT_GE(at, 0);
        ASSERT_LT(at, tiled);
        ++hits[static_cast<size_t>(at)];
        for (int64_t b = 0; b < batch; ++b)
          ASSERT_EQ(out[static_cast<size_t>(b * tiled + at)], s[static_cast<size_t>((b * rows + r) * C + c)]);
      }
    for (int64_t i = 0; i < tiled; ++i) {
      ASSERT_LE(hits[static_cast<size_t>(i)], 1) << "offset " << i << " taken twice";
      if (hits[static_cast<size_t>(i)] == 0)
        for (int64_t b = 0; b < batch; ++b) ASSERT_EQ(out[static_cast<size_t>(b * tiled + i)], 0) << "padding " << i;
    }
  }
}

}  // namespace
}  // namespace mxt::mxfp8
