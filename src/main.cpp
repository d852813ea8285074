// mxtrain: train Mixtral-style MoE models from a recipe config.
#include <mpi.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <optional>

#include "mxtrain/backend.hpp"
#include "mxtrain/checkpoint.hpp"
#include "mxtrain/cli.hpp"
#include "mxtrain/comm.hpp"
#include "mxtrain/config.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/device_info.hpp"
#include "mxtrain/stop_signal.hpp"
#include "mxtrain/trainer.hpp"
#include "mxtrain/version.hpp"
#include "mxtrain/writable_dir.hpp"

namespace {

// A failure on one rank must end every rank: MPI_Abort instead of a return that leaves peers waiting.
[[noreturn]] void fail(int world, int code) {
  spdlog::default_logger()->flush();
  if (world > 1) MPI_Abort(MPI_COMM_WORLD, code);
  MPI_Finalize();
  std::exit(code);
}

// The checkpoint size, and whether its filesystem has room: a ConfigError when the first save cannot fit (not
// for --dry-run, which only says so), a warning when a later one may not.
std::string checkpoint_plan(const mxt::TrainConfig& cfg, bool dry_run) {
  const mxt::CheckpointConfig& c = cfg.checkpoint;
  const int64_t bytes = mxt::checkpoint_bytes(cfg.model);
  std::string s = fmt::format("checkpoint: {:.1f} GB per save (fp32 master and AdamW moments, one shard per rank){}\n",
                              static_cast<double>(bytes) / 1e9,
                              c.ckpt_dir.empty() ? "; checkpoint.ckpt_dir is not set: no saves" : "");
  if (c.ckpt_dir.empty()) return s;
  if (!dry_run) {
    const std::string bad_dir = mxt::writable_dir_problem("checkpoint.ckpt_dir", c.ckpt_dir);
    if (!bad_dir.empty()) throw mxt::ConfigError(bad_dir);
  }
  const int64_t existing = static_cast<int64_t>(mxt::find_checkpoints(c.ckpt_dir).size());
  const int64_t saves = c.save_every_n_steps > 0 ? cfg.num_train_steps / c.save_every_n_steps : 0;
  const mxt::CheckpointSpace space = mxt::check_checkpoint_space(c, bytes, existing, std::max<int64_t>(1, saves));
  if (!space.error.empty()) {
    if (!dry_run) throw mxt::ConfigError(space.error);
    s += "  " + space.error + "\n";
  }
  if (!space.warning.empty()) spdlog::warn("{}", space.warning);
  return s;
}

int run(const mxt::CliOptions& opt, int rank, int world) {
  if (opt.preprocess) {  // `mxtrain preprocess ...`: FASTA/FASTQ -> indexed dataset, no training
    if (world > 1) throw mxt::ConfigError("mxtrain preprocess runs as one process; run it without mpirun");
    mxt::run_preprocess(opt.preprocess_options);
    return 0;
  }
  const YAML::Node resolved = mxt::resolve_config(opt.load);
  if (opt.print_config) {
    if (rank == 0) std::fputs(mxt::dump_config(resolved).c_str(), stdout);
    return 0;
  }
  mxt::TrainConfig cfg = mxt::to_train_config(resolved);
  cfg.resolved_yaml = mxt::dump_config(resolved);  // saved in checkpoints
  // One GPU per rank on a node: the rank's index among the node's ranks (collective, so before any branch);
  // a rank that sees a single GPU was bound to it by the launcher (srun --gpus-per-task, CUDA_VISIBLE_DEVICES).
  const mxt::NodeRank node = mxt::node_local_rank();
  const int device = mxt::cuda_device_count() == 1 ? 0 : node.local_rank;
  if (opt.dry_run) {  // the plan needs only the backend's dtype, so backend=cuda plans without a GPU
    const mxt::MemoryPlan plan = mxt::plan_memory(cfg, mxt::backend_act_dtype(cfg.backend));
    if (rank == 0) {
      std::fputs(mxt::format_memory_plan(cfg, plan).c_str(), stdout);
      std::fputs(checkpoint_plan(cfg, true).c_str(), stdout);
    }
    return 0;
  }
  std::string why;
  auto ops = mxt::make_backend(cfg.backend, why, device);
  mxt::validate_for_run(cfg, world);
  const mxt::MemoryPlan plan = mxt::plan_memory(cfg, *ops);
  if (!opt.dump_dir.empty() && world > 1)
    throw mxt::ConfigError("--dump runs on one rank; run it without mpirun and with parallelism.ep_size=1");
  if (rank == 0) {
    spdlog::info("mxtrain {} | config {} | {}", mxt::version_string(), opt.load.config_name, why);
    if (world > 1)
      spdlog::info("{} ranks: dp_size {} x ep_size {} (EP groups = consecutive ranks), collectives on {}, "
                   "timeout {} s", world, cfg.parallelism.dp_size, cfg.parallelism.ep_size,
                   ops->device() == mxt::Device::CUDA ? "NCCL" : "MPI", cfg.parallelism.timeout_s);
    std::fputs(mxt::format_memory_plan(cfg, plan).c_str(), stdout);
  }
  // Fail in seconds, not after minutes of weight initialisation, when the plan cannot fit this rank's device
  // (CPU ranks share the host's memory with the other ranks on the node).
  const size_t free_bytes = ops->device_free_bytes() / (ops->device() == mxt::Device::CUDA ? 1 : node.local_size);
  const std::string no_fit = mxt::plan_fit_problem(cfg, plan, free_bytes);
  if (!no_fit.empty()) throw mxt::ConfigError("rank " + std::to_string(rank) + ": " + no_fit);
  if (rank == 0) {
    const std::string bad_out = mxt::writable_dir_problem("output_dir", cfg.output_dir);  // metrics go there
    if (!bad_out.empty()) throw mxt::ConfigError(bad_out);
    std::fputs(checkpoint_plan(cfg, false).c_str(), stdout);  // throws when a save cannot fit
  }
  mxt::Corpus tokens = mxt::open_corpus(cfg.dataset, cfg.model.vocab_size);
  if (rank == 0)
    spdlog::info("dataset ({}{}): {} tokens in {} documents\n{}", cfg.dataset.source,
                 cfg.dataset.sequence_packing ? ", packed" : "", tokens.num_tokens(), tokens.num_docs(),
                 tokens.describe());
  std::optional<mxt::Corpus> held_out;  // validation.paths, opened before minutes of set-up could be wasted
  if (cfg.validation.every_n_steps > 0) {
    try {
      held_out = mxt::open_corpus(mxt::validation_dataset(cfg), cfg.model.vocab_size);
    } catch (const mxt::DataError& e) {
      throw mxt::DataError(std::string("validation.paths: ") + e.what());
    }
    if (rank == 0)
      spdlog::info("validation data: {} tokens in {} documents, {} micro-batches per rank every {} steps\n{}",
                   held_out->num_tokens(), held_out->num_docs(), cfg.validation.num_batches,
                   cfg.validation.every_n_steps, held_out->describe());
  }
  auto groups = mxt::make_process_groups(cfg.parallelism, *ops);
  if (opt.dump_dir.empty()) mxt::install_stop_handlers();  // from here a signal ends the run after a step, saved
  mxt::Trainer trainer(cfg, *ops, std::move(tokens), groups);
  if (held_out) trainer.set_validation_data(std::move(*held_out));
  if (!opt.dump_dir.empty()) {
    trainer.dump_first_batch(opt.dump_dir);
    spdlog::info("first batch dumped to {}", opt.dump_dir);
    return 0;
  }
  trainer.run();
  return trainer.stopped_early() ? mxt::kStopExitCode : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The collective watchdog may call MPI_Abort from its own thread while this one is inside MPI.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (rank != 0) spdlog::set_level(spdlog::level::warn);

  mxt::CliOptions opt = mxt::parse_cli(argc, argv);
  if (opt.should_exit) {
    if (rank == 0 && !opt.message.empty()) std::fputs(opt.message.c_str(), opt.exit_code == 0 ? stdout : stderr);
    MPI_Finalize();
    return opt.exit_code;
  }
  try {
    const int rc = run(opt, rank, world);
    MPI_Finalize();
    return rc;
  } catch (const mxt::ConfigError& e) {
    spdlog::error("config error: {}", e.what());
    fail(world, 2);
  } catch (const mxt::DataError& e) {
    spdlog::error("data error: {}", e.what());
    fail(world, 3);
  } catch (const std::exception& e) {
    spdlog::error("error: {}", e.what());
    fail(world, 1);
  }
}
