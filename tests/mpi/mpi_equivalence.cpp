// Run under mpirun: a dp_size x ep_size job trains a tiny model for N steps on CPU ranks and must match one
// rank training on the same global batch: losses to 1e-5 relative, gradient norms (before clipping, which is
// active: max_grad_norm is below every norm) and the final master weights, dense and every expert.
// Rank 0 trains the single-rank reference first (dp = ep = 1, the same global batch: grad_acc_steps x world,
// or micro_batch_size x world with --mode batch) and broadcasts what it got. On the CPU backend it also checks that
// the MoE block flags expert parallelism's overlapped combine to the ops (Ops::set_exchange_alongside) while, and only
// while, it may run.
//
//   mpirun -np 4 mxtrain_mpi_check --dp 2 --ep 2 [--steps 10] [--micro 1] [--acc 2] [--mode acc|batch]
//                                  [--capacity F] [--aux-jitter] [--fp8] [--wgrad-group G] [--force-balance] [--rebalance N] [--experts E] [--lr X] [--moments float32|bfloat16] [--backend cpu|cuda] [--tol-scale X]
// Exit status 0 when every check passes on every rank. --backend cuda (one GPU per local rank, NCCL) runs
// the same comparison on GPU ranks with bf16 tolerances (loss 2e-3, norm 2e-2, weights 2e-3, x tol-scale).
#include <mpi.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cpu/cpu_ops.hpp"
#include "mxtrain/backend.hpp"
#include "mxtrain/comm.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/trainer.hpp"
#include "../tiny_config.hpp"

namespace {

struct Args {
  int dp = 1, ep = 1, steps = 10, micro = 1, acc = 2;
  std::string mode = "acc";
  double capacity = 0;
  bool aux_jitter = false;
  bool fp8 = false;
  int64_t wgrad_group = 1;
  bool force_balance = false;
  int64_t rebalance = 0;
  int64_t experts = 0;    // config_kwargs.num_local_experts (0: the tiny config's)
  double lr = 0;          // adamw_kwargs.lr (0: the tiny config's)
  std::string moments = "float32";  // adamw_moments_dtype, the reference's too  // parallelism.ep_rebalance_interval: experts re-placed (relabelled) every N steps
  std::string backend = "cpu";
  double tol_scale = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value after %s\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--dp") a.dp = std::stoi(val());
    else if (k == "--ep") a.ep = std::stoi(val());
    else if (k == "--steps") a.steps = std::stoi(val());
    else if (k == "--micro") a.micro = std::stoi(val());
    else if (k == "--acc") a.acc = std::stoi(val());
    else if (k == "--mode") a.mode = val();
    else if (k == "--capacity") a.capacity = std::stod(val());
    else if (k == "--aux-jitter") a.aux_jitter = true;
    else if (k == "--fp8") a.fp8 = true;
    else if (k == "--wgrad-group") a.wgrad_group = std::stoll(val());
    else if (k == "--force-balance") a.force_balance = true;
    else if (k == "--rebalance") a.rebalance = std::stoll(val());
    else if (k == "--experts") a.experts = std::stoll(val());
    else if (k == "--lr") a.lr = std::stod(val());
    else if (k == "--moments") a.moments = val();
    else if (k == "--backend") a.backend = val();
    else if (k == "--tol-scale") a.tol_scale = std::stod(val());
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      std::exit(2);
    }
  }
  if (a.mode != "acc" && a.mode != "batch") {
    std::fprintf(stderr, "--mode must be acc or batch\n");
    std::exit(2);
  }
  // Rank r's micro-batch i holds windows r + (i*micro + b) * world: the reference's micro-batch i*world + r
  // only when micro = 1 (acc mode); with batch mode, micro-batch i of all ranks is the reference's i.
  if (a.mode == "acc" && a.micro != 1) {
    std::fprintf(stderr, "--mode acc needs --micro 1 for the same global batch\n");
    std::exit(2);
  }
  return a;
}

