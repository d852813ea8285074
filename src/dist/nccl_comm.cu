// Comm over NCCL on the CUDA backend's device buffers (CUDA builds only; NCCL itself only with
// MXTRAIN_HAVE_NCCL, which the build defines when it links libnccl).
//
// Streams: each communicator has its own stream. A collective waits (on the GPU, through an event) for what the
// compute stream has enqueued so far, runs on the communicator's stream, and the compute stream waits for it
// in turn: the host never blocks, the model's stream order is kept, and collectives of different groups may
// run concurrently with each other.
// Failures: NCCL call errors throw (main ends every rank with MPI_Abort); asynchronous NCCL errors (a peer's
// connection lost) and collectives that do not complete within parallelism.timeout_s are caught by the
// watchdog thread, which polls ncclCommGetAsyncError and an event recorded after every collective.
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "cuda_context.cuh"
#include "cuda_ops.hpp"
#include "dist/dist_internal.hpp"
#include "dist/watchdog.hpp"

#ifdef MXTRAIN_HAVE_NCCL
#include <nccl.h>
#endif

namespace mxt {

#ifndef MXTRAIN_HAVE_NCCL

std::unique_ptr<Comm> make_nccl_comm(MPI_Comm, Ops&, std::string name, std::shared_ptr<Watchdog>) {
  throw std::runtime_error("multi-GPU training needs NCCL, and this mxtrain was built without it (" + name +
                           "); rebuild with NCCL (libnccl.so under /usr/local/cuda/lib64 or /usr/lib/x86_64-linux-gnu)"
                           ", or train on CPU ranks with backend=cpu");
}

#else

namespace {

void cuda_check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(e));
}

ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::F32: return ncclFloat32;
    case CommType::BF16: return ncclBfloat16;
    case CommType::I32: return ncclInt32;
    case CommType::U8: return ncclUint8;
    case CommType::F64: return ncclFloat64;
  }
  return ncclFloat32;
}

// An event recorded after one collective, owned by the watchdog's poll function (freed when it completes).
struct Event {
  cudaEvent_t e = nullptr;
  Event() { cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(e); }
};

class NcclComm final : public Comm {
 public:
  NcclComm(MPI_Comm mpi, CudaOps& ops, std::string name, std::shared_ptr<Watchdog> wd)
      : name_(std::move(name)), wd_(std::move(wd)), device_(ops.ctx().device), compute_(ops.ctx().stream) {
    MPI_Comm_dup(mpi, &mpi_);
    MPI_Comm_rank(mpi_, &rank_);
    MPI_Comm_size(mpi_, &size_);
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    // NVLink SHARP (multicast) stays off on our GPU machines (docs/device.md); an explicit setting wins.
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    ncclUniqueId id;
    if (rank_ == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    {
      auto g = guard("MPI broadcast of the NCCL unique id");
      MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi_);
    }
    {
      auto g = guard("ncclCommInitRank");
      check(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
    }
    int lo = 0, hi = 0;  // the highest priority, so communication kernels get SMs while compute saturates them
    cuda_check(cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
    cuda_check(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, hi), "cudaStreamCreate");
    cuda_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    if (wd_) {
      ncclComm_t c = comm_;
      const std::string n = name_;
      // Removed in ~NcclComm before the communicator is destroyed.
      health_check_ = wd_->add_health_check([c, n]() -> std::string {
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(c, &st) != ncclSuccess || st == ncclSuccess || st == ncclInProgress) return "";
        return "NCCL error on the " + n + ": " + ncclGetErrorString(st) + " (" + ncclGetLastError(c) +
               "); a peer rank has probably died";
      });
    }
  }

  ~NcclComm() override {
    if (wd_) wd_->remove_health_check(health_check_);
    cudaStreamSynchronize(stream_);
    report_timing();
    if (comm_) ncclCommDestroy(comm_);
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&mpi_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::CUDA; }
  const std::string& name() const override { return name_; }

