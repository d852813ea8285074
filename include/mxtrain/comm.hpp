#pragma once
// Communication for distributed training: a small collective interface with two implementations, MPI on
// host buffers (CPU ranks, and small host-side exchanges on every backend) and NCCL on device buffers (GPU
// ranks, src/dist/nccl_comm.cu), the process groups of a dp_size x ep_size job, the expert-parallel splits
// and the ZeRO-1 shard of a flat parameter buffer.
//
// Rank layout (make_rank_layout): world rank w = dp_rank * ep_size + ep_rank, i.e. an EP group is ep_size
// CONSECUTIVE world ranks (so the token all-to-all stays inside a node, on NVLink, when ep_size <= GPUs per
// node) and a DP group is the ranks with the same ep_rank, strided by ep_size. Example dp=2 x ep=2:
//   world 0 1 | 2 3      EP groups {0,1} {2,3}      DP groups {0,2} {1,3}
// EP rank j holds the experts [j * E/ep, (j+1) * E/ep); dense parameters are replicated on every rank.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mxtrain/config.hpp"
#include "mxtrain/tensor.hpp"

namespace mxt {

class Ops;
class Watchdog;  // src/dist/watchdog.hpp

// Element types a collective moves. Sums (all_reduce_sum, reduce_scatter_sum) support F32, F64, I32 (and
// BF16 on NCCL only).
enum class CommType : uint8_t { F32, BF16, I32, U8, F64 };
CommType comm_type(DType t);
size_t comm_type_size(CommType t);

// One group of ranks. Collectives are called by every member in the same order.
// - MPI (device() == CPU): host pointers; each call returns when this rank's part is done.
// - NCCL (device() == CUDA): device pointers; each call is ordered after the work already enqueued on the
//   backend's compute stream and before work enqueued there afterwards, and returns without waiting.
// Every call is watched: one that does not complete within parallelism.timeout_s aborts the whole job with
// a message naming the collective and the group (src/dist/watchdog.hpp).
class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device device() const = 0;
  // "ep group (world ranks 0,1)": for messages.
  virtual const std::string& name() const = 0;

  // Rank r sends send_counts[p] rows starting at row send_displs[p] of `send` to peer p, and receives
  // recv_counts[p] rows from peer p at row recv_displs[p] of `recv`. A row is row_elems elements of `type`.
  // send and recv must not overlap.
  virtual void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_displs, void* recv,
                            const int64_t* recv_counts, const int64_t* recv_displs, int64_t row_elems,
                            CommType type) = 0;
  // Overlap: the same exchange, but the compute stream is NOT ordered after it, so compute enqueued next may run
  // alongside it; until wait_started() (which orders the compute stream after every exchange started so far) the
  // caller must not touch recv, nor write send. Blocking where there is no separate stream (MPI, one rank).
  virtual void start_all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                                  void* recv, const int64_t* recv_counts, const int64_t* recv_displs,
                                  int64_t row_elems, CommType type) {
    all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, row_elems, type);
  }
  virtual void wait_started() {}
  // Several payloads with the same splits (rows of each payload's own size and type) in one exchange: on NCCL one
  // group, so one launch and one synchronisation for the tokens and their routing weights. start: as above.
  struct Payload {
    const void* send;
    void* recv;
    int64_t row_elems;
    CommType type;
  };
  virtual void exchange_rows(const std::vector<Payload>& parts, const int64_t* send_counts, const int64_t* send_displs,
                            const int64_t* recv_counts, const int64_t* recv_displs, bool start) {
    for (const Payload& p : parts) {
      if (start)
        start_all_to_all_v(p.send, send_counts, send_displs, p.recv, recv_counts, recv_displs, p.row_elems, p.type);
      else
        all_to_all_v(p.send, send_counts, send_displs, p.recv, recv_counts, recv_displs, p.row_elems, p.type);
    }
  }
  // buf[i] = sum over ranks of buf[i], in place.
  virtual void all_reduce_sum(void* buf, int64_t count, CommType type) = 0;
  // recv[0, count) = sum over ranks of send[rank*count, (rank+1)*count). send holds size()*count elements.
  // In place when recv == send + rank*count (elements); otherwise the buffers must not overlap.
  virtual void reduce_scatter_sum(const void* send, void* recv, int64_t count, CommType type) = 0;
  // recv[r*count, (r+1)*count) = rank r's send[0, count). In place when send == recv + rank*count.
  virtual void all_gather(const void* send, void* recv, int64_t count, CommType type) = 0;
  virtual void broadcast(void* buf, int64_t count, CommType type, int root) = 0;
  // Sums of several spans, each to its own root: on rank root, buf[0, count) = the sum over ranks of their
  // buf[0, count) (in place; the other ranks' spans are left as they were). start: as start_all_to_all_v (the
  // compute stream does not wait; wait_started() orders it after). On NCCL one group; elsewhere one call each.
  struct ReduceSpan {
    void* buf;
    int64_t count;
    int root;
  };
  virtual void reduce_spans(const std::vector<ReduceSpan>& spans, CommType type, bool start) = 0;
  // Returns when every member has called it (and, on NCCL, when this rank's enqueued collectives are done).
  virtual void barrier() = 0;
};

