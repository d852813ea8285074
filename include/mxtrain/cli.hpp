#pragma once
// The command line, in the shape of the recipe's Hydra entry point:
//   mxtrain [--config-name NAME] [--config-path DIR] [--cfg job] [--dry-run] [key=value | +key=value | ~key ...]
//   mxtrain preprocess --input FILE [--input FILE ...] --output-prefix PREFIX [options]
#include <string>

#include "mxtrain/config.hpp"
#include "mxtrain/data.hpp"

namespace mxt {

struct CliOptions {
  LoadOptions load;           // --config-name (default L0_sanity), --config-path, the overrides in order
  bool print_config = false;  // --cfg job: print the resolved config as YAML and exit (as Hydra does)
  bool dry_run = false;       // --dry-run: resolve, validate and plan, but do not train
  std::string dump_dir;       // --dump-first-batch DIR: loss, logits and gradients of one batch (parity checks)
  bool show_version = false;  // --version
  // `mxtrain preprocess --input F... --output-prefix P [...]`: build an indexed dataset and exit.
  bool preprocess = false;
  PreprocessOptions preprocess_options;
  // Parsing ends the program (--help, --version, a usage error): main prints `message` (to stdout when
  // exit_code is 0, else to stderr) and returns exit_code. parse_cli never calls exit() itself.
  bool should_exit = false;
  int exit_code = 0;  // 0 for --help / --version, 2 for usage errors
  std::string message;
};

// Accepts main's char** as well.
CliOptions parse_cli(int argc, const char* const* argv);

}  // namespace mxt
