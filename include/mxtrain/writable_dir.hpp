#pragma once
// Directories a run writes into (checkpoint.ckpt_dir, output_dir), checked at start: a directory that cannot be
// created or written should stop the run in seconds, not after minutes of set-up or hours of training.
#include <string>

namespace mxt {

// "" when `dir` can be created and written: it is created, and a probe file is written and removed. Else the
// problem, naming the config key (`key=dir`) and the system's reason.
std::string writable_dir_problem(const std::string& key, const std::string& dir);

}  // namespace mxt
