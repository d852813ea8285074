// Typed token storage shared by every source, and the two memory-mapped ones: Megatron's MMIDIDX indexed
// dataset and flat token files. All integers on disk are little-endian (as Megatron writes them with numpy on
// x86); they are decoded with memcpy, so unaligned offsets (the .idx arrays start at byte 34) are fine.
//
// MMIDIDX .idx layout (megatron/core/datasets/indexed_dataset.py, _IndexWriter):
//   9 bytes  "MMIDIDX\0\0"
//   u64      version, 1
//   u8       dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
//   u64      sequence count N
//   u64      document count M (entries of the document index: documents + 1)
//   i32[N]   sequence lengths, in tokens
//   i64[N]   sequence pointers, byte offsets into the .bin
//   i64[M]   document indices: 0, then the sequence index that ends each document
//   i8[N]    sequence modes (only in multimodal datasets; recognised by the file size)
// Megatron's GPTDataset samples over sequences, so each sequence is one document here.
#include "data/token_source.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

namespace mxt::detail {

namespace {

// A read-only mapping of a whole file; an empty file maps to nothing.
struct Mapping {
  const uint8_t* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data && size) munmap(const_cast<uint8_t*>(data), size);
  }
};

std::shared_ptr<Mapping> map_file(const std::string& path, const char* what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw DataError(std::string(what) + " '" + path + "' does not exist");
  if (fs::is_directory(path, ec)) throw DataError(std::string(what) + " '" + path + "' is a directory");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(std::string("cannot open ") + what + " '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    throw DataError(std::string("cannot stat ") + what + " '" + path + "'");
  }
  auto m = std::make_shared<Mapping>();
  m->size = static_cast<size_t>(st.st_size);
  if (m->size > 0) {
    void* p = mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw DataError(std::string("cannot memory-map ") + what + " '" + path + "': " + std::strerror(errno));
    }
    m->data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid
  return m;
}

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

size_t dtype_size(TokenDType t) {
  switch (t) {
    case TokenDType::U8: case TokenDType::I8: return 1;
    case TokenDType::I16: case TokenDType::U16: return 2;
    case TokenDType::I32: case TokenDType::U32: case TokenDType::F32: return 4;
    case TokenDType::I64: case TokenDType::F64: return 8;
  }
  return 0;
}

const char* dtype_name(TokenDType t) {
  switch (t) {
    case TokenDType::U8: return "uint8";
    case TokenDType::I8: return "int8";
    case TokenDType::I16: return "int16";
    case TokenDType::I32: return "int32";
    case TokenDType::I64: return "int64";
    case TokenDType::F64: return "float64";
    case TokenDType::F32: return "float32";
    case TokenDType::U16: return "uint16";
    case TokenDType::U32: return "uint32";
  }
  return "?";
}

bool dtype_from_code(int code, TokenDType& out) {
  if (code < 1 || code > 8) return false;
  out = static_cast<TokenDType>(code);
  return true;
}

void TokenBuffer::store(uint8_t* p, int32_t v) const {
  switch (dtype_) {
    case TokenDType::U8: *p = static_cast<uint8_t>(v); break;
    case TokenDType::U16: { const uint16_t x = static_cast<uint16_t>(v); std::memcpy(p, &x, 2); break; }
    default: std::memcpy(p, &v, 4); break;  // I32 (the only other type a buffer is made with)
  }
}

void TokenBuffer::append(const int32_t* v, size_t n) {
  const size_t at = bytes_.size();
  bytes_.resize(at + n * width_);
  uint8_t* p = bytes_.data() + at;
  for (size_t i = 0; i < n; ++i, p += width_) store(p, v[i]);
}

std::shared_ptr<TokenSource> TokenSource::from_buffer(std::string name, TokenBuffer buf, std::vector<int64_t> ends,
                                                      std::string unit) {
  std::shared_ptr<TokenSource> s(new TokenSource());
  s->name_ = std::move(name);
  s->unit_ = std::move(unit);
  s->dtype_ = buf.dtype();
  s->width_ = dtype_size(s->dtype_);
  auto bytes = std::make_shared<std::vector<uint8_t>>(std::move(buf.bytes()));
  s->data_ = bytes->data();
  s->owner_ = bytes;
  s->start_.assign(1, 0);
  s->start_.insert(s->start_.end(), ends.begin(), ends.end());
  return s;
}

std::shared_ptr<TokenSource> TokenSource::from_tokens(std::string name, std::vector<int32_t> tokens) {
  std::shared_ptr<TokenSource> s(new TokenSource());
  s->name_ = std::move(name);
  s->dtype_ = TokenDType::I32;
  s->width_ = 4;
  auto v = std::make_shared<std::vector<int32_t>>(std::move(tokens));
  s->data_ = reinterpret_cast<const uint8_t*>(v->data());
  s->owner_ = v;
  s->start_ = {0, static_cast<int64_t>(v->size())};
  return s;
}

