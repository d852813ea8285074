// CkptComm over MPI (host strings only: shard records, outcomes, candidate lists), on a duplicate of
// MPI_COMM_WORLD so checkpoint messages never match the trainer's own.
#include <mpi.h>

#include <stdexcept>

#include "mxtrain/checkpoint.hpp"

namespace mxt {
namespace {

class MpiCkptComm : public CkptComm {
 public:
  MpiCkptComm() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCkptComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override { MPI_Barrier(comm_); }

  std::vector<std::string> gather(const std::string& mine) override {
    int len = static_cast<int>(mine.size());
    std::vector<int> lens(rank_ == 0 ? size_ : 0), displs(lens.size());
    MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm_);
    std::string all;
    if (rank_ == 0) {
      long total = 0;
      for (int r = 0; r < size_; ++r) {
        displs[r] = static_cast<int>(total);
        total += lens[r];
      }
      if (total > INT32_MAX) throw std::runtime_error("checkpoint: gathered shard records exceed 2 GiB");
      all.resize(static_cast<size_t>(total));
    }
    MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, comm_);
    std::vector<std::string> out;
    for (int r = 0; r < static_cast<int>(lens.size()); ++r) out.push_back(all.substr(displs[r], lens[r]));
    return out;
  }

  std::string broadcast(const std::string& from_root) override {
    int len = static_cast<int>(from_root.size());
    MPI_Bcast(&len, 1, MPI_INT, 0, comm_);
    std::string s = rank_ == 0 ? from_root : std::string(static_cast<size_t>(len), '\0');
    MPI_Bcast(s.data(), len, MPI_CHAR, 0, comm_);
    return s;
  }

  bool all_true(bool mine) override {
    int v = mine ? 1 : 0, out = 0;
    MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_LAND, comm_);
    return out != 0;
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<CkptComm> make_mpi_ckpt_comm() { return std::make_unique<MpiCkptComm>(); }

}  // namespace mxt
