// CUDA MXFP8 quantiser against its CPU twin: byte-for-byte equal data and scales on random tensors (values
// spread over many binades, with NaN, +-Inf, -0, subnormals, zero blocks and values at 448 mixed in), for bf16
// and fp32 input, both directions, several shapes (rows not a multiple of 32 for rowwise-only copies, columns
// not a multiple of 32 for columnwise-only ones, partial 128-column tiles, batches, unaligned input). Plus the
// hardware-cvt probe over all 2^32 fp32 inputs, which pins down the one step the GPU does differently.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "mxfp8_cuda.hpp"
#include "mxfp8_test_util.hpp"
#include "mxtrain/mxfp8.hpp"

namespace mxt::testing {
namespace {

using mxfp8::Direction;
using mxfp8::Format;
using mxfp8::MxHost;
using mxfp8::MxView;

CudaOps& cuda_of(Ops& o) { return dynamic_cast<CudaOps&>(o); }

// fp32 values spread over +-20 binades with specials (NaN, +-Inf, -0, 448 and just above, fp32 subnormals,
// huge values) sprinkled in, and a few all-zero rows.
std::vector<float> nasty_values(int64_t n, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::uniform_real_distribution<float> ex(-20.f, 20.f);
  std::uniform_int_distribution<int> pick(0, 3000);  // ~11% of blocks hold a special
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), -0.0f, 448.0f, 449.0f, -57344.0f,
                            3.0e38f, 1e-38f, 1e-40f, 7e-44f};
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int p = pick(rng);
    if (p < 11) {
      x[i] = specials[p];
    } else {
      x[i] = d(rng) * std::exp2(ex(rng));
    }
  }
  for (int64_t i = 0; i < n; ++i)
    if ((i / cols) % 37 == 5) x[i] = 0.0f;  // some all-zero rows (zero blocks both ways)
  return x;
}

struct Case {
  int64_t batch, rows, cols;
  bool row, col;
  Format rf, cf;
  DType dtype;
  bool misalign;  // input pointer offset by one element: the scalar load path
};

std::string name(const Case& c) {
  return "[" + std::to_string(c.batch) + ", " + std::to_string(c.rows) + ", " + std::to_string(c.cols) + "] " +
         dtype_name(c.dtype) + (c.row ? std::string(" rowwise ") + mxfp8::format_name(c.rf) : "") +
         (c.col ? std::string(" columnwise ") + mxfp8::format_name(c.cf) : "") + (c.misalign ? " misaligned" : "");
}

void run_case(Ops& gpu, const Case& c, uint32_t seed) {
  SCOPED_TRACE(name(c));
  const int64_t n = c.batch * c.rows * c.cols;
  std::vector<float> xf = nasty_values(n, c.cols, seed);
  std::vector<uint16_t> xb(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    xb[i] = f32_to_bf16_bits(xf[i]);
    if (c.dtype == DType::BF16) xf[i] = bf16_bits_to_f32(xb[i]);
  }
  // CPU twin.
  MxHost hr, hc;
  MxView hrv, hcv;
  if (c.row) {
    hr = MxHost(c.batch, c.rows, c.cols, c.rf, Direction::Rowwise);
    hrv = hr.view();
  }
  if (c.col) {
    hc = MxHost(c.batch, c.rows, c.cols, c.cf, Direction::Columnwise);
    hcv = hc.view();
  }
  if (c.dtype == DType::BF16) {
    mxfp8::quantize_bf16(xb.data(), c.batch, c.rows, c.cols, c.row ? &hrv : nullptr, c.col ? &hcv : nullptr);
  } else {
    mxfp8::quantize(xf.data(), c.batch, c.rows, c.cols, c.row ? &hrv : nullptr, c.col ? &hcv : nullptr);
  }
  // Device input, optionally one element past a 16-byte boundary.
  const size_t esz = dtype_size(c.dtype), off = c.misalign ? esz : 0;
  void* raw = gpu.alloc(static_cast<size_t>(n) * esz + off);
  if (c.dtype == DType::BF16) {
    gpu.upload(static_cast<char*>(raw) + off, xb.data(), xb.size() * 2);
  } else {
    gpu.upload(static_cast<char*>(raw) + off, xf.data(), xf.size() * 4);
  }
  const Tensor x(static_cast<char*>(raw) + off, c.dtype, {c.batch, c.rows, c.cols}, Device::CUDA);
  std::unique_ptr<DeviceMx> dr, dc;
  if (c.row) dr = std::make_unique<DeviceMx>(gpu, c.batch, c.rows, c.cols, c.rf, Direction::Rowwise);
  if (c.col) dc = std::make_unique<DeviceMx>(gpu, c.batch, c.rows, c.cols, c.cf, Direction::Columnwise);
  mxfp8::quantize_cuda(cuda_of(gpu), x, dr ? &dr->v : nullptr, dc ? &dc->v : nullptr);
  gpu.synchronize();
  gpu.release(raw);
  auto first_diff = [](const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) -> int64_t {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i)
      if (a[i] != b[i]) return static_cast<int64_t>(i);
    return a.size() == b.size() ? -1 : static_cast<int64_t>(std::min(a.size(), b.size()));
  };
  if (c.row) {
    const auto d = dr->data(), s = dr->scales();
    EXPECT_EQ(first_diff(s, hr.scales), -1) << "rowwise scales differ";
    EXPECT_EQ(first_diff(d, hr.data), -1) << "rowwise data differ";
  }
  if (c.col) {
    const auto d = dc->data(), s = dc->scales();
    EXPECT_EQ(first_diff(s, hc.scales), -1) << "columnwise scales differ";
    EXPECT_EQ(first_diff(d, hc.data), -1) << "columnwise data differ";
  }
}