  void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_displs, void* recv,
                    const int64_t* recv_counts, const int64_t* recv_displs, int64_t row_elems,
                    CommType type) override {
    exchange(send, send_counts, send_displs, recv, recv_counts, recv_displs, row_elems, type, true);
  }
  void start_all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_displs, void* recv,
                          const int64_t* recv_counts, const int64_t* recv_displs, int64_t row_elems,
                          CommType type) override {
    exchange(send, send_counts, send_displs, recv, recv_counts, recv_displs, row_elems, type, false);
  }
  void wait_started() override {
    if (!pending_) return;
    cuda_check(cudaStreamWaitEvent(compute_, done_, 0), name_ + " wait_started: stream wait");
    pending_ = false;
  }

  void exchange_rows(const std::vector<Payload>& parts, const int64_t* send_counts, const int64_t* send_displs,
                    const int64_t* recv_counts, const int64_t* recv_displs, bool start) override {
    exchange(parts.data(), static_cast<int>(parts.size()), send_counts, send_displs, recv_counts, recv_displs, !start);
  }

  void exchange(const void* send, const int64_t* send_counts, const int64_t* send_displs, void* recv,
                const int64_t* recv_counts, const int64_t* recv_displs, int64_t row_elems, CommType type,
                bool join) {
    const Payload part{send, recv, row_elems, type};
    exchange(&part, 1, send_counts, send_displs, recv_counts, recv_displs, join);
  }
  void exchange(const Payload* parts, int n, const int64_t* send_counts, const int64_t* send_displs,
                const int64_t* recv_counts, const int64_t* recv_displs, bool join) {
    run(join ? "all_to_all_v" : "all_to_all_v (overlapped)", join, [&] {
      // This rank's own rows go by a device copy on the compute stream (after `ready`, before the compute stream's
      // wait for the exchange), alongside NCCL's transfer to the peers: +1.1-1.5% tok/s at EP=2 (docs/perf.md).
      // MXTRAIN_NCCL_SELF=nccl sends them through NCCL instead.
      if (self_copy()) {
        for (int i = 0; i < n; ++i) {
          const Payload& x = parts[i];
          const size_t row = static_cast<size_t>(x.row_elems) * comm_type_size(x.type);
          if (send_counts[rank_] > 0)
            cuda_check(cudaMemcpyAsync(static_cast<char*>(x.recv) + recv_displs[rank_] * row,
                                       static_cast<const char*>(x.send) + send_displs[rank_] * row,
                                       static_cast<size_t>(send_counts[rank_]) * row, cudaMemcpyDeviceToDevice,
                                       compute_), name_ + " all_to_all_v: own rows");
        }
      }
      // Point-to-point in one group: NCCL matches the sends and receives of all peers and payloads at once.
      check(ncclGroupStart(), "ncclGroupStart");
      for (int i = 0; i < n; ++i) {
        const Payload& x = parts[i];
        const size_t row = static_cast<size_t>(x.row_elems) * comm_type_size(x.type);
        const auto* s = static_cast<const char*>(x.send);
        auto* r = static_cast<char*>(x.recv);
        for (int p = 0; p < size_; ++p) {
          if (p == rank_ && self_copy()) continue;
          if (send_counts[p] > 0)
            check(ncclSend(s + send_displs[p] * row, static_cast<size_t>(send_counts[p] * x.row_elems),
                           nccl_type(x.type), p, comm_, stream_), "ncclSend");
          if (recv_counts[p] > 0)
            check(ncclRecv(r + recv_displs[p] * row, static_cast<size_t>(recv_counts[p] * x.row_elems),
                           nccl_type(x.type), p, comm_, stream_), "ncclRecv");
        }
      }
      check(ncclGroupEnd(), "ncclGroupEnd");
    });
  }

  static bool self_copy() {
    static const bool v = [] {
      const char* e = std::getenv("MXTRAIN_NCCL_SELF");
      if (e == nullptr || *e == 0 || !std::strcmp(e, "copy")) return true;
      if (!std::strcmp(e, "nccl")) return false;
      throw std::invalid_argument(std::string("MXTRAIN_NCCL_SELF must be copy or nccl, got '") + e + "'");
    }();
    return v;
  }

  void all_reduce_sum(void* buf, int64_t count, CommType type) override {
    run("all_reduce_sum", true, [&] {
      check(ncclAllReduce(buf, buf, static_cast<size_t>(count), nccl_type(type), ncclSum, comm_, stream_),
            "ncclAllReduce");
    });
  }

  void reduce_scatter_sum(const void* send, void* recv, int64_t count, CommType type) override {
    run("reduce_scatter_sum", true, [&] {  // NCCL is in place when recv == send + rank * count, as Comm promises
      check(ncclReduceScatter(send, recv, static_cast<size_t>(count), nccl_type(type), ncclSum, comm_, stream_),
            "ncclReduceScatter");
    });
  }

  void all_gather(const void* send, void* recv, int64_t count, CommType type) override {
    run("all_gather", true, [&] {  // in place when send == recv + rank * count
      check(ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type(type), comm_, stream_), "ncclAllGather");
    });
  }

  void broadcast(void* buf, int64_t count, CommType type, int root) override {
    run("broadcast", true, [&] {
      check(ncclBroadcast(buf, buf, static_cast<size_t>(count), nccl_type(type), root, comm_, stream_),
            "ncclBroadcast");
    });
  }

  void reduce_spans(const std::vector<ReduceSpan>& spans, CommType type, bool start) override {
    run(start ? "reduce_spans (overlapped)" : "reduce_spans", !start, [&] {
      check(ncclGroupStart(), "ncclGroupStart");
      for (const ReduceSpan& s : spans)
        check(ncclReduce(s.buf, s.buf, static_cast<size_t>(s.count), nccl_type(type), ncclSum, s.root, comm_, stream_),
              "ncclReduce");
      check(ncclGroupEnd(), "ncclGroupEnd");
    });
  }

  void barrier() override {
    {
      auto g = guard("stream sync before barrier");
      cuda_check(cudaStreamSynchronize(stream_), "NCCL barrier on the " + name_ + ": stream sync");
    }
    auto g = guard("MPI barrier");
    MPI_Barrier(mpi_);
  }

 private:
  // Orders f's NCCL calls on stream_ after the compute stream's queued work and before its later work.
  // join=false (start_all_to_all_v): the compute stream does not wait; wait_started() or the next joined call does.
  template <class F>
  void run(const char* op, bool join, F&& f) {
    cuda_check(cudaEventRecord(ready_, compute_), name_ + " " + op + ": event record");
    cuda_check(cudaStreamWaitEvent(stream_, ready_, 0), name_ + " " + op + ": stream wait");
    op_ = op;
    if (timing_ && timed_.size() >= 4096) {  // bounded: fold the finished ones (a sync, only when timing)
      cuda_check(cudaStreamSynchronize(stream_), name_ + " timing: stream sync");
      fold_timing();
    }
    Timed* t = timing_ ? &timed_.emplace_back(op) : nullptr;
    if (t) cuda_check(cudaEventRecord(t->begin, stream_), name_ + " " + op + ": event record");
    f();
    if (t) cuda_check(cudaEventRecord(t->end, stream_), name_ + " " + op + ": event record");
    cuda_check(cudaEventRecord(done_, stream_), name_ + " " + op + ": event record");
    if (join) cuda_check(cudaStreamWaitEvent(compute_, done_, 0), name_ + " " + op + ": stream wait");
    pending_ = !join;
    if (wd_ && wd_->timeout_s() > 0) {
      auto ev = std::make_shared<Event>();
      cuda_check(cudaEventRecord(ev->e, stream_), name_ + " " + op + ": event record");
      const int dev = device_;
      wd_->watch(describe(op), [ev, dev] {
        thread_local int current = -1;  // the watchdog thread's device, set once
        if (current != dev) {
          cudaSetDevice(dev);
          current = dev;
        }
        const cudaError_t e = cudaEventQuery(ev->e);
        return e != cudaErrorNotReady;  // errors count as done: they surface on the main thread
      });
    }
  }
  void check(ncclResult_t r, const char* call) const {
    if (r == ncclSuccess) return;
    throw std::runtime_error("NCCL " + std::string(op_ ? op_ : "setup") + " on the " + name_ + ": " + call +
                             " failed: " + ncclGetErrorString(r) + " (" + (comm_ ? ncclGetLastError(comm_) : "") + ")");
  }
  std::string describe(const char* op) const {
    return "NCCL " + std::string(op) + " on the " + name_ + " (rank " + std::to_string(rank_) + " of " +
           std::to_string(size_) + ")";
  }
  Watchdog::Scope guard(const char* op) {
    if (!wd_) return Watchdog::Scope(nullptr, 0);
    return wd_->guard(describe(op));
  }

  // MXTRAIN_COMM_TIMING=1: GPU time of every collective on this communicator's stream, summed per kind and
  // logged when it is destroyed. Collectives wait for the compute stream, so this is the time communication
  // kernels ran, not the time the compute stream waited; the difference is what overlap hides.
  struct Timed {
    const char* op;
    cudaEvent_t begin = nullptr, end = nullptr;
    explicit Timed(const char* o) : op(o) {
      cuda_check(cudaEventCreate(&begin), "cudaEventCreate");
      cuda_check(cudaEventCreate(&end), "cudaEventCreate");
    }
    Timed(Timed&& o) noexcept : op(o.op), begin(std::exchange(o.begin, nullptr)), end(std::exchange(o.end, nullptr)) {}
    Timed(const Timed&) = delete;
    ~Timed() {
      if (begin) cudaEventDestroy(begin);
      if (end) cudaEventDestroy(end);
    }
  };
  void fold_timing() {  // needs the recorded events complete
    for (const Timed& t : timed_) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, t.begin, t.end) == cudaSuccess) timing_ms_[t.op].push_back(ms);
    }
    timed_.clear();
  }
  // The first calls of a kind set up NCCL's connections and are far slower: the median x calls is the
  // steady-state estimate beside the plain total.
  void report_timing() {
    fold_timing();
    for (auto& [op, v] : timing_ms_) {
      if (v.empty()) continue;
      double total = 0;
      for (float x : v) total += x;
      std::vector<float> sorted = v;
      std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
      const double med = sorted[sorted.size() / 2];
      spdlog::info("comm timing, {} rank {}: {} x{} total {:.1f} ms, median {:.3f} ms (x calls {:.1f} ms), "
                   "first {:.1f} ms", name_, rank_, op, v.size(), total, med, med * static_cast<double>(v.size()),
                   v.front());
    }
  }
  const bool timing_ = [] {
    const char* e = std::getenv("MXTRAIN_COMM_TIMING");
    return e != nullptr && std::string(e) == "1";
  }();
  std::deque<Timed> timed_;
  std::map<std::string, std::vector<float>> timing_ms_;  // op -> each call's ms, in call order

  std::string name_;
  std::shared_ptr<Watchdog> wd_;
  int device_;
  cudaStream_t compute_;
  MPI_Comm mpi_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  bool pending_ = false;  // a started exchange the compute stream has not yet been ordered after
  const char* op_ = nullptr;
  uint64_t health_check_ = 0;
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(MPI_Comm comm, Ops& ops, std::string name, std::shared_ptr<Watchdog> watchdog) {
  auto* cuda = dynamic_cast<CudaOps*>(&ops);
  if (cuda == nullptr) throw std::logic_error("make_nccl_comm: the backend is not CUDA (" + name + ")");
  return std::make_unique<NcclComm>(comm, *cuda, std::move(name), std::move(watchdog));
}

#endif  // MXTRAIN_HAVE_NCCL

}  // namespace mxt
