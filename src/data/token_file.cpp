// Flat binary token files (e.g. a pre-tokenized corpus dumped from numpy): little-endian uint16 or uint32,
// decoded byte by byte so the result does not depend on the host's endianness.
#include <cstdint>
#include <string>
#include <vector>

#include "data/read_file.hpp"
#include "mxtrain/data.hpp"

namespace mxt {

std::vector<int32_t> read_token_file(const std::string& path, const std::string& dtype) {
  size_t width = 0;
  if (dtype == "uint16") width = 2;
  else if (dtype == "uint32") width = 4;
  else throw DataError("token file '" + path + "': unknown token_dtype '" + dtype + "' (expected uint16 or uint32)");

  const std::string bytes = detail::read_whole_file(path, "token file");
  if (bytes.empty()) throw DataError("token file '" + path + "' is empty");
  if (bytes.size() % width != 0)
    throw DataError("token file '" + path + "': size " + std::to_string(bytes.size()) +
                    " bytes is not a multiple of " + std::to_string(width) + " (" + dtype + ")");

  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size() / width;
  std::vector<int32_t> tokens(n);
  for (size_t i = 0; i < n; ++i, p += width) {
    uint32_t v = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8;
    if (width == 4) v |= static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
    // Token ids are int32 downstream; larger uint32 values cannot be represented.
    if (v > static_cast<uint32_t>(INT32_MAX))
      throw DataError("token file '" + path + "': token " + std::to_string(v) + " at token offset " +
                      std::to_string(i) + " does not fit in int32");
    tokens[i] = static_cast<int32_t>(v);
  }
  return tokens;
}

}  // namespace mxt
