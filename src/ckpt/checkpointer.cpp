// Orchestration of saves and resumes across ranks.
//
// A save, on every rank: rank 0 prepares step_<N>.tmp (barrier via broadcast) -> each rank writes its shard
// -> commit: rank 0 gathers the shard records (or errors), writes the manifest, renames the directory,
// prunes old checkpoints, and broadcasts the outcome, so every rank fails or succeeds together.
// async_save: the shard state is copied to host memory first (the only part the step loop waits for), the
// shard is written on a background thread. One rank commits on that thread too; with several ranks the commit
// (a collective) runs on the main thread at the next save() or finish(), so no MPI call happens off the main
// thread.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <new>
#include <thread>

#include "ckpt/ckpt_internal.hpp"
#include "mxtrain/params.hpp"

namespace mxt {
using namespace ckpt;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// MemAvailable from /proc/meminfo (bytes); -1 when unknown.
int64_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

double gb(uint64_t bytes) { return static_cast<double>(bytes) / 1e9; }
double gb_per_s(uint64_t bytes, double s) { return s > 0 ? gb(bytes) / s : 0.0; }

// A committed save over all ranks (rank 0 only): shard file bytes, and the slowest rank's shard write.
struct SaveStats {
  uint64_t bytes = 0;
  double write_s = 0;
};

void log_async_saved(int64_t step, const SaveStats& st, double stall_s, const std::string& dir) {
  spdlog::info("checkpoint step {}: {:.3f} GB in {:.2f} s ({:.2f} GB/s) written in the background, step loop "
               "stalled {:.3f} s -> {}", step, gb(st.bytes), st.write_s, gb_per_s(st.bytes, st.write_s), stall_s, dir);
}

// Every rank passes "ok:<shard record json>" or "err:<message>"; returns "ok:<dir>" or "err:<messages>" on all.
std::string commit_all(CkptComm& comm, const TrainConfig& cfg, Manifest m, const std::string& tmp_dir,
                       const std::string& local, SaveStats* stats = nullptr) {
  const std::vector<std::string> all = comm.gather(local);
  std::string outcome;
  if (comm.rank() == 0) {
    std::string errors;
    for (size_t r = 0; r < all.size(); ++r)
      if (starts_with(all[r], "err:")) errors += (errors.empty() ? "" : "; ") + all[r].substr(4);
    if (errors.empty()) {
      try {  // whatever fails here, the broadcast below must still happen
        SaveStats st;
        for (const std::string& rec : all) {
          const nlohmann::json j = nlohmann::json::parse(rec.substr(3));
          m.shards.push_back(shard_from_json(j, tmp_dir + " shard record"));
          st.bytes += m.shards.back().bytes;
          st.write_s = std::max(st.write_s, j.value("write_s", 0.0));
        }
        check_tiling(m, tmp_dir);  // the ranks' writes together hold everything exactly once
        const std::string dir = commit_dir(cfg.checkpoint.ckpt_dir, tmp_dir, m);
        prune_checkpoints(cfg.checkpoint.ckpt_dir, cfg.checkpoint.max_checkpoints, m.step);
        outcome = "ok:" + dir;
        if (stats) *stats = st;
      } catch (const std::exception& e) {
        errors = e.what();
      }
    }
    if (!errors.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(tmp_dir, ec);  // the previous checkpoints stay the newest
      outcome = "err:" + errors;
    }
  }
  return comm.broadcast(outcome);
}

// This rank's shard: "ok:<record>" or "err:<message>" (never throws, so the commit collective always runs).
// The record carries write_s, this rank's write time (not part of the manifest).
std::string write_local(const std::string& tmp_dir, int rank, const std::vector<Segment>& segs, Ops* ops) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    const std::string path = tmp_dir + "/" + shard_file_name(rank);
    const int64_t need = static_cast<int64_t>(segment_bytes(segs)) + (int64_t(1) << 20);
    const int64_t avail = free_bytes(tmp_dir);
    if (avail >= 0 && avail < need)
      throw CheckpointError("checkpoint file " + path + ": no space left on the device: it needs " +
                            std::to_string(need >> 20) + " MiB, " + std::to_string(avail >> 20) + " MiB are free");
    nlohmann::json rec = to_json(write_shard(path, rank, segs, ops));
    rec["write_s"] = seconds_since(t0);
    return "ok:" + rec.dump();
  } catch (const std::exception& e) {
    return std::string("err:") + e.what();
  }
}

}  // namespace