std::shared_ptr<TokenSource> TokenSource::open_token_file(const std::string& path, TokenDType dtype) {
  auto m = map_file(path, "token file");
  const size_t w = dtype_size(dtype);
  if (m->size == 0) throw DataError("token file '" + path + "' is empty");
  if (m->size % w != 0)
    throw DataError("token file '" + path + "': size " + std::to_string(m->size) + " bytes is not a multiple of " +
                    std::to_string(w) + " (" + dtype_name(dtype) + ")");
  std::shared_ptr<TokenSource> s(new TokenSource());
  s->name_ = path;
  s->unit_ = "file";
  s->dtype_ = dtype;
  s->width_ = w;
  s->data_ = m->data;
  s->owner_ = m;
  s->start_ = {0, static_cast<int64_t>(m->size / w)};
  return s;
}

std::shared_ptr<TokenSource> TokenSource::open_mmidx(const std::string& path) {
  std::string prefix = path;
  for (const char* ext : {".idx", ".bin"})
    if (prefix.size() > 4 && prefix.compare(prefix.size() - 4, 4, ext) == 0) prefix.resize(prefix.size() - 4);
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  auto idx = map_file(idx_path, "indexed dataset index");
  const uint8_t* p = idx->data;
  const size_t size = idx->size;
  auto bad = [&](const std::string& what) { return DataError("indexed dataset index '" + idx_path + "': " + what); };

  constexpr size_t kHeader = 34;  // magic 9 + version 8 + dtype 1 + counts 16
  if (size == 0) throw bad("the file is empty");
  static const char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
  if (size < 9 || std::memcmp(p, kMagic, 9) != 0)
    throw bad("not a Megatron indexed dataset (no \"MMIDIDX\" magic at the start)");
  if (size < kHeader)
    throw bad("truncated: " + std::to_string(size) + " bytes, shorter than the " + std::to_string(kHeader) +
              "-byte header");
  const uint64_t version = load<uint64_t>(p + 9);
  if (version != 1) throw bad("version " + std::to_string(version) + ", expected 1");
  TokenDType dtype;
  const int code = p[17];
  if (!dtype_from_code(code, dtype))
    throw bad("unknown dtype code " + std::to_string(code) + " (Megatron defines 1..8)");
  const uint64_t n = load<uint64_t>(p + 18), m = load<uint64_t>(p + 26);
  // Guard the size arithmetic against absurd counts from a corrupt header.
  if (n > (size_t{1} << 40) || m > (size_t{1} << 40))
    throw bad("implausible counts: " + std::to_string(n) + " sequences, " + std::to_string(m) + " document indices");
  const size_t need = kHeader + n * 4 + n * 8 + m * 8;
  if (size < need)
    throw bad("truncated: " + std::to_string(n) + " sequences and " + std::to_string(m) +
              " document indices need " + std::to_string(need) + " bytes, the file has " + std::to_string(size));
  if (size != need && size != need + n)  // + n: one int8 mode per sequence (multimodal)
    throw bad(std::to_string(size - need) + " unexpected bytes after the document indices (expected 0, or " +
              std::to_string(n) + " sequence modes)");
  if (n == 0) throw bad("holds no sequences");

  auto bin = map_file(bin_path, "indexed dataset data");
  const size_t w = dtype_size(dtype);
  std::shared_ptr<TokenSource> s(new TokenSource());
  s->name_ = prefix;
  s->unit_ = "sequence";
  s->dtype_ = dtype;
  s->width_ = w;
  s->data_ = bin->data;
  s->owner_ = bin;
  s->start_.resize(n + 1);
  s->start_[0] = 0;
  const uint8_t* lens = p + kHeader;
  const uint8_t* ptrs = lens + n * 4;
  const uint8_t* docs = ptrs + n * 8;
  bool contiguous = true;
  std::vector<int64_t> ptr(n);
  for (uint64_t i = 0; i < n; ++i) {
    const int32_t len = load<int32_t>(lens + i * 4);
    const int64_t at = load<int64_t>(ptrs + i * 8);
    if (len < 0) throw bad("sequence " + std::to_string(i + 1) + " has negative length " + std::to_string(len));
    if (at < 0) throw bad("sequence " + std::to_string(i + 1) + " has negative pointer " + std::to_string(at));
    const uint64_t end = static_cast<uint64_t>(at) + static_cast<uint64_t>(len) * w;
    if (end > bin->size)
      throw DataError("indexed dataset data '" + bin_path + "' is shorter than its index says: sequence " +
                      std::to_string(i + 1) + " of " + std::to_string(n) + " needs bytes [" + std::to_string(at) +
                      ", " + std::to_string(end) + ") but the file has " + std::to_string(bin->size) + " bytes");
    s->start_[i + 1] = s->start_[i] + len;
    ptr[i] = at;
    contiguous = contiguous && at == s->start_[i] * static_cast<int64_t>(w);
  }
  if (!contiguous) s->ptr_ = std::move(ptr);
  // The document index is not needed to read, but a broken one means a broken file.
  int64_t prev = -1;
  for (uint64_t j = 0; j < m; ++j) {
    const int64_t v = load<int64_t>(docs + j * 8);
    if ((j == 0 && v != 0) || v < prev || v > static_cast<int64_t>(n))
      throw bad("document index " + std::to_string(j) + " is " + std::to_string(v) +
                " (expected 0 first, then non-decreasing sequence indices up to " + std::to_string(n) + ")");
    prev = v;
  }
  if (s->total_tokens() == 0) throw bad("its " + std::to_string(n) + " sequences hold no tokens");
  return s;
}