// ---- rank layout ----------------------------------------------------------------------------------------

struct RankLayout {
  int world_rank = 0, world_size = 1;
  int dp_size = 1, ep_size = 1;
  int dp_rank = 0, ep_rank = 0;
  std::vector<int> ep_group() const;  // world ranks of this rank's EP group, by ep rank
  std::vector<int> dp_group() const;  // world ranks of this rank's DP group, by dp rank
};
// Throws ConfigError when dp_size * ep_size != world_size (naming both keys).
RankLayout make_rank_layout(int world_rank, int world_size, int64_t dp_size, int64_t ep_size);

// ---- process groups --------------------------------------------------------------------------------------

struct ProcessGroups {
  RankLayout layout;
  // Collectives on the backend's buffers: NCCL on the CUDA backend, MPI on the CPU backend. A group of one
  // rank is a local no-op communicator (no NCCL communicator is created for it).
  std::unique_ptr<Comm> world, ep, dp;
  // MPI on host memory, whatever the backend: scalars (loss, squared norms) and the expert counts.
  std::unique_ptr<Comm> world_host, ep_host, dp_host;
  std::shared_ptr<Watchdog> watchdog;
  ~ProcessGroups();
};

// One process, no MPI needed (every group has one rank).
std::shared_ptr<ProcessGroups> make_single_process_groups();
// Over MPI_COMM_WORLD (MPI must be initialised; every rank calls it). `ops` picks the buffer communicators
// (NCCL for a CUDA backend: one communicator per group of more than one rank, its unique id broadcast over
// MPI, its own stream). timeout_s <= 0 disables the watchdog.
std::shared_ptr<ProcessGroups> make_process_groups(const ParallelismConfig& p, Ops& ops);

// The rank of this process among the ranks on its node (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, else
// MPI_Comm_split_type(SHARED)), and how many ranks share the node. MPI must be initialised; collective.
struct NodeRank {
  int local_rank = 0, local_size = 1;
};
NodeRank node_local_rank();

// Prints "mxtrain: rank R: <message>" to stderr and ends the whole job (MPI_Abort when MPI is initialised).
[[noreturn]] void abort_job(const std::string& message, int code);

// ---- expert parallelism -----------------------------------------------------------------------------------

// What the MoE block needs to run its experts across an EP group.
struct ExpertParallel {
  Comm* comm = nullptr;  // EP group on the backend's buffers (tokens, routing weights)
  Comm* host = nullptr;  // EP group on host memory (the per-expert counts)
  int rank = 0, size = 1;
  // Receive capacity in rows per rank as a multiple of T*k; 0: the worst case T * min(k, E/ep) * ep, which
  // can never overflow (parallelism.ep_capacity_factor).
  double capacity_factor = 0;
  // The backward starts the combine of the input gradients before the experts' weight gradients and lets them
  // run alongside it (parallelism.ep_overlap).
  bool overlap = true;
};

// Rows a rank's expert buffers hold: the worst case, or capacity_factor * T*k (rounded up), never more than
// the worst case, never less than 1.
int64_t ep_capacity_rows(int64_t tokens, int64_t k, int64_t num_experts, int ep_size, double capacity_factor);