TEST(CudaMxfp8, HardwareCvtMatchesEncodeOnAllFp32Inputs) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  for (Format f : {Format::E4M3, Format::E5M2}) {
    std::vector<uint32_t> first;
    const int64_t bad = mxfp8::cvt_probe_cuda(cuda_of(*gpu), f, &first);
    std::string list;
    for (uint32_t b : first) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), " 0x%08x(%g)", b, mxfp8::bits_f32(b));
      list += buf;
    }
    EXPECT_EQ(bad, 0) << mxfp8::format_name(f) << ": hardware cvt and mxfp8::encode differ on" << list;
  }
}

TEST(CudaMxfp8, QuantizerBitExactWithCpuTwin) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const Format E4 = Format::E4M3, E5 = Format::E5M2;
  const Case cases[] = {
      {1, 256, 512, true, true, E4, E4, DType::BF16, false},
      {1, 100, 96, true, false, E4, E4, DType::BF16, false},   // rows not a multiple of 32 (rowwise only)
      {1, 7, 32, true, false, E5, E4, DType::BF16, false},
      {1, 96, 203, false, true, E4, E4, DType::BF16, false},   // cols not a multiple of 32 or 8 (columnwise only)
      {1, 96, 200, false, true, E5, E5, DType::BF16, false},
      {3, 64, 160, true, true, E4, E5, DType::BF16, false},    // batch, partial 128-column tile, mixed formats
      {2, 1024, 1056, true, true, E4, E4, DType::BF16, false},
      {1, 64, 96, true, true, E4, E4, DType::BF16, true},      // misaligned input: scalar loads
      {1, 64, 96, true, true, E4, E4, DType::F32, false},
      {1, 33, 64, true, false, E5, E4, DType::F32, false},
      {1, 64, 98, false, true, E4, E4, DType::F32, false},     // fp32, cols % 4 != 0: scalar loads
      {2, 160, 224, true, true, E5, E4, DType::F32, true},
  };
  uint32_t seed = 100;
  for (const Case& c : cases) run_case(*gpu, c, seed++);
}

