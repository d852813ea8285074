#pragma once
// Reading a data file whole; throws DataError naming `what` and the path.
#include <string>

namespace mxt::detail {

// Data inputs here are training shards that fit in memory, so one read is simplest.
std::string read_whole_file(const std::string& path, const char* what);

}  // namespace mxt::detail