struct Checkpointer::Pending {
  int64_t step = 0;
  std::string tmp_dir, local, outcome;  // local: this rank's write result; outcome: set when committed
  Manifest manifest;
  std::vector<Segment> segs;
  size_t bytes = 0;
  double stall_s = 0;  // how long save() held up the step loop (snapshot, waiting for the previous save)
  std::thread thread;
};

Checkpointer::Checkpointer(const TrainConfig& cfg, std::unique_ptr<CkptComm> comm)
    : cfg_(cfg), comm_(comm ? std::move(comm) : std::make_unique<CkptComm>()) {}

Checkpointer::~Checkpointer() {
  if (prefault_.joinable()) prefault_.join();
  if (!pending_) return;
  if (pending_->thread.joinable()) pending_->thread.join();
  if (pending_->outcome.empty())
    spdlog::error("checkpoint step_{} was written but not committed: the run ended before finish()", pending_->step);
  else if (starts_with(pending_->outcome, "err:"))
    spdlog::error("the asynchronous save of checkpoint step_{} failed: {}", pending_->step, pending_->outcome.substr(4));
}

void Checkpointer::wait_pending() {
  if (!pending_) return;
  std::unique_ptr<Pending> p = std::move(pending_);
  if (p->thread.joinable()) p->thread.join();
  // Keep the host buffers for the next snapshot: page-faulting GBs of fresh memory is most of its cost.
  spare_.clear();
  for (Segment& seg : p->segs) spare_.push_back(std::move(seg.host));
  if (p->outcome.empty()) {  // several ranks: the commit is a collective, so it happens here
    SaveStats st;
    p->outcome = commit_all(*comm_, cfg_, p->manifest, p->tmp_dir, p->local, &st);
    if (comm_->rank() == 0 && starts_with(p->outcome, "ok:")) log_async_saved(p->step, st, p->stall_s, p->outcome.substr(3));
  }
  if (starts_with(p->outcome, "err:"))
    throw CheckpointError("the asynchronous save of checkpoint step_" + std::to_string(p->step) +
                          " failed: " + p->outcome.substr(4));
}

void Checkpointer::after_step(const TrainState& s) {
  const int64_t every = cfg_.checkpoint.save_every_n_steps;
  if (every > 0 && cfg_.checkpoint.async_save && !prefault_started_) start_prefault(s);
  if (every > 0 && s.step % every == 0) save(s);
}

void Checkpointer::start_prefault(const TrainState& s) {
  prefault_started_ = true;
  if (!spare_.empty()) return;
  std::vector<int64_t> sizes;
  int64_t bytes = 0;
  for (const Segment& seg : write_segments(s, plan_writes(s, comm_->rank(), comm_->size()))) {
    sizes.push_back(seg.numel());
    bytes += seg.numel() * static_cast<int64_t>(sizeof(float));
  }
  const int64_t avail = available_host_memory();
  if (avail >= 0 && static_cast<double>(bytes) > 0.8 * static_cast<double>(avail)) return;  // save() decides
  prefault_ = std::thread([this, sizes = std::move(sizes)] {
    try {
      for (int64_t n : sizes) prefaulted_.emplace_back(static_cast<size_t>(n));  // zero-filled: pages touched
    } catch (const std::bad_alloc&) {
      prefaulted_.clear();  // the snapshot allocates (and reports) for itself
    }
  });
}

void Checkpointer::take_prefault() {
  if (!prefault_.joinable()) return;
  prefault_.join();
  if (spare_.empty()) spare_ = std::move(prefaulted_);
  prefaulted_.clear();
}

void Checkpointer::finish() {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t step = pending_ ? pending_->step : -1;
  wait_pending();
  if (step >= 0 && comm_->rank() == 0)
    spdlog::info("checkpoint step {}: the end of the run waited {:.3f} s for its background save", step,
                 seconds_since(t0));
}

