// Comm over MPI on host buffers, and the one-rank Comm. MPI's default error handler (errors are fatal)
// stays: an MPI error aborts the job, which is what a failed collective must do.
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "dist/dist_internal.hpp"
#include "dist/watchdog.hpp"

namespace mxt {

CommType comm_type(DType t) {
  switch (t) {
    case DType::F32: return CommType::F32;
    case DType::BF16: return CommType::BF16;
    case DType::I32: return CommType::I32;
    case DType::U8: return CommType::U8;
    case DType::I16: break;  // (master remainders never travel)
  }
  throw std::invalid_argument(std::string("comm_type: no comm type for ") + dtype_name(t));
}

size_t comm_type_size(CommType t) {
  switch (t) {
    case CommType::F32: return 4;
    case CommType::BF16: return 2;
    case CommType::I32: return 4;
    case CommType::U8: return 1;
    case CommType::F64: return 8;
  }
  return 0;
}

std::string group_name(const char* kind, const std::vector<int>& world_ranks) {
  std::string list;
  for (size_t i = 0; i < world_ranks.size(); ++i) list += (i ? "," : "") + std::to_string(world_ranks[i]);
  return fmt::format("{} group (world ranks {})", kind, list);
}

namespace {

MPI_Datatype mpi_type(CommType t) {
  switch (t) {
    case CommType::F32: return MPI_FLOAT;
    case CommType::BF16: return MPI_UINT16_T;  // moved, never summed on the host
    case CommType::I32: return MPI_INT32_T;
    case CommType::U8: return MPI_UINT8_T;
    case CommType::F64: return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

int to_int(int64_t v, const char* op, const std::string& group) {
  if (v < 0 || v > INT_MAX)
    throw std::runtime_error(fmt::format("{} on the {}: count {} outside MPI's int range [0, {}]", op, group, v,
                                         INT_MAX));
  return static_cast<int>(v);
}

class MpiComm final : public Comm {
 public:
  MpiComm(MPI_Comm comm, std::string name, std::shared_ptr<Watchdog> wd)
      : comm_(comm), name_(std::move(name)), wd_(std::move(wd)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL && comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::CPU; }
  const std::string& name() const override { return name_; }

  void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_displs, void* recv,
                    const int64_t* recv_counts, const int64_t* recv_displs, int64_t row_elems,
                    CommType type) override {
    const char* op = "all_to_all_v";
    std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
    for (int p = 0; p < size_; ++p) {
      sc[p] = to_int(send_counts[p], op, name_);
      sd[p] = to_int(send_displs[p], op, name_);
      rc[p] = to_int(recv_counts[p], op, name_);
      rd[p] = to_int(recv_displs[p], op, name_);
    }
    // One row is one element of a contiguous type, so counts stay in int range for long rows.
    MPI_Datatype row;
    MPI_Type_contiguous(to_int(row_elems, op, name_), mpi_type(type), &row);
    MPI_Type_commit(&row);
    {
      auto g = watch(op);
      MPI_Alltoallv(send, sc.data(), sd.data(), row, recv, rc.data(), rd.data(), row, comm_);
    }
    MPI_Type_free(&row);
  }

  void all_reduce_sum(void* buf, int64_t count, CommType type) override {
    const char* op = "all_reduce_sum";
    check_summable(type, op);
    auto g = watch(op);
    const size_t es = comm_type_size(type);
    for (int64_t done = 0; done < count;) {  // chunks keep each call's count in int range
      const int64_t n = std::min<int64_t>(count - done, INT_MAX);
      MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(buf) + done * es, static_cast<int>(n), mpi_type(type),
                    MPI_SUM, comm_);
      done += n;
    }
  }

  void reduce_scatter_sum(const void* send, void* recv, int64_t count, CommType type) override {
    const char* op = "reduce_scatter_sum";
    check_summable(type, op);
    const int n = to_int(count, op, name_);
    const size_t es = comm_type_size(type);
    char* mine = static_cast<char*>(const_cast<void*>(send)) + static_cast<size_t>(rank_) * count * es;
    auto g = watch(op);
    if (recv == mine) {
      // MPI's in-place form leaves the result at the start of the buffer; move it to this rank's slot.
      char* buf = static_cast<char*>(const_cast<void*>(send));
      MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, n, mpi_type(type), MPI_SUM, comm_);
      if (rank_ != 0) std::memmove(mine, buf, static_cast<size_t>(count) * es);
    } else {
      MPI_Reduce_scatter_block(send, recv, n, mpi_type(type), MPI_SUM, comm_);
    }
  }

