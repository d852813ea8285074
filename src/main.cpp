// mxtrain: train Mixtral-style MoE models from a recipe config.
#include <mpi.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <exception>

#include "mxtrain/backend.hpp"
#include "mxtrain/cli.hpp"
#include "mxtrain/config.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/trainer.hpp"

namespace {

// A failure on one rank must end every rank: MPI_Abort instead of a return that leaves peers waiting.
[[noreturn]] void fail(int world, int code) {
  spdlog::default_logger()->flush();
  if (world > 1) MPI_Abort(MPI_COMM_WORLD, code);
  MPI_Finalize();
  std::exit(code);
}

int run(const mxt::CliOptions& opt, int rank, int world) {
  const YAML::Node resolved = mxt::resolve_config(opt.load);
  if (opt.print_config) {
    if (rank == 0) std::fputs(mxt::dump_config(resolved).c_str(), stdout);
    return 0;
  }
  const mxt::TrainConfig cfg = mxt::to_train_config(resolved);
  std::string why;
  auto ops = mxt::make_backend(cfg.backend, why);
  if (opt.dry_run) {
    if (rank == 0) std::fputs(mxt::format_memory_plan(cfg, mxt::plan_memory(cfg, *ops)).c_str(), stdout);
    return 0;
  }
  mxt::validate_for_run(cfg, world);
  if (world > 1)
    throw mxt::ConfigError("multi-rank training (world size " + std::to_string(world) +
                           ") is not implemented yet; run one process with parallelism.ep_size=1");
  if (rank == 0) {
    spdlog::info("mxtrain {} | config {} | {}", MXTRAIN_VERSION, opt.load.config_name, why);
    std::fputs(mxt::format_memory_plan(cfg, mxt::plan_memory(cfg, *ops)).c_str(), stdout);
  }
  std::vector<int32_t> tokens = mxt::load_tokens(cfg.dataset, cfg.model.vocab_size);
  if (rank == 0) spdlog::info("dataset: {} tokens from {}", tokens.size(), cfg.dataset.source);
  mxt::Trainer trainer(cfg, *ops, std::move(tokens), rank, world);
  if (!opt.dump_dir.empty()) {
    trainer.dump_first_batch(opt.dump_dir);
    spdlog::info("first batch dumped to {}", opt.dump_dir);
    return 0;
  }
  trainer.run();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
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
