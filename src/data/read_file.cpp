// Whole-file reads with the error messages every data source shares (missing, directory, unreadable).
#include "data/read_file.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "mxtrain/data.hpp"

namespace mxt::detail {

std::string read_whole_file(const std::string& path, const char* what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw DataError(std::string(what) + " '" + path + "' does not exist");
  if (fs::is_directory(path, ec)) throw DataError(std::string(what) + " '" + path + "' is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(std::string("cannot open ") + what + " '" + path + "' for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw DataError(std::string("error reading ") + what + " '" + path + "'");
  return ss.str();
}

}  // namespace mxt::detail