void Checkpointer::save(const TrainState& s) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t prev_step = pending_ ? pending_->step : -1;
  wait_pending();
  const double wait_s = seconds_since(t0);
  if (s.step == last_saved_step_) return;  // e.g. the last step was saved already
  const int rank = comm_->rank(), world = comm_->size();
  std::string prep;
  if (rank == 0) {
    try {
      prep = "ok:" + prepare_tmp_dir(cfg_.checkpoint.ckpt_dir, s.step);
    } catch (const std::exception& e) {
      prep = std::string("err:") + e.what();
    }
  }
  prep = comm_->broadcast(prep);  // also the barrier: nobody writes before the directory exists
  if (starts_with(prep, "err:")) throw CheckpointError(prep.substr(4));

  auto p = std::make_unique<Pending>();
  p->step = s.step;
  p->tmp_dir = prep.substr(3);
  p->manifest = describe(cfg_, s, world);
  p->segs = write_segments(s, plan_writes(s, rank, world));
  p->bytes = segment_bytes(p->segs);

  bool async = cfg_.checkpoint.async_save;
  const int64_t avail = available_host_memory();
  if (async && avail >= 0 && static_cast<double>(p->bytes) > 0.8 * static_cast<double>(avail)) {
    spdlog::warn("async_save: the snapshot would take {:.2f} GiB of the {:.2f} GiB of host memory available; "
                 "saving step {} synchronously", p->bytes / 1073741824.0, avail / 1073741824.0, s.step);
    async = false;
  }
  if (!async) {
    p->local = write_local(p->tmp_dir, rank, p->segs, &s.ops);
    SaveStats st;
    const std::string outcome = commit_all(*comm_, cfg_, p->manifest, p->tmp_dir, p->local, &st);
    if (starts_with(outcome, "err:")) throw CheckpointError(outcome.substr(4));
    last_saved_step_ = s.step;
    const double total_s = seconds_since(t0);
    if (rank == 0)
      spdlog::info("checkpoint step {}: {:.3f} GB in {:.2f} s ({:.2f} GB/s), step loop stalled {:.2f} s (synchronous "
                   "save; slowest shard write {:.2f} s) -> {}", s.step, gb(st.bytes), total_s,
                   gb_per_s(st.bytes, total_s), total_s, st.write_s, outcome.substr(3));
    return;
  }
  const auto t_pre = std::chrono::steady_clock::now();
  const bool prefaulting = prefault_.joinable();
  take_prefault();  // a save soon after step 1 waits for the background prefault to finish
  const double prefault_wait_s = prefaulting ? seconds_since(t_pre) : 0.0;
  for (size_t i = 0; i < p->segs.size() && i < spare_.size(); ++i)
    if (static_cast<int64_t>(spare_[i].size()) == p->segs[i].numel()) p->segs[i].host = std::move(spare_[i]);
  spare_.clear();
  const auto t_snap = std::chrono::steady_clock::now();
  snapshot(s.ops, p->segs);
  const double snap_s = seconds_since(t_snap);
  p->stall_s = seconds_since(t0);
  if (rank == 0)
    spdlog::info("checkpoint step {}: step loop stalled {:.3f} s (snapshot of {:.3f} GB to host {:.3f} s{}), "
                 "writing in the background", s.step, p->stall_s, gb(p->bytes), snap_s,
                 (prev_step >= 0 ? fmt::format(", waiting for step {}'s save {:.3f} s", prev_step, wait_s) : "") +
                     (prefault_wait_s >= 0.001
                          ? fmt::format(", waiting for the host buffers' background prefault {:.3f} s", prefault_wait_s)
                          : ""));
  Pending* raw = p.get();
  const bool commit_here = world == 1;
  raw->thread = std::thread([raw, rank, commit_here, cfg = cfg_] {
    raw->local = write_local(raw->tmp_dir, rank, raw->segs, nullptr);
    if (commit_here) {
      CkptComm one;
      SaveStats st;
      raw->outcome = commit_all(one, cfg, raw->manifest, raw->tmp_dir, raw->local, &st);
      if (starts_with(raw->outcome, "ok:")) log_async_saved(raw->step, st, raw->stall_s, raw->outcome.substr(3));
    }
  });
  pending_ = std::move(p);
  last_saved_step_ = s.step;
}

