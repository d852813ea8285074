// Command-line parsing with CLI11. Config overrides are the positional arguments; they are checked later,
// by resolve_config, against the config they change.
#include "mxtrain/cli.hpp"

#include <CLI/CLI.hpp>

#include <sstream>
#include <string>

#include "mxtrain/version.hpp"

namespace mxt {

namespace {

std::string footer() {
  std::string names;
  for (const auto& entry : embedded_configs()) names += (names.empty() ? "" : ", ") + entry.first;
  return "Overrides (Hydra style): key=value changes a key (adamw_kwargs.lr=1e-4, "
         "adamw_kwargs.betas=[0.9,0.99]),\n+key=value adds one, ++key=value sets or adds, ~key removes one.\n"
         "Built-in configs: " + names + ".\n"
         "Subcommand: mxtrain preprocess --help (FASTA/FASTQ -> Megatron indexed dataset).\n"
         "Examples:\n  mpirun -np 2 mxtrain --config-name L0_sanity\n"
         "  mpirun -np 8 mxtrain --config-name L1_8x7B_ep checkpoint.ckpt_dir=/path/to/ckpt\n";
}

// `mxtrain preprocess ...`: its own option set (no config, no overrides).
CliOptions parse_preprocess(int argc, const char* const* argv) {
  CliOptions o;
  o.preprocess = true;
  PreprocessOptions& p = o.preprocess_options;
  CLI::App app{"mxtrain preprocess: FASTA/FASTQ (plain or gzip) -> a Megatron indexed dataset (<prefix>.bin and "
               "<prefix>.idx, one sequence per record), read by dataset.source=mmidx",
               "mxtrain preprocess"};
  app.add_option("-i,--input", p.inputs, "FASTA/FASTQ files or globs, in order")->required();
  app.add_option("-o,--output-prefix", p.output_prefix, "writes PREFIX.bin and PREFIX.idx")->required();
  app.add_option("--format", p.format, "auto (from the file name), fasta or fastq")->capture_default_str();
  app.add_option("--tokenizer", p.tokenizer, "nucleotide, protein or byte (as dataset.tokenizer)")
      ->capture_default_str();
  app.add_option("--dtype", p.dtype, "token type in the .bin: auto (smallest), uint8, uint16, int32, int64")
      ->capture_default_str();
  app.add_flag("--uppercase,!--keep-case", p.uppercase, "upper-case residues (default) or keep their case");
  app.add_option("--bos-token-id", p.bos_token_id, "token before each record; -1: none")->capture_default_str();
  app.add_option("--eos-token-id", p.eos_token_id, "token after each record; -1: none")->capture_default_str();
  app.add_flag("--skip-bad-records", p.skip_bad_records, "skip malformed records (counted) instead of failing");
  app.add_option("--progress-interval", p.progress_interval_s, "seconds between progress lines")
      ->capture_default_str();
  try {
    app.parse(argc - 1, argv + 1);
  } catch (const CLI::ParseError& e) {
    std::ostringstream out, err;
    const int code = app.exit(e, out, err);
    o.should_exit = true;
    o.exit_code = code == 0 ? 0 : 2;
    o.message = code == 0 ? out.str() : err.str();
  }
  return o;
}

}  // namespace

CliOptions parse_cli(int argc, const char* const* argv) {
  if (argc > 1 && std::string(argv[1]) == "preprocess") return parse_preprocess(argc, argv);
  CliOptions o;
  o.load.config_name = "L0_sanity";
  std::string cfg_kind;

  CLI::App app{"mxtrain: Mixtral mixture-of-experts training (BioNeMo Mixtral native TE recipe, in C++)",
               "mxtrain"};
  app.add_option("--config-name", o.load.config_name, "config to run: a built-in name or one in --config-path")
      ->capture_default_str();
  app.add_option("--config-path", o.load.config_path,
                 "directory searched for configs before the built-in ones");
  app.add_option("-c,--cfg", cfg_kind, "'job': print the resolved config and exit")
      ->check(CLI::IsMember({"job"}));
  app.add_flag("--dry-run", o.dry_run, "resolve and validate the config and plan memory, without training");
  app.add_option("--dump-first-batch", o.dump_dir,
                 "write loss, logits and gradients of the first micro-batch to DIR, without training");
  app.add_flag("--version", o.show_version, "print the version and exit");
  app.add_option("overrides", o.load.overrides, "config overrides: key=value, +key=value, ~key");
  app.footer(footer());

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::ostringstream out, err;
    const int code = app.exit(e, out, err);  // formats help or the error; exits nothing
    o.should_exit = true;
    o.exit_code = code == 0 ? 0 : 2;
    o.message = code == 0 ? out.str() : err.str();
    return o;
  }
  o.print_config = cfg_kind == "job";
  if (o.show_version) {
    o.should_exit = true;
    o.message = "mxtrain " + version_string() + "\n";
  }
  return o;
}

}  // namespace mxt