mxt::TrainConfig tiny_config(const Args& a, bool gpu) {
  // GPU: L0_sanity's width (the CUDA attention takes head_dim 16..128)
  mxt::TrainConfig c = mxt::testing::tiny_config("mxtrain_mpi_check", gpu ? 256 : 32, gpu ? 512 : 48);
  c.model.max_position_embeddings = 256;
  c.logger.frequency = mxt::TrainConfig{}.logger.frequency;
  if (a.aux_jitter) {  // jitter and the aux loss only match with one sequence per micro-batch (--mode acc)
    c.model.router_aux_loss_coef = 0.02;
    c.model.router_jitter_noise = 0.05;
  }
  c.dataset.micro_batch_size = a.micro;
  c.dataset.max_seq_length = gpu ? 128 : 32;
  c.dataset.stride = gpu ? 32 : 8;
  c.num_train_steps = a.steps;
  c.grad_acc_steps = a.acc;
  c.lr_scheduler = {2, a.steps, 0.1};
  c.max_grad_norm = 0.05;  // below the norms of this model: clipping is active on every step (checked)
  c.parallelism.dp_size = a.dp;
  c.parallelism.ep_size = a.ep;
  c.parallelism.timeout_s = 120;
  c.parallelism.ep_capacity_factor = a.capacity;
  c.expert_wgrad_micro_batches = a.wgrad_group;
  c.model.router_force_load_balancing = a.force_balance;
  c.parallelism.ep_rebalance_interval = a.rebalance;
  if (a.experts > 0) c.model.num_local_experts = a.experts;
  if (a.lr > 0) c.adamw.lr = a.lr;
  c.adamw_moments_dtype = a.moments;
  if (a.fp8) {  // MXFP8 needs widths (and the K/V projection) in multiples of 32
    c.fp8.enabled = true;
    c.fp8.fp8_format = "HYBRID";
    if (!gpu) c.model.hidden_size = c.model.intermediate_size = 64;
  }
  return c;
}

// Held-out tokens for evaluate(): the embedded corpus's last 20,000 (the runs train on its beginning).
mxt::Corpus held_out() {
  const std::vector<int32_t> all = mxt::embedded_corpus_tokens();
  return std::vector<int32_t>(all.end() - 20000, all.end());
}

// The CPU backend, counting Ops::set_exchange_alongside: the MoE block raises it around expert parallelism's
// overlapped combine (where the CUDA weight gradient's lockstep steps aside) and lowers it after.
class ExchangeCountingOps : public mxt::CpuOps {
 public:
  int raised = 0, lowered = 0;
  bool on = false, nested = false;
  void set_exchange_alongside(bool v) override {
    if (v) {
      nested = nested || on;
      ++raised;
    } else {
      ++lowered;
    }
    on = v;
  }
  void reset() { raised = lowered = 0, on = nested = false; }
};

struct Run {
  std::vector<double> loss, norm;
  std::vector<double> val;  // validation loss and tokens after the last step
  std::vector<float> dense, expert;  // final master weights (expert: all experts on the reference)
};

