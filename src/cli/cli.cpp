// Command-line parsing with CLI11. Config overrides are the positional arguments; they are checked later,
// by resolve_config, against the config they change.
#include "mxtrain/cli.hpp"

#include <CLI/CLI.hpp>

#include <sstream>

#ifndef MXTRAIN_VERSION
#define MXTRAIN_VERSION "unknown"
#endif

namespace mxt {

namespace {

std::string footer() {
  std::string names;
  for (const auto& entry : embedded_configs()) names += (names.empty() ? "" : ", ") + entry.first;
  return "Overrides (Hydra style): key=value changes a key (adamw_kwargs.lr=1e-4, "
         "adamw_kwargs.betas=[0.9,0.99]),\n+key=value adds one, ++key=value sets or adds, ~key removes one.\n"
         "Built-in configs: " + names + ".\n"
         "Examples:\n  mpirun -np 2 mxtrain --config-name L0_sanity\n"
         "  mpirun -np 8 mxtrain --config-name L1_8x7B_ep checkpoint.ckpt_dir=/path/to/ckpt\n";
}

}  // namespace

CliOptions parse_cli(int argc, const char* const* argv) {
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
    o.message = "mxtrain " MXTRAIN_VERSION "\n";
  }
  return o;
}

}  // namespace mxt