// The dequantiser (fp8_config.hopper_gemm=bf16) against mxfp8::dequantize rounded to bf16, bit for bit (NaN blocks
// as NaN), on the nasty values' copies: both directions and formats, batches, columns not a multiple of 32 for
// columnwise copies, the columnwise copy transposed back to the logical layout.
TEST(CudaMxfp8, DequantizerBitExactWithCpuTwin) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  struct D {
    int64_t batch, rows, cols;
    Direction dir;
    Format f;
  };
  const D cases[] = {{1, 64, 256, Direction::Rowwise, Format::E4M3},    {1, 7, 96, Direction::Rowwise, Format::E5M2},
                     {3, 96, 64, Direction::Rowwise, Format::E4M3},     {1, 256, 160, Direction::Columnwise, Format::E4M3},
                     {1, 96, 203, Direction::Columnwise, Format::E5M2}, {2, 64, 40, Direction::Columnwise, Format::E4M3},
                     {1, 1024, 1056, Direction::Columnwise, Format::E4M3}, {1, 32, 3, Direction::Columnwise, Format::E4M3},
                     {2, 96, 68, Direction::Columnwise, Format::E5M2}};  // rows not a multiple of the 64-row tile
  uint32_t seed = 300;
  int64_t nan_total = 0;
  for (const D& c : cases) {
    SCOPED_TRACE("[" + std::to_string(c.batch) + ", " + std::to_string(c.rows) + ", " + std::to_string(c.cols) + "] " +
                 mxfp8::direction_name(c.dir) + " " + mxfp8::format_name(c.f));
    const int64_t n = c.batch * c.rows * c.cols;
    const std::vector<float> x = nasty_values(n, c.cols, seed++);
    MxHost h(c.batch, c.rows, c.cols, c.f, c.dir);
    const MxView hv = h.view();
    mxfp8::quantize(x.data(), c.batch, c.rows, c.cols, c.dir == Direction::Rowwise ? &hv : nullptr,
                    c.dir == Direction::Columnwise ? &hv : nullptr);
    const std::vector<float> want = mxfp8::dequantize(hv);
    DeviceMx d(*gpu, h);
    DeviceTensor out(*gpu, DType::BF16, {c.batch, c.rows, c.cols});
    gpu->mx_dequantize(d.v, out.t);
    std::vector<uint16_t> got(static_cast<size_t>(n));
    gpu->download(got.data(), out.t.data, got.size() * 2);
    int64_t bad = 0, nan_blocks = 0, first = -1;
    for (int64_t i = 0; i < n; ++i) {
      const float g = bf16_bits_to_f32(got[i]);
      if (std::isnan(want[i])) {
        nan_blocks += std::isnan(g);
        if (!std::isnan(g) && first < 0) first = i;
        bad += !std::isnan(g);
      } else if (got[i] != f32_to_bf16_bits(want[i])) {
        if (first < 0) first = i;
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0) << "first at " << first << ": got " << (first >= 0 ? bf16_bits_to_f32(got[first]) : 0.f)
                      << ", want " << (first >= 0 ? want[first] : 0.f);
    nan_total += nan_blocks;
  }
  EXPECT_GT(nan_total, 0);  // the specials reached the check
}