  void all_gather(const void* send, void* recv, int64_t count, CommType type) override {
    const char* op = "all_gather";
    const int n = to_int(count, op, name_);
    const char* mine = static_cast<const char*>(recv) + static_cast<size_t>(rank_) * count * comm_type_size(type);
    auto g = watch(op);
    if (send == mine)
      MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, mpi_type(type), comm_);
    else
      MPI_Allgather(send, n, mpi_type(type), recv, n, mpi_type(type), comm_);
  }

  void broadcast(void* buf, int64_t count, CommType type, int root) override {
    auto g = watch("broadcast");
    MPI_Bcast(buf, to_int(count, "broadcast", name_), mpi_type(type), root, comm_);
  }

  void reduce_spans(const std::vector<ReduceSpan>& spans, CommType type, bool) override {
    const char* op = "reduce_spans";
    check_summable(type, op);
    auto g = watch(op);
    for (const ReduceSpan& s : spans) {
      const int n = to_int(s.count, op, name_);
      if (rank_ == s.root)
        MPI_Reduce(MPI_IN_PLACE, s.buf, n, mpi_type(type), MPI_SUM, s.root, comm_);
      else
        MPI_Reduce(s.buf, nullptr, n, mpi_type(type), MPI_SUM, s.root, comm_);
    }
  }

  void barrier() override {
    auto g = watch("barrier");
    MPI_Barrier(comm_);
  }

 private:
  Watchdog::Scope watch(const char* op) {
    if (!wd_) return Watchdog::Scope(nullptr, 0);
    return wd_->guard(fmt::format("MPI {} on the {} (rank {} of {})", op, name_, rank_, size_));
  }
  void check_summable(CommType t, const char* op) const {
    if (t == CommType::BF16 || t == CommType::U8)
      throw std::invalid_argument(fmt::format("{} on the {}: MPI cannot sum bf16/u8 elements", op, name_));
  }

  MPI_Comm comm_;
  std::string name_;
  std::shared_ptr<Watchdog> wd_;
  int rank_ = 0, size_ = 1;
};

// One rank: every collective is the identity. Host buffers are copied when not in place; device buffers
// must be in place (nothing calls a one-rank device collective out of place: the model and trainer skip
// groups of one).
class SelfComm final : public Comm {
 public:
  SelfComm(Device device, std::string name) : device_(device), name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Device device() const override { return device_; }
  const std::string& name() const override { return name_; }

  void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_displs, void* recv,
                    const int64_t* recv_counts, const int64_t* recv_displs, int64_t row_elems,
                    CommType type) override {
    if (send_counts[0] != recv_counts[0])
      throw std::invalid_argument(fmt::format("all_to_all_v on the {}: sends {} rows to itself but receives {}",
                                              name_, send_counts[0], recv_counts[0]));
    const size_t row = static_cast<size_t>(row_elems) * comm_type_size(type);
    copy(static_cast<char*>(recv) + recv_displs[0] * row, static_cast<const char*>(send) + send_displs[0] * row,
         send_counts[0] * row, "all_to_all_v");
  }
  void all_reduce_sum(void*, int64_t, CommType) override {}
  void reduce_scatter_sum(const void* send, void* recv, int64_t count, CommType type) override {
    copy(recv, send, count * comm_type_size(type), "reduce_scatter_sum");
  }
  void all_gather(const void* send, void* recv, int64_t count, CommType type) override {
    copy(recv, send, count * comm_type_size(type), "all_gather");
  }
  void broadcast(void*, int64_t, CommType, int root) override {
    if (root != 0) throw std::invalid_argument(fmt::format("broadcast on the {}: root {} of 1 rank", name_, root));
  }
  void reduce_spans(const std::vector<ReduceSpan>& spans, CommType, bool) override {
    for (const ReduceSpan& s : spans)
      if (s.root != 0) throw std::invalid_argument(fmt::format("reduce_spans on the {}: root {} of 1 rank", name_, s.root));
  }
  void barrier() override {}

 private:
  void copy(void* dst, const void* src, size_t bytes, const char* op) const {
    if (dst == src || bytes == 0) return;
    if (device_ != Device::CPU)
      throw std::logic_error(fmt::format("{} on the {}: a one-rank device collective must be in place", op, name_));
    std::memmove(dst, src, bytes);
  }
  Device device_;
  std::string name_;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(MPI_Comm comm, std::string name, std::shared_ptr<Watchdog> watchdog) {
  return std::make_unique<MpiComm>(comm, std::move(name), std::move(watchdog));
}

std::unique_ptr<Comm> make_self_comm(Device device, std::string name) {
  return std::make_unique<SelfComm>(device, std::move(name));
}

}  // namespace mxt