void bcast(std::vector<double>& v, int n) {
  v.resize(n);
  MPI_Bcast(v.data(), n, MPI_DOUBLE, 0, MPI_COMM_WORLD);
}
void bcast(std::vector<float>& v) {
  int64_t n = static_cast<int64_t>(v.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  v.resize(n);
  MPI_Bcast(v.data(), static_cast<int>(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
}

// The reference's weights with every layer's experts (router rows and expert tensors) in the distributed run's
// current labels: slot g of layer l holds the expert origin[l * E + g] (Trainer::expert_origin).
void relabel(const mxt::ModelConfig& m, const std::vector<int32_t>& origin, std::vector<float>& dense,
             std::vector<float>& expert) {
  const int64_t E = m.num_local_experts;
  const mxt::ParamLayout full = mxt::ParamLayout::build(m, 0, E);
  const std::vector<float> d0 = dense, e0 = expert;
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".block_sparse_moe.";
    for (const char* name : {"gate.weight", "experts.w13", "experts.w2"}) {
      const mxt::ParamInfo& p = full.find(pre + name);
      const std::vector<float>& from = p.expert ? e0 : d0;
      std::vector<float>& to = p.expert ? expert : dense;
      const int64_t per = p.numel / E;
      for (int64_t g = 0; g < E; ++g)
        std::copy_n(from.begin() + p.offset + origin[static_cast<size_t>(l * E + g)] * per, per,
                    to.begin() + p.offset + g * per);
    }
  }
}

double max_abs_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  spdlog::set_level(spdlog::level::warn);
  const Args a = parse(argc, argv);
  std::string why;
  std::unique_ptr<mxt::Ops> ops;
  ExchangeCountingOps* counting = nullptr;
  if (a.backend == "cpu") {
    auto c = std::make_unique<ExchangeCountingOps>();
    counting = c.get();
    ops = std::move(c);
  } else {
    ops = mxt::make_backend(a.backend, why, mxt::node_local_rank().local_rank);
  }
  const bool gpu = ops->device() == mxt::Device::CUDA;
  const mxt::TrainConfig cfg = tiny_config(a, gpu);
  const double tol_loss = (gpu ? 2e-3 : 1e-5) * a.tol_scale, tol_norm = (gpu ? 2e-2 : 1e-4) * a.tol_scale,
               tol_w = (gpu ? 2e-3 : 1e-4) * a.tol_scale;
  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what.c_str());
    }
  };

  // The reference: one rank, the same global batch.
  Run ref;
  if (rank == 0) {
    mxt::TrainConfig rc = cfg;
    rc.parallelism.dp_size = rc.parallelism.ep_size = 1;
    if (a.mode == "acc") rc.grad_acc_steps *= world;
    else rc.dataset.micro_batch_size *= world;
    if (a.mode == "acc") rc.validation.num_batches *= world;  // batch mode: world x the rows per batch already
    mxt::Trainer t(rc, *ops, mxt::embedded_corpus_tokens());
    t.set_validation_data(held_out());
    for (int s = 0; s < a.steps; ++s) {
      const mxt::StepResult r = t.train_step();
      ref.loss.push_back(r.loss);
      ref.norm.push_back(r.grad_norm);
    }
    t.master_weights(ref.dense, ref.expert);
    const mxt::ValidationResult v = t.evaluate();
    ref.val = {v.loss, static_cast<double>(v.tokens)};
  }
  bcast(ref.val, 2);
  bcast(ref.loss, a.steps);
  bcast(ref.norm, a.steps);
  bcast(ref.dense);
  bcast(ref.expert);

  // The distributed run.
  if (counting) counting->reset();
  auto groups = mxt::make_process_groups(cfg.parallelism, *ops);
  mxt::Trainer t(cfg, *ops, mxt::embedded_corpus_tokens(), groups);
  const mxt::RankLayout& L = groups->layout;
  Run got;
  for (int s = 0; s < a.steps; ++s) {
    const mxt::StepResult r = t.train_step();
    got.loss.push_back(r.loss);
    got.norm.push_back(r.grad_norm);
  }
  t.master_weights(got.dense, got.expert);
  t.set_validation_data(held_out());
  const mxt::ValidationResult v = t.evaluate();  // every rank its own micro-batches, the same ones in all
  check(v.tokens == static_cast<int64_t>(ref.val[1]),
        "validation tokens " + std::to_string(v.tokens) + " vs " + std::to_string(ref.val[1]) + " (one rank)");
  check(std::fabs(v.loss - ref.val[0]) <= tol_loss * std::fabs(ref.val[0]),
        "validation loss " + std::to_string(v.loss) + " vs " + std::to_string(ref.val[0]) + " (one rank)");

  // Sharding really happened: AdamW moments are this rank's slice only.
  if (world > 1) {
    check(t.dense().adam_m.numel() < t.layout().dense_numel, "dense AdamW moments are not sharded");
    check(t.dense().master.numel() < t.layout().dense_numel, "the dense fp32 master is not sharded");
  }
  if (L.dp_size > 1)
    check(t.expert().adam_m.numel() < t.layout().expert_numel, "expert AdamW moments are not sharded");
  double worst_loss = 0, worst_norm = 0;
  for (int s = 0; s < a.steps; ++s) {
    const double rl = std::fabs(got.loss[s] - ref.loss[s]) / std::fabs(ref.loss[s]);
    const double rn = std::fabs(got.norm[s] - ref.norm[s]) / ref.norm[s];
    worst_loss = std::max(worst_loss, rl);
    worst_norm = std::max(worst_norm, rn);
    check(rl <= tol_loss, "step " + std::to_string(s + 1) + " loss " + std::to_string(got.loss[s]) + " vs " +
                          std::to_string(ref.loss[s]) + " (one rank)");
    check(rn <= tol_norm, "step " + std::to_string(s + 1) + " grad norm " + std::to_string(got.norm[s]) + " vs " +
                          std::to_string(ref.norm[s]));
    check(ref.norm[s] > cfg.max_grad_norm, "clipping inactive at step " + std::to_string(s + 1));
  }
  if (a.rebalance > 0) {
    check(t.experts_moved() > 0, "--rebalance: no expert was ever re-placed, so nothing of it was tested");
    relabel(cfg.model, t.expert_origin(), ref.dense, ref.expert);
  }
  // Weights: dense in full; this rank's experts against their slice of the reference.
  const double wd = max_abs_diff(got.dense.data(), ref.dense.data(), t.layout().dense_numel);
  double we = 0;
  const mxt::ParamLayout full = mxt::ParamLayout::build(cfg.model, 0, cfg.model.num_local_experts);
  for (const mxt::ParamInfo& p : t.layout().params) {
    if (!p.expert) continue;
    const mxt::ParamInfo& f = full.find(p.name);
    const int64_t per_expert = p.numel / t.layout().num_local_experts;
    we = std::max(we, max_abs_diff(got.expert.data() + p.offset,
                                   ref.expert.data() + f.offset + t.layout().first_expert * per_expert, p.numel));
  }
  check(wd <= tol_w, "dense weights differ by " + std::to_string(wd));
  check(we <= tol_w, "expert weights differ by " + std::to_string(we));
  // The final export's expert gather: EP rank 0 of the first EP group rebuilds every expert.
  if (L.dp_rank == 0 && L.ep_size > 1) {
    mxt::ParamLayout gl;
    std::vector<float> all;
    mxt::gather_all_experts(t.layout(), cfg.model, *groups->ep_host, got.expert, gl, all);
    if (L.ep_rank == 0) {
      check(gl.expert_numel == full.expert_numel, "gathered expert layout size");
      if (gl.expert_numel == full.expert_numel)
        check(max_abs_diff(all.data(), ref.expert.data(), full.expert_numel) <= tol_w, "gathered experts differ");
    }
  }
  // An overlapped combine is flagged while it may run, and only then.
  if (counting) {
    const bool overlapped = L.ep_size > 1 && cfg.parallelism.ep_overlap;
    check(overlapped ? counting->raised > 0 : counting->raised == 0,
          "set_exchange_alongside(true) called " + std::to_string(counting->raised) + " times (overlapped combine: " +
              (overlapped ? "yes" : "no") + ")");
    check(counting->raised == counting->lowered && !counting->on && !counting->nested,
          "set_exchange_alongside: raised " + std::to_string(counting->raised) + ", lowered " +
              std::to_string(counting->lowered) + (counting->on ? ", left on" : "") +
              (counting->nested ? ", raised twice" : ""));
  }
  int all_failures = 0;
  MPI_Allreduce(&failures, &all_failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("dp %d x ep %d (%s mode, micro %d, acc %d, %s) vs one rank, %d steps:\n", L.dp_size, L.ep_size,
                a.mode.c_str(), a.micro, a.acc, ops->name(), a.steps);
    if (a.rebalance > 0)
      std::printf("  ep_rebalance_interval=%lld: %lld slots changed expert\n", static_cast<long long>(a.rebalance),
                  static_cast<long long>(t.experts_moved()));
    std::printf("  step  loss (dist)     loss (1 rank)   grad norm (dist)  grad norm (1 rank)\n");
    for (int s = 0; s < a.steps; ++s)
      std::printf("  %4d  %.9f  %.9f  %.9f       %.9f\n", s + 1, got.loss[s], ref.loss[s], got.norm[s], ref.norm[s]);
    std::printf("  worst relative loss diff %.3g, grad norm %.3g; rank 0 weights max |diff| dense %.3g expert %.3g\n",
                worst_loss, worst_norm, wd, we);
    std::printf("  validation after the last step: loss %.9f over %lld tokens (one rank: %.9f over %.0f)\n", v.loss,
                static_cast<long long>(v.tokens), ref.val[0], ref.val[1]);
    std::printf("  dense AdamW shard %lld of %lld elements, expert shard %lld of %lld\n",
                static_cast<long long>(t.dense().adam_m.numel()), static_cast<long long>(t.layout().dense_numel),
                static_cast<long long>(t.expert().adam_m.numel()), static_cast<long long>(t.layout().expert_numel));
    std::printf("%s\n", all_failures == 0 ? "PASS" : "FAIL");
  }
  groups.reset();
  MPI_Finalize();
  return all_failures == 0 ? 0 : 1;
}
