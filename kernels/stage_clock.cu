// MXTRAIN_STAGE_TIMING=1: the CUDA stage clock (mxtrain/trace.hpp). Events on the backend's stream around every
// scope; sums are folded when the stream has passed them, so timing adds no synchronisation of its own beyond a
// bounded backlog. MXTRAIN_STAGE_TIMING=ops: also an event after every marked launch; a launch's time runs from
// the previous marked launch's end to its own, so it includes whatever was enqueued between them (memsets,
// unmarked kernels) and any idle gap while the GPU waited for the host.
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
  CudaStageClock(cudaStream_t s, bool ops) : stream_(s), ops_(ops) {}
  ~CudaStageClock() override {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
    for (auto& m : marks_) cudaEventDestroy(m.second);
    if (prev_mark_) cudaEventDestroy(prev_mark_);
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
  void mark(const char* op) override {
    if (!ops_) return;
    cudaEvent_t e = take();
    cuda::check(cudaEventRecord(e, stream_), "stage clock", "cudaEventRecord");
    marks_.emplace_back((open_.empty() ? std::string("(no stage)") : stage_kind(open_.back().first.c_str())) +
                            " > " + op,
                        e);
    if (marks_.size() >= 8192) fold();
  }
  void reset() override {
    fold();
    sums_.clear();
    op_sums_.clear();
    if (prev_mark_) pool_.push_back(prev_mark_);  // the next launch's time starts at the next step's first one
    prev_mark_ = nullptr;
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
    if (ops_) out += op_table(who, steps);
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
  // The marked launches, longest total first (the first 60 rows).
  std::string op_table(const std::string& who, int steps) const {
    std::vector<std::pair<std::string, std::pair<double, long>>> rows(op_sums_.begin(), op_sums_.end());
    std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.first > b.second.first; });
    double all = 0;
    for (auto& r : rows) all += r.second.first;
    char buf[320];
    std::snprintf(buf, sizeof buf, "\nop times (GPU, compute stream; each from the previous launch's end), %s, over %d "
                  "steps: %.1f ms/step in %zu (stage > op) rows", who.c_str(), steps, steps > 0 ? all / steps : 0.0,
                  rows.size());
    std::string out = buf;
    for (size_t i = 0; i < rows.size() && i < 60; ++i) {
      const auto& [name, v] = rows[i];
      std::snprintf(buf, sizeof buf, "\n  %-80s %9.2f ms/step %8.1f us each  x%ld", name.c_str(),
                    steps > 0 ? v.first / steps : 0.0, v.second ? 1e3 * v.first / v.second : 0.0, v.second);
      out += buf;
    }
    return out;
  }
  void fold() {
    fold_marks();
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
  void fold_marks() {
    if (marks_.empty()) return;
    cuda::check(cudaEventSynchronize(marks_.back().second), "stage clock", "cudaEventSynchronize");
    for (auto& [name, e] : marks_) {
      float ms = 0;
      if (prev_mark_ && cudaEventElapsedTime(&ms, prev_mark_, e) == cudaSuccess) {
        auto& s = op_sums_[name];
        s.first += ms;
        s.second += 1;
      }
      if (prev_mark_) pool_.push_back(prev_mark_);
      prev_mark_ = e;
    }
    marks_.clear();
  }

  cudaStream_t stream_;
  bool ops_;
  std::vector<std::pair<std::string, cudaEvent_t>> marks_;  // (stage > op, the event after its launch)
  cudaEvent_t prev_mark_ = nullptr;                          // the last folded mark: the next one's start
  std::map<std::string, std::pair<double, long>> op_sums_;
  std::vector<std::pair<std::string, cudaEvent_t>> open_;
  std::vector<Done> done_;
  std::vector<cudaEvent_t> pool_;
  std::map<std::string, std::pair<double, long>> sums_;
};

}  // namespace

std::unique_ptr<StageClock> make_cuda_stage_clock(cudaStream_t stream, bool ops) {
  return std::make_unique<CudaStageClock>(stream, ops);
}

}  // namespace mxt
