// Config loading, defaults lists, overrides, schema and range checks, run checks, printing.
// Configs come from the source tree (MXTRAIN_SOURCE_DIR/configs) unless a test is about the built-in ones.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/config_internal.hpp"
#include "config_error.hpp"
#include "mxtrain/config.hpp"

#ifndef MXTRAIN_SOURCE_DIR
#define MXTRAIN_SOURCE_DIR "/work/main"
#endif

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

namespace mxt {
namespace {

const std::string kConfigDir = MXTRAIN_SOURCE_DIR "/configs";

YAML::Node resolve(const std::string& name, const std::vector<std::string>& overrides = {},
                   const std::string& dir = kConfigDir) {
  return resolve_config(LoadOptions{name, dir, overrides});
}

TrainConfig typed(const std::string& name, const std::vector<std::string>& overrides = {},
                  const std::string& dir = kConfigDir) {
  return to_train_config(resolve(name, overrides, dir));
}


// A fresh directory of config files, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "mxtrain_cfg_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string write(const std::string& rel, const std::string& text) const {
    const fs::path p = fs::path(path_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// ---- The recipe's configs ----

TEST(ConfigRecipe, L0SanityHasTheRecipeValues) {
  const TrainConfig c = typed("L0_sanity");
  EXPECT_EQ(c.model.hidden_size, 256);
  EXPECT_EQ(c.model.intermediate_size, 512);
  EXPECT_EQ(c.model.num_hidden_layers, 2);
  EXPECT_EQ(c.model.num_attention_heads, 4);
  EXPECT_EQ(c.model.num_key_value_heads, 2);
  EXPECT_EQ(c.model.num_local_experts, 4);
  EXPECT_EQ(c.model.num_experts_per_tok, 2);
  EXPECT_EQ(c.model.max_position_embeddings, 256);
  EXPECT_EQ(c.model.vocab_size, 128256);
  EXPECT_DOUBLE_EQ(c.model.rope_theta, 10000.0);
  EXPECT_FALSE(c.model.tie_word_embeddings);
  EXPECT_EQ(c.dataset.micro_batch_size, 1);
  EXPECT_EQ(c.dataset.max_seq_length, 128);
  EXPECT_EQ(c.dataset.stride, 32);
  EXPECT_EQ(c.dataset.source, "embedded");
  EXPECT_EQ(c.num_train_steps, 120);
  EXPECT_EQ(c.grad_acc_steps, 1);
  EXPECT_EQ(c.lr_scheduler.num_warmup_steps, 10);
  EXPECT_EQ(c.lr_scheduler.num_decay_steps, 110);
  EXPECT_EQ(c.logger.frequency, 1);
  EXPECT_EQ(c.parallelism.dp_size, 1);
  EXPECT_EQ(c.parallelism.ep_size, 2);
  EXPECT_FALSE(c.fp8.enabled);
  EXPECT_DOUBLE_EQ(c.adamw.lr, 3e-3);
  EXPECT_DOUBLE_EQ(c.adamw.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.adamw.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.adamw.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.adamw.weight_decay, 0.033);
  EXPECT_DOUBLE_EQ(c.max_grad_norm, 1.0);
  EXPECT_EQ(c.checkpoint.ckpt_dir, "");  // null: no checkpoints
  EXPECT_EQ(c.init_from_pretrained, "");
  EXPECT_EQ(c.backend, "auto");
}

TEST(ConfigRecipe, L1_8x7B_epHasTheRecipeValues) {
  const TrainConfig c = typed("L1_8x7B_ep");
  EXPECT_EQ(c.model.hidden_size, 4096);
  EXPECT_EQ(c.model.intermediate_size, 14336);
  EXPECT_EQ(c.model.num_hidden_layers, 32);
  EXPECT_EQ(c.model.num_attention_heads, 32);
  EXPECT_EQ(c.model.num_key_value_heads, 8);
  EXPECT_EQ(c.model.num_local_experts, 8);
  EXPECT_EQ(c.model.num_experts_per_tok, 2);
  EXPECT_EQ(c.model.vocab_size, 128256);
  EXPECT_EQ(c.model.max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(c.model.rope_theta, 1e6);
  EXPECT_EQ(c.parallelism.ep_size, 8);
  EXPECT_EQ(c.parallelism.dp_size, 1);
  EXPECT_TRUE(c.fp8.enabled);
  EXPECT_EQ(c.fp8.fp8_recipe, "MXFP8BlockScaling");
  EXPECT_TRUE(c.recompute_experts);  // ours, to fit 141 GB per rank
  EXPECT_FALSE(c.fp8.cache_columnwise_weights);
  EXPECT_EQ(c.dataset.max_seq_length, 4096);
  EXPECT_EQ(c.dataset.micro_batch_size, 1);
}

TEST(ConfigRecipe, TheRecipeCommandLineForL1Works) {
  const TrainConfig c = typed("L1_8x7B_ep", {"checkpoint.ckpt_dir=/path/to/ckpt"});
  EXPECT_EQ(c.checkpoint.ckpt_dir, "/path/to/ckpt");
  EXPECT_NO_THROW(validate_for_run(c, 8));
}

TEST(ConfigRecipe, EveryModelShapeFileIsAValidModel) {
  TempDir dir;
  const std::vector<std::pair<std::string, int64_t>> models = {
      {"model/mixtral-8x7B", 4096}, {"model/mixtral-8x1B", 2048}, {"model/lingua-small-mixtral", 1024}};
  for (const auto& [model, hidden] : models) {
    SCOPED_TRACE(model);
    // The source tree's model file, on top of L0_sanity (built-in fallback for the rest).
    dir.write("m.yaml", "defaults: [L0_sanity, " + model + ", _self_]\n");
    fs::create_directories(fs::path(dir.str()) / "model");
    fs::copy_file(kConfigDir + "/" + model + ".yaml", fs::path(dir.str()) / (model + ".yaml"),
                  fs::copy_options::overwrite_existing);
    const TrainConfig c = typed("m", {}, dir.str());
    EXPECT_EQ(c.model.hidden_size, hidden);
    EXPECT_EQ(c.model.num_experts_per_tok, 2);
  }
}

TEST(ConfigRecipe, DefaultConfigNameIsL0Sanity) {
  EXPECT_EQ(dump_config(resolve_config(LoadOptions{})), dump_config(resolve("L0_sanity", {}, "")));
}

// ---- Built-in (embedded) configs ----

TEST(ConfigEmbedded, EveryConfigFileIsBuiltInVerbatim) {
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(kConfigDir)) {
    if (e.path().extension() != ".yaml") continue;
    ++files;
    std::string name = fs::relative(e.path(), kConfigDir).replace_extension().generic_string();
    SCOPED_TRACE(name);
    bool found = false;
    for (const auto& [n, text] : embedded_configs())
      if (n == name) {
        found = true;
        EXPECT_EQ(text, read_file(e.path()));
      }
    EXPECT_TRUE(found);
  }
  EXPECT_EQ(files, embedded_configs().size());
}

TEST(ConfigEmbedded, BuiltInAndSourceTreeResolveAlike) {
  for (const char* name : {"L0_sanity", "L1_8x7B_ep", "L0_sanity.yaml"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(dump_config(resolve(name, {"seed=3"}, "")), dump_config(resolve(name, {"seed=3"})));
  }
}

// ---- Overrides ----

TEST(ConfigOverrides, SetExistingKeys) {
  const TrainConfig c = typed("L0_sanity", {"adamw_kwargs.lr=1e-4", "adamw_kwargs.betas=[0.9,0.99]",
                                            "checkpoint.ckpt_dir=/tmp/ckpt", "fp8_config.enabled=true",
                                            "dataset.source=fasta", "dataset.paths=[a.fa, b.fa]",
                                            "num_train_steps=5", "num_train_steps=1_000"});
  EXPECT_DOUBLE_EQ(c.adamw.lr, 1e-4);
  EXPECT_DOUBLE_EQ(c.adamw.beta2, 0.99);
  EXPECT_EQ(c.checkpoint.ckpt_dir, "/tmp/ckpt");
  EXPECT_TRUE(c.fp8.enabled);
  EXPECT_EQ(c.dataset.paths, (std::vector<std::string>{"a.fa", "b.fa"}));
  EXPECT_EQ(c.num_train_steps, 1000);  // the last override wins; digit separators as in the recipe
}

TEST(ConfigOverrides, IntegersFitNumbersAndNullFitsStrings) {
  const TrainConfig c = typed("L0_sanity", {"adamw_kwargs.lr=1", "checkpoint.ckpt_dir=null", "output_dir=123"});
  EXPECT_DOUBLE_EQ(c.adamw.lr, 1.0);
  EXPECT_EQ(c.checkpoint.ckpt_dir, "");
  EXPECT_EQ(c.output_dir, "123");
}

TEST(ConfigOverrides, TheTEQualifiedFp8RecipeNameIsAccepted) {
  const TrainConfig c =
      typed("L0_sanity", {"fp8_config.fp8_recipe=transformer_engine.common.recipe.MXFP8BlockScaling"});
  EXPECT_EQ(c.fp8.fp8_recipe, "MXFP8BlockScaling");
}

TEST(ConfigOverrides, PlusAddsNewKeys) {
  const YAML::Node n = resolve("L0_sanity", {"+foo.bar=3", "+adamw_kwargs.foreach=true"});
  EXPECT_EQ(n["foo"]["bar"].as<int>(), 3);
  EXPECT_EQ(n["adamw_kwargs"]["foreach"].as<std::string>(), "true");
  EXPECT_NO_THROW(to_train_config(n));  // added keys are carried, not read
}

TEST(ConfigOverrides, PlusPlusSetsOrAdds) {
  const YAML::Node n = resolve("L0_sanity", {"++num_train_steps=9", "++extra=1"});
  EXPECT_EQ(n["num_train_steps"].as<int>(), 9);
  EXPECT_EQ(n["extra"].as<int>(), 1);
}

TEST(ConfigOverrides, TildeRemoves) {
  const YAML::Node n = resolve("L0_sanity", {"+foo=1", "~foo"});
  EXPECT_FALSE(n["foo"].IsDefined());
  const YAML::Node m = resolve("L0_sanity", {"+foo=1", "~foo=1"});
  EXPECT_FALSE(m["foo"].IsDefined());
}

TEST(ConfigOverrides, AReAddedSchemaKeyIsStillTypeChecked) {
  EXPECT_EQ(typed("L0_sanity", {"~logger.frequency", "+logger.frequency=5"}).logger.frequency, 5);
  EXPECT_THAT(error_of([] { resolve("L0_sanity", {"~logger.frequency", "+logger.frequency=abc"}); }),
              HasSubstr("config key 'logger.frequency' must be an integer, got 'abc'"));
}

struct BadInput {
  std::vector<std::string> overrides;
  std::string expected;  // a substring of the message
};

TEST(ConfigOverrides, BadOverridesNameTheOverrideAndKey) {
  const std::vector<BadInput> cases = {
      {{"num_train_steps"}, "override 'num_train_steps': expected key=value"},
      {{"L1_8x7B_ep"}, "to choose a config, use --config-name"},
      {{"=3"}, "override '=3': malformed key ''"},
      {{"a..b=1"}, "override 'a..b=1': malformed key 'a..b'"},
      {{"adamw_kwargs.betas=[0.9,"}, "override 'adamw_kwargs.betas=[0.9,': cannot read value '[0.9,' as YAML"},
      {{"num_train_steps.x=1"}, "override 'num_train_steps.x=1': 'num_train_steps' is '120', not a map"},
      {{"dataset.micro_batch_sise=2"},
       "unknown config key 'dataset.micro_batch_sise'; did you mean 'dataset.micro_batch_size'?"},
      {{"micro_batch_size=2"}, "unknown config key 'micro_batch_size'; did you mean 'dataset.micro_batch_size'?"},
      {{"dataset.frequency=2"}, "did you mean 'logger.frequency'?"},
      {{"adamw_kwargs.betsa=[0.9,0.9]"}, "did you mean 'adamw_kwargs.betas'?"},  // transposition
      {{"nope.deeper=1"}, "unknown config key 'nope.deeper'"},
      {{"+num_train_steps=3"}, "override '+num_train_steps=3': config key 'num_train_steps' already exists"},
      {{"~no_such_key"}, "cannot remove config key 'no_such_key'"},
      {{"~num_train_steps=7"}, "config key 'num_train_steps' is '120', not '7'; not removed"},
      {{"~logger.frequency"}, "missing config key 'logger.frequency'"},
      {{"~dataset"}, "missing config key 'dataset'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.overrides[0]);
    EXPECT_THAT(error_of([&] { resolve("L0_sanity", c.overrides); }), HasSubstr(c.expected));
  }
}

TEST(ConfigOverrides, NoSuggestionWhenNothingIsClose) {
  const std::string msg = error_of([] { resolve("L0_sanity", {"completely_unrelated_setting=1"}); });
  EXPECT_THAT(msg, HasSubstr("unknown config key 'completely_unrelated_setting'"));
  EXPECT_THAT(msg, Not(HasSubstr("did you mean")));
}

// ---- Schema: types ----

TEST(ConfigSchema, WrongTypesNameKeyValueAndExpectedType) {
  const std::vector<BadInput> cases = {
      {{"num_train_steps=abc"}, "config key 'num_train_steps' must be an integer, got 'abc'"},
      {{"num_train_steps=1.5"}, "config key 'num_train_steps' must be an integer, got '1.5'"},
      {{"num_train_steps='5'"}, "config key 'num_train_steps' must be an integer, got '5'"},  // quoted: a string
      {{"num_train_steps=null"}, "config key 'num_train_steps' must be an integer, got null"},
      {{"adamw_kwargs.lr=fast"}, "config key 'adamw_kwargs.lr' must be a number, got 'fast'"},
      {{"fp8_config.enabled=yes"}, "config key 'fp8_config.enabled' must be true or false, got 'yes'"},
      {{"adamw_kwargs.betas=0.9"}, "config key 'adamw_kwargs.betas' must be a list, got '0.9'"},
      {{"adamw_kwargs.betas=[0.9,high]"}, "config key 'adamw_kwargs.betas[1]' must be a number, got 'high'"},
      {{"dataset.paths=[[a]]"}, "config key 'dataset.paths[0]' must be a string, got [a]"},
      {{"dataset=3"}, "config key 'dataset' must be a map, got '3'"},
      {{"backend=[cpu]"}, "config key 'backend' must be a string, got [cpu]"},
      {{"seed=???"}, "config key 'seed' is mandatory but has no value"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.overrides[0]);
    EXPECT_THAT(error_of([&] { resolve("L0_sanity", c.overrides); }), HasSubstr(c.expected));
  }
}

TEST(ConfigSchema, IntegerOutOfRange) {
  EXPECT_THAT(error_of([] { typed("L0_sanity", {"config_kwargs.vocab_size=99999999999999999999"}); }),
              HasSubstr("config key 'config_kwargs.vocab_size': integer '99999999999999999999' is out of range"));
}

// ---- Range and shape checks (to_train_config) ----

TEST(ConfigChecks, BadValuesNameKeyAndValue) {
  const std::vector<BadInput> cases = {
      {{"config_kwargs.hidden_size=250"},
       "config_kwargs.hidden_size (250) must be divisible by config_kwargs.num_attention_heads (4)"},
      {{"config_kwargs.num_key_value_heads=3"},
       "config_kwargs.num_attention_heads (4) must be divisible by config_kwargs.num_key_value_heads (3)"},
      {{"config_kwargs.num_local_experts=3"},
       "config_kwargs.num_local_experts (3) must be divisible by parallelism.ep_size (2)"},
      {{"config_kwargs.num_experts_per_tok=5"},
       "config_kwargs.num_experts_per_tok (5) must be <= config_kwargs.num_local_experts (4)"},
      {{"config_kwargs.hidden_size=260"}, "= 260 / 4 = 65 must be even"},
      {{"config_kwargs.hidden_size=0"}, "config_kwargs.hidden_size must be positive, got 0"},
      {{"config_kwargs.vocab_size=-1"}, "config_kwargs.vocab_size must be positive, got -1"},
      {{"config_kwargs.intermediate_size=0"}, "config_kwargs.intermediate_size must be positive, got 0"},
      {{"config_kwargs.num_hidden_layers=0"}, "config_kwargs.num_hidden_layers must be positive, got 0"},
      {{"lm_head_chunk_tokens=0"}, "lm_head_chunk_tokens must be positive, got 0"},
      {{"config_kwargs.num_attention_heads=0"}, "config_kwargs.num_attention_heads must be positive, got 0"},
      {{"config_kwargs.num_key_value_heads=0"}, "config_kwargs.num_key_value_heads must be positive, got 0"},
      {{"config_kwargs.num_local_experts=0"}, "config_kwargs.num_local_experts must be positive, got 0"},
      {{"config_kwargs.num_experts_per_tok=0"}, "config_kwargs.num_experts_per_tok must be positive, got 0"},
      {{"config_kwargs.max_position_embeddings=64"},
       "dataset.max_seq_length (128) must be <= config_kwargs.max_position_embeddings (64)"},
      {{"config_kwargs.rope_theta=0"}, "config_kwargs.rope_theta must be positive, got 0"},
      {{"config_kwargs.rms_norm_eps=-1e-5"}, "config_kwargs.rms_norm_eps must be positive, got -1e-05"},
      {{"config_kwargs.initializer_range=-0.02"}, "config_kwargs.initializer_range must be >= 0, got -0.02"},
      {{"config_kwargs.router_aux_loss_coef=-0.01"}, "config_kwargs.router_aux_loss_coef must be >= 0, got -0.01"},
      {{"config_kwargs.router_jitter_noise=1.0"}, "config_kwargs.router_jitter_noise must be in [0, 1), got 1"},
      {{"config_kwargs.tie_word_embeddings=true"}, "config_kwargs.tie_word_embeddings=true is not supported"},
      {{"dataset.max_seq_length=512"},
       "dataset.max_seq_length (512) must be <= config_kwargs.max_position_embeddings (256)"},
      {{"dataset.max_seq_length=0"}, "dataset.max_seq_length must be positive, got 0"},
      {{"dataset.stride=128"}, "dataset.stride (128) must be >= 0 and smaller than dataset.max_seq_length (128)"},
      {{"dataset.stride=-1"}, "dataset.stride (-1) must be >= 0"},
      {{"dataset.micro_batch_size=0"}, "dataset.micro_batch_size must be positive, got 0"},
      {{"dataset.source=hdf5"}, "dataset.source must be one of embedded, random, fasta, fastq, mmidx, tokens, auto; got 'hdf5'"},
      {{"dataset.source=fasta"}, "dataset.paths must list at least one file when dataset.source is 'fasta'"},
      {{"dataset.paths=[a.fa]"}, "dataset.paths lists 1 file(s) but dataset.source is 'embedded'"},
      {{"dataset.token_dtype=int8"}, "dataset.token_dtype must be one of uint16, uint32; got 'int8'"},
      {{"dataset.eos_token_id=128256"},
       "dataset.eos_token_id (128256) must be in [0, config_kwargs.vocab_size (128256))"},
      {{"dataset.bos_token_id=-2"}, "dataset.bos_token_id (-2) must be in [0, config_kwargs.vocab_size (128256)) or -1"},
      {{"dataset.source=fasta", "dataset.paths=[a.fa,b.fa]", "dataset.weights=[1]"},
       "dataset.weights lists 1 weight(s) for 2 path(s)"},
      {{"dataset.source=fasta", "dataset.paths=[a.fa]", "dataset.weights=[0]"},
       "dataset.weights[0] must be a positive number, got 0"},
      {{"dataset.tokenizer=rna"}, "dataset.tokenizer must be one of byte, nucleotide, protein; got 'rna'"},
      {{"dataset.reverse_complement_prob=0.5"}, "dataset.reverse_complement_prob=0.5 needs dataset.tokenizer=nucleotide"},
      {{"dataset.reverse_complement_prob=2", "dataset.tokenizer=nucleotide"},
       "dataset.reverse_complement_prob must be in [0, 1], got 2"},
      {{"use_sequence_packing=true", "dataset.split_samples_in_token_packing=false", "dataset.pad_token_id=-1"},
       "set dataset.pad_token_id"},
      {{"dataset.prefetch=-1"}, "dataset.prefetch must be >= 0, got -1"},
      {{"adamw_kwargs.lr=-1e-3"}, "adamw_kwargs.lr must be >= 0, got -0.001"},
      {{"adamw_kwargs.betas=[0.9,1.0]"}, "adamw_kwargs.betas[1] must be in [0, 1), got 1"},
      {{"adamw_kwargs.betas=[-0.1,0.9]"}, "adamw_kwargs.betas[0] must be in [0, 1), got -0.1"},
      {{"adamw_kwargs.betas=[0.9]"}, "adamw_kwargs.betas must hold two values [beta1, beta2], got 1"},
      {{"adamw_kwargs.eps=0"}, "adamw_kwargs.eps must be positive, got 0"},
      {{"adamw_kwargs.weight_decay=-0.1"}, "adamw_kwargs.weight_decay must be >= 0, got -0.1"},
      {{"lr_scheduler_kwargs.min_lr_ratio=1.5"}, "lr_scheduler_kwargs.min_lr_ratio must be in [0, 1], got 1.5"},
      {{"lr_scheduler_kwargs.num_warmup_steps=-1"}, "lr_scheduler_kwargs.num_warmup_steps must be >= 0, got -1"},
      {{"lr_scheduler_kwargs.num_decay_steps=-5"}, "lr_scheduler_kwargs.num_decay_steps must be >= 0, got -5"},
      {{"grad_acc_steps=0"}, "grad_acc_steps must be >= 1, got 0"},
      {{"num_train_steps=0"}, "num_train_steps must be positive, got 0"},
      {{"max_grad_norm=0"}, "max_grad_norm must be positive, got 0"},
      {{"seed=-1"}, "seed must be >= 0, got -1"},
      {{"backend=tpu"}, "backend must be one of auto, cpu, cuda, cuda-fp32; got 'tpu'"},
      {{"adamw_moments_dtype=float16"}, "adamw_moments_dtype must be one of float32, bfloat16; got 'float16'"},
      {{"expert_grad_dtype=float16"}, "expert_grad_dtype must be one of float32, bfloat16; got 'float16'"},
      {{"expert_grad_dtype=bfloat16", "backend=cpu"},
       "expert_grad_dtype=bfloat16 needs the CUDA bf16 backend (backend=cuda or auto on a GPU), got backend=cpu"},
      {{"expert_grad_dtype=bfloat16", "backend=cuda-fp32"}, "got backend=cuda-fp32"},
      {{"expert_grad_dtype=bfloat16", "fp8_config.enabled=true"},
       "expert_grad_dtype=bfloat16 needs fp8_config.enabled=false"},
      {{"expert_grad_dtype=bfloat16", "grad_acc_steps=4", "expert_wgrad_micro_batches=3"},
       "expert_grad_dtype=bfloat16 needs expert_wgrad_micro_batches >= grad_acc_steps (4), so that one GEMM per step "
       "stores each expert gradient; got expert_wgrad_micro_batches=3"},
      {{"expert_grad_dtype=bfloat16", "parallelism.dp_size=2"},
       "expert_grad_dtype=bfloat16 needs parallelism.dp_size=1 (expert gradients are summed over dp replicas in "
       "fp32); got 2"},
      {{"expert_grad_dtype=bfloat16", "parallelism.ep_rebalance_interval=5"},
       "expert_grad_dtype=bfloat16 needs parallelism.ep_rebalance_interval=0"},
      {{"lm_head_grad_dtype=float16"}, "lm_head_grad_dtype must be one of float32, bfloat16; got 'float16'"},
      {{"lm_head_grad_dtype=bfloat16", "backend=cpu"},
       "lm_head_grad_dtype=bfloat16 needs the CUDA bf16 backend (backend=cuda or auto on a GPU), got backend=cpu"},
      {{"lm_head_grad_dtype=bfloat16", "grad_acc_steps=4", "lm_head_wgrad_micro_batches=3"},
       "lm_head_grad_dtype=bfloat16 needs lm_head_wgrad_micro_batches >= grad_acc_steps >= 2, so that one GEMM per "
       "step stores the LM head's gradient; got lm_head_wgrad_micro_batches=3, grad_acc_steps=4"},
      {{"lm_head_grad_dtype=bfloat16", "grad_acc_steps=1"},
       "got lm_head_wgrad_micro_batches=1, grad_acc_steps=1"},
      {{"lm_head_grad_dtype=bfloat16", "grad_acc_steps=2", "lm_head_wgrad_micro_batches=2",
        "parallelism.dp_size=2"},
       "lm_head_grad_dtype=bfloat16 needs one rank (dense gradients are summed over every rank in fp32); got "
       "parallelism.dp_size=2 x parallelism.ep_size=2"},
      {{"optimizer_store_param_remainders=true", "backend=cpu"},
       "optimizer_store_param_remainders=true needs the CUDA bf16 backend (backend=cuda or auto on a GPU), got "
       "backend=cpu"},
      {{"optimizer_store_param_remainders=true", "parallelism.ep_rebalance_interval=5"},
       "optimizer_store_param_remainders=true needs parallelism.ep_rebalance_interval=0 (expert moves carry the fp32 "
       "master); got 5"},
      {{"backend=cuda-fp32", "fp8_config.enabled=true"},
       "fp8_config.enabled=true needs backend=cuda (or cpu): backend=cuda-fp32 has no MXFP8 path"},
      {{"output_dir=''"}, "output_dir must not be empty"},
      {{"parallelism.dp_size=0"}, "parallelism.dp_size must be positive, got 0"},
      {{"parallelism.ep_size=0"}, "parallelism.ep_size must be positive, got 0"},
      {{"parallelism.ep_rebalance_interval=-1"}, "parallelism.ep_rebalance_interval must be >= 0, got -1"},
      {{"fp8_config.fp8_format=E5M2"}, "fp8_config.fp8_format must be one of E4M3, HYBRID; got 'E5M2'"},
      {{"fp8_config.fp8_recipe=DelayedScaling"},
       "fp8_config.fp8_recipe must be one of MXFP8BlockScaling; got 'DelayedScaling'"},
      {{"checkpoint.save_every_n_steps=-1"}, "checkpoint.save_every_n_steps must be >= 0, got -1"},
      {{"checkpoint.max_checkpoints=-2"}, "checkpoint.max_checkpoints must be >= 0, got -2"},
      {{"logger.frequency=0"}, "logger.frequency must be positive, got 0"},
      {{"dataset.source=random", "dataset.paths=[a.fa]"},
       "dataset.paths lists 1 file(s) but dataset.source is 'random', which reads none"},
      {{"validation.every_n_steps=-1"}, "validation.every_n_steps must be >= 0, got -1"},
      {{"validation.num_batches=0"}, "validation.num_batches must be positive, got 0"},
      {{"validation.every_n_steps=5"}, "validation.every_n_steps > 0 needs held-out data, but dataset.source is "
                                       "'embedded'"},
      {{"validation.every_n_steps=5", "dataset.source=fasta", "dataset.paths=[a.fa]"},
       "validation.every_n_steps=5 needs validation.paths"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.overrides[0]);
    EXPECT_THAT(error_of([&] { typed("L0_sanity", c.overrides); }), HasSubstr(c.expected));
  }
}

TEST(ConfigChecks, ReadingAnUncheckedNodeStillNamesTheKey) {
  YAML::Node n = resolve("L0_sanity");
  n["dataset"].remove("stride");
  EXPECT_THAT(error_of([&] { to_train_config(n); }), HasSubstr("missing config key 'dataset.stride'"));
  YAML::Node m = resolve("L0_sanity");
  m["seed"] = "x";
  EXPECT_THAT(error_of([&] { to_train_config(m); }), HasSubstr("config key 'seed' must be an integer, got 'x'"));
}

// ---- Run checks ----

TEST(ConfigRun, WorldSizeMustMatchDpTimesEp) {
  const TrainConfig c = typed("L0_sanity");
  EXPECT_THAT(error_of([&] { validate_for_run(c, 1); }),
              HasSubstr("parallelism.dp_size (1) x parallelism.ep_size (2) = 2 but the job has 1 rank(s); run "
                        "under mpirun -np 2 or set parallelism.ep_size=1"));
  EXPECT_NO_THROW(validate_for_run(c, 2));
  EXPECT_THAT(error_of([] { validate_for_run(typed("L1_8x7B_ep"), 4); }),
              HasSubstr("= 8 but the job has 4 rank(s); run under mpirun -np 8 or set parallelism.ep_size=4"));
  EXPECT_THAT(error_of([&] { validate_for_run(c, 0); }), HasSubstr("the job has 0 rank(s)"));
}

TEST(ConfigRun, DataFilesMustExistAndBeFiles) {
  TempDir dir;
  const std::string good = dir.write("a.fa", ">r\nACGT\n");
  auto with_paths = [](const std::string& p) {
    return typed("L0_sanity", {"dataset.source=fasta", "dataset.paths=[" + p + "]"});
  };
  EXPECT_NO_THROW(validate_for_run(with_paths(good), 2));
  const std::string missing = dir.str() + "/y.fa";
  EXPECT_THAT(error_of([&] { validate_for_run(with_paths(missing), 2); }),
              HasSubstr("dataset.paths: file not found: " + missing));
  EXPECT_THAT(error_of([&] { validate_for_run(with_paths(dir.str()), 2); }),
              HasSubstr("dataset.paths: not a regular file: " + dir.str()));
}

TEST(ConfigRun, DataPipelineKeysAndIndexedDatasetPrefixes) {
  TempDir dir;
  dir.write("d.idx", "x");
  const TrainConfig c = typed("L0_sanity", {"dataset.source=mmidx", "dataset.paths=[" + dir.str() + "/d, x*.fa]",
                                            "dataset.weights=[3, 1.5]", "dataset.tokenizer=nucleotide",
                                            "dataset.reverse_complement_prob=0.5", "use_sequence_packing=true",
                                            "dataset.bos_token_id=2", "dataset.skip_bad_records=true"});
  EXPECT_EQ(c.dataset.weights, (std::vector<double>{3, 1.5}));
  EXPECT_EQ(c.dataset.tokenizer, "nucleotide");
  EXPECT_DOUBLE_EQ(c.dataset.reverse_complement_prob, 0.5);
  EXPECT_TRUE(c.dataset.sequence_packing);
  EXPECT_TRUE(c.dataset.split_samples_in_token_packing);
  EXPECT_EQ(c.dataset.bos_token_id, 2);
  EXPECT_TRUE(c.dataset.skip_bad_records);
  // A prefix needs both files; a glob is checked when it is expanded, not here.
  EXPECT_THAT(error_of([&] { validate_for_run(c, 2); }),
              HasSubstr("dataset.paths: indexed dataset " + dir.str() + "/d: file not found: " + dir.str() + "/d.bin"));
  dir.write("d.bin", "");
  EXPECT_NO_THROW(validate_for_run(c, 2));
}

TEST(ConfigRun, UnreadableDataFile) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads any file";
  TempDir dir;
  const std::string p = dir.write("locked.fa", ">r\nACGT\n");
  fs::permissions(p, fs::perms::none);
  const TrainConfig c = typed("L0_sanity", {"dataset.source=fasta", "dataset.paths=[" + p + "]"});
  EXPECT_THAT(error_of([&] { validate_for_run(c, 2); }), HasSubstr("dataset.paths: cannot read file: " + p));
}

TEST(ConfigRun, PretrainedDirectoryMustExist) {
  const TrainConfig c = typed("L0_sanity", {"init_from_pretrained=/nonexistent/mixtral"});
  EXPECT_THAT(error_of([&] { validate_for_run(c, 2); }),
              HasSubstr("init_from_pretrained: directory not found: /nonexistent/mixtral"));
}

// ---- Files, defaults lists, --config-path ----

TEST(ConfigFiles, NestedDefaultsMergeInOrder) {
  TempDir dir;
  dir.write("base.yaml", "defaults: [defaults, model/mixtral-8x1B, _self_]\nseed: 7\nnum_train_steps: 10\n");
  dir.write("top.yaml", "defaults: [base, _self_]\nnum_train_steps: 20\ndataset:\n  stride: 8\n"
                        "adamw_kwargs:\n  betas: [0.8, 0.9]\n");
  dir.write("self_first.yaml", "defaults: [_self_, base]\nnum_train_steps: 20\n");
  dir.write("implicit_self.yaml", "defaults: [base]\nnum_train_steps: 30\n");
  const TrainConfig top = typed("top", {}, dir.str());
  EXPECT_EQ(top.seed, 7u);                      // from base
  EXPECT_EQ(top.model.hidden_size, 2048);       // from base's built-in model file
  EXPECT_EQ(top.num_train_steps, 20);           // top's own keys come last
  EXPECT_EQ(top.dataset.stride, 8);             // maps merge key by key...
  EXPECT_EQ(top.dataset.max_seq_length, 128);   // ...keeping the rest
  EXPECT_DOUBLE_EQ(top.adamw.beta1, 0.8);       // lists are replaced whole
  EXPECT_EQ(typed("self_first", {}, dir.str()).num_train_steps, 10);
  EXPECT_EQ(typed("implicit_self", {}, dir.str()).num_train_steps, 30);  // _self_ defaults to last
}

TEST(ConfigFiles, EachConfigIsMergedOnce) {
  TempDir dir;
  dir.write("base.yaml", "defaults: [defaults, _self_]\nseed: 7\n");
  // Listing defaults again after base must not reset base's seed.
  dir.write("top.yaml", "defaults: [base, defaults, _self_]\n");
  EXPECT_EQ(typed("top", {}, dir.str()).seed, 7u);
}

TEST(ConfigFiles, ConfigPathShadowsBuiltInsAndFallsBackToThem) {
  TempDir dir;
  dir.write("model/mixtral-8x1B.yaml", "config_kwargs:\n  hidden_size: 1024\n");
  dir.write("mine.yml", "defaults: [L0_sanity, model/mixtral-8x1B]\nnum_train_steps: 3\n");
  const TrainConfig c = typed("mine", {}, dir.str());
  EXPECT_EQ(c.model.hidden_size, 1024);  // the directory's model file
  EXPECT_EQ(c.model.num_hidden_layers, 2);  // L0_sanity, built in
  EXPECT_EQ(c.num_train_steps, 3);
}

TEST(ConfigFiles, UnknownKeyInAFileSuggestsTheNearest) {
  TempDir dir;
  dir.write("x.yaml", "defaults: [defaults]\ndataset:\n  micro_batch_sise: 2\n");
  EXPECT_THAT(error_of([&] { resolve("x", {}, dir.str()); }),
              HasSubstr("unknown config key 'dataset.micro_batch_sise'; did you mean 'dataset.micro_batch_size'?"));
}

TEST(ConfigFiles, MandatoryValueMustBeSet) {
  TempDir dir;
  dir.write("x.yaml", "defaults: [defaults]\nnum_train_steps: ???\n");
  EXPECT_THAT(error_of([&] { resolve("x", {}, dir.str()); }),
              HasSubstr("config key 'num_train_steps' is mandatory but has no value"));
  EXPECT_EQ(typed("x", {"num_train_steps=5"}, dir.str()).num_train_steps, 5);
}

TEST(ConfigFiles, BadFilesAndListsNameTheFile) {
  TempDir dir;
  const std::string d = dir.str();
  dir.write("nodefaults.yaml", "num_train_steps: 5\n");
  dir.write("syntax.yaml", "defaults: [defaults]\nseed: 1\n  oops: 2\n");
  dir.write("dup.yaml", "defaults: [defaults]\nseed: 1\nseed: 2\n");
  dir.write("list.yaml", "- a\n- b\n");
  dir.write("defaults_scalar.yaml", "defaults: 3\n");
  dir.write("defaults_map.yaml", "defaults:\n  - model: mixtral-8x7B\n");
  dir.write("two_selves.yaml", "defaults: [_self_, defaults, _self_]\n");
  dir.write("a.yaml", "defaults: [b]\n");
  dir.write("b.yaml", "defaults: [a]\n");
  dir.write("missing_entry.yaml", "defaults: [defaults, model/nope]\n");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"nodefaults", "missing config key 'config_kwargs'"},
      {"syntax", d + "/syntax.yaml:3:7: YAML syntax error"},
      {"dup", d + "/dup.yaml:3: duplicate key 'seed'"},
      {"list", d + "/list.yaml: a config file must be a map of keys"},
      {"defaults_scalar", d + "/defaults_scalar.yaml: 'defaults' must be a list of config names"},
      {"defaults_map", d + "/defaults_map.yaml: defaults list entry a map is not a config name"},
      {"two_selves", d + "/two_selves.yaml: defaults list names _self_ more than once"},
      {"a", "config 'a' includes itself through its defaults list: a -> b -> a"},
      {"missing_entry", "config 'model/nope' (named in the defaults list of " + d + "/missing_entry.yaml) not found"},
      {"L0_sanitty", "config 'L0_sanitty' not found in config path '" + d + "'"},
      {"L0_sanitty", "did you mean 'L0_sanity'?"},
  };
  for (const auto& [name, expected] : cases) {
    SCOPED_TRACE(name);
    EXPECT_THAT(error_of([&] { resolve(name, {}, d); }), HasSubstr(expected));
  }
}

TEST(ConfigFiles, ConfigPathMustBeADirectory) {
  EXPECT_THAT(error_of([] { resolve("L0_sanity", {}, "/nonexistent/configs"); }),
              HasSubstr("config path '/nonexistent/configs' is not a directory"));
}

// ---- Printing ----

TEST(ConfigDump, PrintedConfigReadsBackTheSame) {
  const YAML::Node n = resolve("L1_8x7B_ep", {"dataset.source=fasta", "dataset.paths=[a.fa]", "output_dir='007'",
                                              "+note='true'"});
  const std::string text = dump_config(n);
  EXPECT_THAT(text, HasSubstr("betas: [0.9, 0.95]"));
  EXPECT_THAT(text, HasSubstr("lr: 3e-3"));        // numbers keep their text
  EXPECT_THAT(text, HasSubstr("ckpt_dir: null"));
  const YAML::Node back = YAML::Load(text);
  EXPECT_EQ(dump_config(back), text);
  EXPECT_EQ(cfg::kind_of(back["note"]), cfg::Kind::String);  // quoted stays quoted
  EXPECT_EQ(cfg::kind_of(back["output_dir"]), cfg::Kind::String);
  const TrainConfig a = to_train_config(n), b = to_train_config(back);
  EXPECT_EQ(b.output_dir, "007");
  EXPECT_EQ(b.dataset.paths, a.dataset.paths);
  EXPECT_DOUBLE_EQ(b.adamw.lr, a.adamw.lr);
  EXPECT_DOUBLE_EQ(b.model.rope_theta, a.model.rope_theta);
  EXPECT_EQ(b.fp8.enabled, a.fp8.enabled);
}

TEST(ConfigDump, APrintedConfigIsAConfigOfItsOwn) {
  // What a checkpoint stores can be run again with --config-path.
  TempDir dir;
  const std::string text = dump_config(resolve("L0_sanity", {"seed=5"}));
  dir.write("saved.yaml", text);
  EXPECT_EQ(dump_config(resolve("saved", {}, dir.str())), text);
}

}  // namespace
}  // namespace mxt
