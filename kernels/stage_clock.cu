// MXTRAIN_STAGE_TIMING=1: the CUDA stage clock (mxtrain/trace.hpp). Events on the backend's stream around every
// scope; sums are folded when the stream has passed them, so timing adds no synchronisation of its own beyond a
// bounded backlog.
#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cuda_common.cuh"
#include "mxtrain/trace.hpp"
#include "stage_clock.hpp"

namespace mxt {
namespace {

class CudaStageClock final : public StageClock {
 public:
  explicit CudaStageClock(cudaStream_t s) : stream_(s) {}
  ~CudaStageClock() override {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
    for (auto& d : done_) {
      cudaEventDestroy(d.begin);
      cudaEventDestroy(d.end);
    }
    for (auto& o : open_) cudaEventDestroy(o.second);
  }
  void begin(const char* name) override {
    cudaEvent_t e = take();
    cuda::check(cudaEventRecord(e, stream_), "stage clock", "cudaEventRecord");
    open_.emplace_back(name, e);
  }
  void end() override {
    if (open_.empty()) return;
    cudaEvent_t e = take();
    cuda::check(cudaEventRecord(e, stream_), "stage clock", "cudaEventRecord");
    done_.push_back({stage_kind(open_.back().first.c_str()), open_.back().second, e});
    open_.pop_back();
    if (done_.size() >= 8192) fold();
  }
  void reset() override {
    fold();
    sums_.clear();
  }
  void log(const std::string& who, int steps) override {
    fold();
    std::vector<std::pair<std::string, std::pair<double, long>>> rows(sums_.begin(), sums_.end());
    std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.first > b.second.first; });
    std::string out = "stage times (GPU, compute stream), " + who + ", over " + std::to_string(steps) + " steps:";
    for (auto& [name, v] : rows) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "\n  %-34s %10.1f ms total %9.2f ms/step  x%ld", name.c_str(), v.first,
                    steps > 0 ? v.first / steps : 0.0, v.second);
      out += buf;
    }
    std::printf("%s\n", out.c_str());  // every rank prints its own (non-zero ranks log warnings only)
    std::fflush(stdout);
  }

 private:
  struct Done {
    std::string name;
    cudaEvent_t begin, end;
  };
  cudaEvent_t take() {
    if (!pool_.empty()) {
      cudaEvent_t e = pool_.back();
      pool_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    cuda::check(cudaEventCreate(&e), "stage clock", "cudaEventCreate");
    return e;
  }
  void fold() {
    if (done_.empty()) return;
    cuda::check(cudaEventSynchronize(done_.back().end), "stage clock", "cudaEventSynchronize");
    for (auto& d : done_) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, d.begin, d.end) == cudaSuccess) {
        auto& s = sums_[d.name];
        s.first += ms;
        s.second += 1;
      }
      pool_.push_back(d.begin);
      pool_.push_back(d.end);
    }
    done_.clear();
  }

  cudaStream_t stream_;
  std::vector<std::pair<std::string, cudaEvent_t>> open_;
  std::vector<Done> done_;
  std::vector<cudaEvent_t> pool_;
  std::map<std::string, std::pair<double, long>> sums_;
};

}  // namespace

std::unique_ptr<StageClock> make_cuda_stage_clock(cudaStream_t stream) {
  return std::make_unique<CudaStageClock>(stream);
}

}  // namespace mxt