// mx_quantize_values (the rowwise copy straight to its bf16 values, codes never written; hopper_gemm=bf16): the
// values bit for bit the GPU's own quantise-then-dequantise (NaN bits included) and the CPU twin's dequantised
// rowwise copy rounded to bf16; the columnwise codes from the same pass bit for bit the CPU's.
TEST(CudaMxfp8, QuantizeValuesBitExactWithQuantizeThenDequantize) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  struct V {
    int64_t batch, rows, cols;
    Format rf;
    bool col;
    DType dtype;
  };
  const V cases[] = {{1, 64, 256, Format::E4M3, true, DType::BF16},  {1, 7, 96, Format::E5M2, false, DType::BF16},
                     {2, 96, 160, Format::E4M3, true, DType::F32},  {1, 224, 4096, Format::E5M2, true, DType::BF16},
                     {1, 32, 32, Format::E4M3, true, DType::BF16},  {1, 70, 64, Format::E4M3, false, DType::F32}};
  uint32_t seed = 700;
  int64_t nan_total = 0;
  for (const V& c : cases) {
    SCOPED_TRACE("[" + std::to_string(c.batch) + ", " + std::to_string(c.rows) + ", " + std::to_string(c.cols) + "] " +
                 dtype_name(c.dtype) + " rowwise " + mxfp8::format_name(c.rf) + (c.col ? " + columnwise E4M3" : ""));
    const int64_t n = c.batch * c.rows * c.cols;
    std::vector<float> x = nasty_values(n, c.cols, seed++);
    if (c.dtype == DType::BF16) round_bf16(x);
    auto X = upload(*gpu, x, c.dtype, {c.batch, c.rows, c.cols});
    // CPU twin: both copies, the rowwise one dequantised.
    MxHost hr(c.batch, c.rows, c.cols, c.rf, Direction::Rowwise), hc;
    const MxView hrv = hr.view();
    MxView hcv;
    if (c.col) {
      hc = MxHost(c.batch, c.rows, c.cols, Format::E4M3, Direction::Columnwise);
      hcv = hc.view();
    }
    mxfp8::quantize(x.data(), c.batch, c.rows, c.cols, &hrv, c.col ? &hcv : nullptr);
    const std::vector<float> want = mxfp8::dequantize(hrv);
    // GPU: values (+ columnwise codes) in one pass; and the two-step path it replaces.
    DeviceTensor vals(*gpu, DType::BF16, {c.batch, c.rows, c.cols}), two(*gpu, DType::BF16, {c.batch, c.rows, c.cols});
    std::unique_ptr<DeviceMx> dc;
    if (c.col) dc = std::make_unique<DeviceMx>(*gpu, c.batch, c.rows, c.cols, Format::E4M3, Direction::Columnwise);
    gpu->mx_quantize_values(X, c.rf, vals.t, dc ? &dc->v : nullptr);
    DeviceMx dr(*gpu, c.batch, c.rows, c.cols, c.rf, Direction::Rowwise);
    gpu->mx_quantize(X, &dr.v, nullptr);
    gpu->mx_dequantize(dr.v, two.t);
    std::vector<uint16_t> got(static_cast<size_t>(n)), ref(static_cast<size_t>(n));
    gpu->download(got.data(), vals.t.data, got.size() * 2);
    gpu->download(ref.data(), two.t.data, ref.size() * 2);
    int64_t bad_two = 0, bad_cpu = 0, nans = 0;
    for (int64_t i = 0; i < n; ++i) {
      bad_two += got[i] != ref[i];
      const float g = bf16_bits_to_f32(got[i]);
      if (std::isnan(want[i])) {
        nans += std::isnan(g);
        bad_cpu += !std::isnan(g);
      } else {
        bad_cpu += got[i] != f32_to_bf16_bits(want[i]);
      }
    }
    EXPECT_EQ(bad_two, 0) << "values differ from quantise + dequantise on the GPU";
    EXPECT_EQ(bad_cpu, 0) << "values differ from the CPU twin";
    if (c.col) {
      EXPECT_TRUE(dc->data() == hc.data) << "columnwise codes differ";
      EXPECT_TRUE(dc->scales() == hc.scales) << "columnwise scales differ";
    }
    nan_total += nans;
  }
  EXPECT_GT(nan_total, 0);  // NaN blocks reached the check
}

TEST(CudaMxfp8, QuantizerRejectsBadShapesAndViews) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  DeviceTensor x(*gpu, DType::BF16, {100, 64});
  DeviceMx row(*gpu, 1, 100, 64, Format::E4M3, Direction::Rowwise);
  MxView col = row.v;
  col.dir = Direction::Columnwise;  // 100 rows cannot be blocked by 32
  auto msg = [&](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "<nothing thrown>";
  };
  EXPECT_NO_THROW(mxfp8::quantize_cuda(cuda_of(*gpu), x, &row.v, nullptr));
  std::string m = msg([&] { mxfp8::quantize_cuda(cuda_of(*gpu), x, nullptr, &col); });
  EXPECT_NE(m.find("rows (100)"), std::string::npos) << m;
  EXPECT_NE(m.find("multiple of 32"), std::string::npos) << m;
  MxView host_view = row.v;
  host_view.device = Device::CPU;
  m = msg([&] { mxfp8::quantize_cuda(cuda_of(*gpu), x, &host_view, nullptr); });
  EXPECT_NE(m.find("not a CUDA view"), std::string::npos) << m;
  DeviceTensor xi(*gpu, DType::I32, {100, 64});
  m = msg([&] { mxfp8::quantize_cuda(cuda_of(*gpu), xi, &row.v, nullptr); });
  EXPECT_NE(m.find("BF16 or F32"), std::string::npos) << m;
  gpu->synchronize();
}

}  // namespace
}  // namespace mxt::testing