int64_t Checkpointer::resume(const TrainState& s) {
  const std::string& root = cfg_.checkpoint.ckpt_dir;
  const int rank = comm_->rank();
  // Rank 0 lists; everyone tries the same candidates in the same order.
  nlohmann::json list = nlohmann::json::array();
  if (rank == 0) {
    for (const std::string& d : incomplete_step_dirs(root))
      spdlog::warn("checkpoint: {} has no manifest.json: not a complete checkpoint, skipped", d);
    for (const auto& [step, dir] : find_checkpoints(root)) list.push_back({{"step", step}, {"dir", dir}});
    if (!cfg_.checkpoint.resume_from_checkpoint && !list.empty())
      spdlog::warn("resume_from_checkpoint=false: starting from scratch although {} holds checkpoints up to step {}; "
                   "they will be replaced or pruned as this run saves", root, list[0]["step"].get<int64_t>());
  }
  if (!cfg_.checkpoint.resume_from_checkpoint) return -1;
  list = nlohmann::json::parse(comm_->broadcast(list.dump()));
  std::vector<std::string> failed;
  for (const auto& c : list) {
    const std::string dir = c["dir"].get<std::string>();
    std::string err;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      load_checkpoint(dir, cfg_, s);
    } catch (const CheckpointIncompatible&) {
      throw;  // the same manifest on every rank: all of them stop here
    } catch (const std::exception& e) {
      err = e.what();  // every rank must reach all_true below
    }
    if (!err.empty()) spdlog::warn("rank {}: {}", rank, err);
    if (!comm_->all_true(err.empty())) {
      failed.push_back(dir);
      if (rank == 0) spdlog::warn("checkpoint {} is unusable; falling back to the previous complete checkpoint", dir);
      continue;
    }
    // Over all ranks: the state bytes loaded, the slowest rank's load time.
    const double load_s = seconds_since(t0);
    const std::vector<std::string> loads =
        comm_->gather(std::to_string(segment_bytes(read_segments(s))) + " " + std::to_string(load_s));
    if (rank == 0) {
      const Manifest m = read_manifest(dir);
      uint64_t bytes = 0;
      double slowest = 0;
      for (const std::string& l : loads) {
        bytes += std::stoull(l);
        slowest = std::max(slowest, std::stod(l.substr(l.find(' ') + 1)));
      }
      spdlog::info("resumed from checkpoint {} at step {}: loaded {:.3f} GB in {:.2f} s ({:.2f} GB/s)", dir, m.step,
                   gb(bytes), slowest, gb_per_s(bytes, slowest));
      if (m.world_size != comm_->size() || m.dp_size != cfg_.parallelism.dp_size ||
          m.ep_size != cfg_.parallelism.ep_size)
        spdlog::info("resharded: saved on {} ranks (dp {}, ep {}), resumed on {} ranks (dp {}, ep {})", m.world_size,
                     m.dp_size, m.ep_size, comm_->size(), cfg_.parallelism.dp_size, cfg_.parallelism.ep_size);
      if (m.seed != cfg_.seed)
        spdlog::warn("seed {} differs from the checkpoint's {}: data order and router jitter will not continue "
                     "as before", cfg_.seed, m.seed);
      for (const std::string& ch : config_changes(m.config_yaml, cfg_.resolved_yaml))
        spdlog::info("config changed since the checkpoint: {}", ch);
      // A kill between a save's commit and its retention leaves one checkpoint too many (and perhaps a
      // *.trash); a run resumed with nothing left to train would never save, so tidy up here.
      remove_leftovers(root);
      prune_checkpoints(root, cfg_.checkpoint.max_checkpoints, m.step);
    }
    return s.step;
  }
  if (!failed.empty()) {
    std::string names;
    for (const auto& f : failed) names += (names.empty() ? "" : ", ") + f;
    throw CheckpointError("no usable checkpoint in " + root + " (tried " + names +
                          "; see the messages above). Move them away or set "
                          "checkpoint.resume_from_checkpoint=false to start from scratch");
  }
  return -1;
}

std::string save_checkpoint(const TrainConfig& cfg, const TrainState& s, CkptComm& comm) {
  TrainConfig c = cfg;
  c.checkpoint.async_save = false;
  // A Checkpointer borrowing comm for one synchronous save.
  struct Borrowed : CkptComm {
    CkptComm& c;
    explicit Borrowed(CkptComm& x) : c(x) {}
    int rank() const override { return c.rank(); }
    int size() const override { return c.size(); }
    void barrier() override { c.barrier(); }
    std::vector<std::string> gather(const std::string& m) override { return c.gather(m); }
    std::string broadcast(const std::string& m) override { return c.broadcast(m); }
    bool all_true(bool m) override { return c.all_true(m); }
  };
  Checkpointer k(c, std::make_unique<Borrowed>(comm));
  k.save(s);
  return (std::filesystem::path(cfg.checkpoint.ckpt_dir) / step_dir_name(s.step)).string();
}

}  // namespace mxt