// The splits of one MoE layer's exchange, derived from the per-expert counts (all in rows).
struct EpSplits {
  std::vector<int64_t> send_counts, send_displs;  // [ep]: my permuted rows for peer p (its experts)
  std::vector<int64_t> recv_counts, recv_displs;  // [ep]: rows peer p sends me, received peer-major
  int64_t recv_rows = 0;                          // sum of recv_counts
  // I32 [El + 1 + recv_rows]: first the expert-major offsets of my local experts over the received rows
  // (the grouped GEMMs' offsets), then the reorder: expert-major row q is received row meta[El + 1 + q].
  std::vector<int32_t> meta;
  std::vector<int64_t> expert_rows;  // [E]: rows routed to each expert by the whole EP group (placement statistics)
};
// Pure: from my per-expert counts [E] (rows of global expert e in my permuted buffer, grouped by expert in
// ascending order) and the counts peers send me, recv_from[p * El + e] for my local expert e, with El = E/ep.
void plan_ep_splits(const std::vector<int32_t>& my_counts, const std::vector<int32_t>& recv_from, int ep_size,
                    EpSplits& out);
// THE place where routing reaches the host: downloads the permutation offsets [E+1] (the host waits for the
// device up to them, while the device runs what `meanwhile` enqueues after them), all-gathers the per-expert counts over the EP group on host memory (every rank then knows every
// rank's load, for the imbalance statistics; it keeps what is sent to it), plans the splits and
// checks the receive capacity (throws naming parallelism.ep_capacity_factor when it is exceeded).
void exchange_expert_counts(Ops& ops, const Tensor& offsets, int64_t num_experts, const ExpertParallel& ep,
                            int64_t capacity_rows, EpSplits& out, const std::function<void()>& meanwhile = {});
// What the exchanges above saw in this process: how evenly the routed rows fell on this rank's experts, and how
// long the host waited for the device (the counts download drains the stream) and for the peers (the count
// exchange returns when the slowest EP rank reaches the same layer). Rows sent and received are per layer.
struct EpExchangeStats {
  int64_t exchanges = 0;
  int64_t rows_sent = 0, rows_received = 0, max_received = 0;
  // Summed over exchanges: the most loaded EP rank's rows (the layer's critical path) and the mean over ranks.
  int64_t busiest_rows = 0, mean_rows = 0;
  double download_s = 0, peer_wait_s = 0;
};
const EpExchangeStats& ep_exchange_stats();
void reset_ep_exchange_stats();  // e.g. after the warm-up step, whose waits are set-up, not steady state
// Gathers every rank's statistics over `world` (host memory; a collective) and logs one info line per rank.
void log_ep_exchange_stats(Comm& world);

// ---- ZeRO-1: optimizer state sharded over the ranks that hold replicas of a flat buffer --------------------

struct ParamShard {
  Comm* comm = nullptr;  // the replicas (dense: world, experts: DP group); null: one rank
  int64_t numel = 0;     // real elements of the flat buffer
  int64_t padded = 0;    // numel rounded up to a multiple of the group size (master and grad are this long)
  int64_t shard = 0;     // padded / group size: the AdamW moments this rank holds
  int64_t offset = 0;    // this rank's shard is [offset, offset + shard) of the padded buffer
};
ParamShard make_param_shard(Comm* comm, int64_t numel);
// grad[offset, offset+shard) = sum over the replicas of grad (in place; the rest of grad is then stale).
void reduce_scatter_grads(const ParamShard& s, const Tensor& grad);
// The same for the elements [begin, end) of grad only, each part summed to the replica whose shard holds it, and
// started (see Comm::reduce_spans): a range whose gradient is final can be reduced while the backward goes on.
// Ranges that together cover the padded buffer once leave it as reduce_scatter_grads would.
void start_reduce_grad_range(const ParamShard& s, const Tensor& grad, int64_t begin, int64_t end);
// buf = every replica's shard, each from [offset, offset + shard) of its own buf (in place). buf: padded elements
// of F32 (the expert master) or of the working dtype (the dense working copy, whose master is sharded).
void all_gather_params(const ParamShard& s, const Tensor& buf);

// ---- whole-model export under expert parallelism -----------------------------------------------------------

struct ParamLayout;
// Every expert of the model on EP rank 0 of `ep_host` (host memory, collective over the EP group): full_layout
// and all get the layout and expert buffer of one rank holding all experts; other ranks get them empty.
void gather_all_experts(const ParamLayout& local, const ModelConfig& m, Comm& ep_host,
                        const std::vector<float>& mine, ParamLayout& full_layout, std::vector<float>& all);

}  // namespace mxt
