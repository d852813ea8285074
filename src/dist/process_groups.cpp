// The rank layout of a dp_size x ep_size job and its communicators (see comm.hpp for the layout).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>

#include "dist/dist_internal.hpp"
#include "dist/watchdog.hpp"
#include "mxtrain/ops.hpp"

namespace mxt {

std::vector<int> RankLayout::ep_group() const {
  std::vector<int> r(ep_size);
  for (int j = 0; j < ep_size; ++j) r[j] = dp_rank * ep_size + j;
  return r;
}

std::vector<int> RankLayout::dp_group() const {
  std::vector<int> r(dp_size);
  for (int i = 0; i < dp_size; ++i) r[i] = i * ep_size + ep_rank;
  return r;
}

RankLayout make_rank_layout(int world_rank, int world_size, int64_t dp_size, int64_t ep_size) {
  if (dp_size < 1 || ep_size < 1 || dp_size * ep_size != world_size)
    throw ConfigError(fmt::format("parallelism.dp_size ({}) x parallelism.ep_size ({}) must equal the number of "
                                  "ranks ({})", dp_size, ep_size, world_size));
  if (world_rank < 0 || world_rank >= world_size)
    throw std::invalid_argument(fmt::format("make_rank_layout: rank {} of {}", world_rank, world_size));
  RankLayout L;
  L.world_rank = world_rank;
  L.world_size = world_size;
  L.dp_size = static_cast<int>(dp_size);
  L.ep_size = static_cast<int>(ep_size);
  L.dp_rank = world_rank / L.ep_size;
  L.ep_rank = world_rank % L.ep_size;
  return L;
}

ProcessGroups::~ProcessGroups() = default;

std::shared_ptr<ProcessGroups> make_single_process_groups() {
  auto g = std::make_shared<ProcessGroups>();
  g->layout = make_rank_layout(0, 1, 1, 1);
  // Device::CUDA would do as well: one-rank collectives are only ever called in place (or not at all).
  g->world = make_self_comm(Device::CPU, "world group (world ranks 0)");
  g->ep = make_self_comm(Device::CPU, "ep group (world ranks 0)");
  g->dp = make_self_comm(Device::CPU, "dp group (world ranks 0)");
  g->world_host = make_self_comm(Device::CPU, "world group (world ranks 0)");
  g->ep_host = make_self_comm(Device::CPU, "ep group (world ranks 0)");
  g->dp_host = make_self_comm(Device::CPU, "dp group (world ranks 0)");
  return g;
}

std::shared_ptr<ProcessGroups> make_process_groups(const ParallelismConfig& p, Ops& ops) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const RankLayout L = make_rank_layout(rank, size, p.dp_size, p.ep_size);
  if (size == 1) {
    auto g = make_single_process_groups();
    g->layout = L;
    return g;
  }
  auto g = std::make_shared<ProcessGroups>();
  g->layout = L;
  g->watchdog = std::make_shared<Watchdog>(p.timeout_s);
  std::vector<int> all(size);
  for (int r = 0; r < size; ++r) all[r] = r;
  const std::string world_name = group_name("world", all), ep_name = group_name("ep", L.ep_group()),
                    dp_name = group_name("dp", L.dp_group());

  // Host communicators: world, EP (same dp_rank, ordered by ep_rank), DP (same ep_rank, ordered by dp_rank).
  // MPI_Comm_split is collective over the world: every rank makes the same calls in the same order.
  MPI_Comm world_c, ep_c, dp_c;
  MPI_Comm_dup(MPI_COMM_WORLD, &world_c);
  MPI_Comm_split(MPI_COMM_WORLD, L.dp_rank, L.ep_rank, &ep_c);
  MPI_Comm_split(MPI_COMM_WORLD, L.ep_rank, L.dp_rank, &dp_c);
  auto host = [&](MPI_Comm c, const std::string& name, int n) -> std::unique_ptr<Comm> {
    if (n > 1) return make_mpi_comm(c, name, g->watchdog);
    MPI_Comm_free(&c);
    return make_self_comm(Device::CPU, name);
  };

  if (ops.device() == Device::CPU) {
    // Buffer communicators are MPI too, on their own duplicates so they never share a context with host ones.
    MPI_Comm w2, e2, d2;
    MPI_Comm_dup(world_c, &w2);
    MPI_Comm_dup(ep_c, &e2);
    MPI_Comm_dup(dp_c, &d2);
    g->world = host(w2, world_name, size);
    g->ep = host(e2, ep_name, L.ep_size);
    g->dp = host(d2, dp_name, L.dp_size);
  } else {
#ifdef MXTRAIN_HAVE_CUDA
    // One NCCL communicator per group of more than one rank, created in the same order on every rank.
    g->world = make_nccl_comm(world_c, ops, world_name, g->watchdog);
    g->ep = L.ep_size > 1 ? make_nccl_comm(ep_c, ops, ep_name, g->watchdog) : make_self_comm(Device::CUDA, ep_name);
    g->dp = L.dp_size > 1 ? make_nccl_comm(dp_c, ops, dp_name, g->watchdog) : make_self_comm(Device::CUDA, dp_name);
#else
    throw std::logic_error("make_process_groups: a device backend in a build without CUDA");
#endif
  }
  g->world_host = host(world_c, world_name, size);
  g->ep_host = host(ep_c, ep_name, L.ep_size);
  g->dp_host = host(dp_c, dp_name, L.dp_size);
  // Every communicator exists on every rank before the first step (NCCL's lazy connections aside).
  g->world_host->barrier();
  return g;
}

NodeRank node_local_rank() {
  MPI_Comm node;
  int wrank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, wrank, MPI_INFO_NULL, &node);
  NodeRank r;
  MPI_Comm_rank(node, &r.local_rank);
  MPI_Comm_size(node, &r.local_size);
  MPI_Comm_free(&node);
  // The launcher's own numbering, when it gives one, so "local rank" means what it means to mpirun / srun.
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    const char* v = std::getenv(var);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*end == '\0' && x >= 0 && x < r.local_size) r.local_rank = static_cast<int>(x);
    break;
  }
  return r;
}

void abort_job(const std::string& message, int code) {
  int init = 0, fin = 0, rank = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  const bool mpi = init && !fin;
  if (mpi) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  spdlog::default_logger()->flush();
  std::fprintf(stderr, "mxtrain: rank %d: %s\n", rank, message.c_str());
  std::fflush(stderr);
  if (mpi) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace mxt