void TokenSource::convert(int64_t d, int64_t off, int64_t n, int32_t* out) const {
  const uint8_t* p = data_ + (ptr_.empty() ? start_[d] * static_cast<int64_t>(width_) : ptr_[d]) +
                     off * static_cast<int64_t>(width_);
  int64_t bad_at = -1;
  double bad_value = 0;
  auto put = [&](int64_t i, auto v) {
    using V = decltype(v);
    bool ok;
    if constexpr (std::is_floating_point_v<V>)
      ok = v >= 0 && v < static_cast<V>(limit_) && std::floor(v) == v;
    else
      ok = v >= 0 && static_cast<int64_t>(v) < limit_;
    if (!ok && bad_at < 0) bad_at = i, bad_value = static_cast<double>(v);
    out[i] = ok ? static_cast<int32_t>(v) : 0;
  };
  switch (dtype_) {
    case TokenDType::U8: for (int64_t i = 0; i < n; ++i) put(i, p[i]); break;
    case TokenDType::I8: for (int64_t i = 0; i < n; ++i) put(i, static_cast<int8_t>(p[i])); break;
    case TokenDType::I16: for (int64_t i = 0; i < n; ++i) put(i, load<int16_t>(p + 2 * i)); break;
    case TokenDType::U16: for (int64_t i = 0; i < n; ++i) put(i, load<uint16_t>(p + 2 * i)); break;
    case TokenDType::I32: for (int64_t i = 0; i < n; ++i) put(i, load<int32_t>(p + 4 * i)); break;
    case TokenDType::U32: for (int64_t i = 0; i < n; ++i) put(i, load<uint32_t>(p + 4 * i)); break;
    case TokenDType::I64: for (int64_t i = 0; i < n; ++i) put(i, load<int64_t>(p + 8 * i)); break;
    case TokenDType::F32: for (int64_t i = 0; i < n; ++i) put(i, load<float>(p + 4 * i)); break;
    case TokenDType::F64: for (int64_t i = 0; i < n; ++i) put(i, load<double>(p + 8 * i)); break;
  }
  if (bad_at >= 0) {
    char value[64];
    std::snprintf(value, sizeof value, "%.17g", bad_value);
    throw DataError("'" + name_ + "' " + doc_label(d) + ", token offset " + std::to_string(off + bad_at) +
                    ": token " + value + " (" + dtype_name(dtype_) + ") is not a token id in [0, " +
                    std::to_string(limit_) + ") (the vocabulary)");
  }
}

void TokenSource::read_doc(int64_t d, int64_t off, int64_t n, int32_t* out) const {
  if (d < 0 || d >= num_docs() || off < 0 || n < 0 || off + n > doc_len(d))
    throw std::out_of_range("TokenSource::read_doc: " + name_ + " doc " + std::to_string(d) + " [" +
                            std::to_string(off) + ", +" + std::to_string(n) + ")");
  convert(d, off, n, out);
}

void TokenSource::read_stream(int64_t at, int64_t n, int32_t* out) const {
  if (at < 0 || n < 0 || at + n > total_tokens())
    throw std::out_of_range("TokenSource::read_stream: " + name_ + " [" + std::to_string(at) + ", +" +
                            std::to_string(n) + ") of " + std::to_string(total_tokens()));
  int64_t d = std::upper_bound(start_.begin(), start_.end(), at) - start_.begin() - 1;
  while (n > 0) {
    const int64_t take = std::min(n, start_[d + 1] - at);
    if (take > 0) convert(d, at - start_[d], take, out);
    out += take, at += take, n -= take;
    ++d;
  }
}

}  // namespace mxt::detail
