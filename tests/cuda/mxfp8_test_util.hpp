#pragma once
// Device buffers for MXFP8 copies in the CUDA tests: empty (poisoned, so unwritten bytes show) or uploaded
// from a host copy made by the CPU twin.
#include <cstdint>
#include <vector>

#include "cuda_test_util.hpp"
#include "mxtrain/mxfp8.hpp"

namespace mxt::testing {

struct DeviceMx {
  Ops* ops;
  mxfp8::MxView v;
  DeviceMx(Ops& o, int64_t batch, int64_t rows, int64_t cols, mxfp8::Format f, mxfp8::Direction d) : ops(&o) {
    mxfp8::check_shape(batch, rows, cols, d, "DeviceMx");
    v.batch = batch;
    v.rows = rows;
    v.cols = cols;
    v.format = f;
    v.dir = d;
    v.device = Device::CUDA;
    v.data = static_cast<uint8_t*>(o.alloc(static_cast<size_t>(v.data_bytes())));
    v.scales = static_cast<uint8_t*>(o.alloc(static_cast<size_t>(v.scale_bytes())));
    fill(std::vector<uint8_t>(static_cast<size_t>(v.data_bytes()), 0xA5),
         std::vector<uint8_t>(static_cast<size_t>(v.scale_bytes()), 0x5A));
  }
  DeviceMx(Ops& o, const mxfp8::MxHost& h) : DeviceMx(o, h.batch, h.rows, h.cols, h.format, h.dir) {
    fill(h.data, h.scales);
  }
  DeviceMx(const DeviceMx&) = delete;
  DeviceMx& operator=(const DeviceMx&) = delete;
  ~DeviceMx() {
    ops->release(v.data);
    ops->release(v.scales);
  }
  void fill(const std::vector<uint8_t>& data, const std::vector<uint8_t>& scales) {
    if (!data.empty()) ops->upload(v.data, data.data(), data.size());
    if (!scales.empty()) ops->upload(v.scales, scales.data(), scales.size());
  }
  std::vector<uint8_t> data() const {
    std::vector<uint8_t> h(static_cast<size_t>(v.data_bytes()));
    if (!h.empty()) ops->download(h.data(), v.data, h.size());
    return h;
  }
  std::vector<uint8_t> scales() const {
    std::vector<uint8_t> h(static_cast<size_t>(v.scale_bytes()));
    if (!h.empty()) ops->download(h.data(), v.scales, h.size());
    return h;
  }
};

}  // namespace mxt::testing
