#pragma once
// Factories of the Comm implementations (src/dist/*), shared by process_groups.cpp and the tests.
#include <mpi.h>

#include <memory>
#include <string>

#include "mxtrain/comm.hpp"

namespace mxt {

// MPI on host buffers over `comm`, which the Comm takes over (freed with it).
std::unique_ptr<Comm> make_mpi_comm(MPI_Comm comm, std::string name, std::shared_ptr<Watchdog> watchdog);
// A group of one rank: collectives are local copies (host) or no-ops when in place (any device).
std::unique_ptr<Comm> make_self_comm(Device device, std::string name);
// NCCL on the CUDA backend's device buffers (src/dist/nccl_comm.cu; CUDA builds only). Collective over
// `comm` (duplicated; the caller keeps its handle): rank 0 creates the unique id, MPI broadcasts it.
std::unique_ptr<Comm> make_nccl_comm(MPI_Comm comm, Ops& ops, std::string name, std::shared_ptr<Watchdog> watchdog);

// "ep group (world ranks 0,1)" for messages.
std::string group_name(const char* kind, const std::vector<int>& world_ranks);

}  // namespace mxt
