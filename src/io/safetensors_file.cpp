// Low-level safetensors reading (mmap + full header validation) and writing (F32 / BF16, atomic).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "mxtrain/cpus.hpp"
#include "mxtrain/safetensors.hpp"

namespace mxt {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;  // the format's own limit

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw SafetensorsError("safetensors " + path + ": " + what);
}
[[noreturn]] void fail_tensor(const std::string& path, const std::string& name, const std::string& what) {
  throw SafetensorsError("safetensors " + path + ": tensor '" + name + "': " + what);
}

// Element size of every dtype the format defines (0: unknown).
size_t st_dtype_size(const std::string& dt) {
  static const std::unordered_map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(dt);
  return it == sizes.end() ? 0 : it->second;
}

bool host_is_little_endian() {
  const uint16_t one = 1;
  uint8_t b;
  std::memcpy(&b, &one, 1);
  return b == 1;
}

// Run fn(begin, end) over [0, n) on a few threads when n is large.
template <class Fn>
void parallel_ranges(int64_t n, Fn fn) {
  constexpr int64_t kMinPerThread = int64_t(1) << 20;
  const int64_t hw = usable_cpus();
  const int64_t threads = std::min<int64_t>({hw, 16, std::max<int64_t>(1, n / kMinPerThread)});
  if (threads <= 1) {
    fn(int64_t(0), n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t per = (n + threads - 1) / threads;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t b = t * per, e = std::min(n, b + per);
    if (b >= e) break;
    pool.emplace_back([=] { fn(b, e); });
  }
  for (auto& th : pool) th.join();
}

uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

}  // namespace

// ---- scalar conversions -----------------------------------------------------------------------------------

float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);  // inf / NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;  // signed zero
  } else {
    // Subnormal: normalise the mantissa.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    u = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- tensor info ------------------------------------------------------------------------------------------

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- reader -----------------------------------------------------------------------------------------------

struct SafetensorsFile::Impl {
  std::string path;
  void* map = nullptr;
  size_t map_len = 0;
  const uint8_t* data = nullptr;  // start of the data section
  uint64_t data_size = 0;
  std::vector<std::string> names;
  std::unordered_map<std::string, SafetensorsTensorInfo> infos;
  std::map<std::string, std::string> metadata;

  ~Impl() {
    if (map) munmap(map, map_len);
  }

  void open(const std::string& p);
  void parse_header(const char* text, size_t len);
};

void SafetensorsFile::Impl::open(const std::string& p) {
  path = p;
  if (!host_is_little_endian()) fail(path, "big-endian hosts are not supported");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    fail(path, "file is " + std::to_string(file_size) + " bytes, too short for the 8-byte header length");
  }
  map_len = static_cast<size_t>(file_size);
  void* m = mmap(nullptr, map_len, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (m == MAP_FAILED) fail(path, std::string("mmap failed: ") + std::strerror(map_err));
  map = m;
  const uint8_t* bytes = static_cast<const uint8_t*>(map);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > file_size - 8)
    fail(path, "header length " + std::to_string(header_len) + " exceeds the file size (" +
                   std::to_string(file_size) + " bytes; truncated or not a safetensors file?)");
  if (header_len > kMaxHeaderBytes)
    fail(path, "header length " + std::to_string(header_len) + " is over the 100 MB limit");
  if (header_len < 2) fail(path, "header length " + std::to_string(header_len) + " is too small for a JSON object");
  data = bytes + 8 + header_len;
  data_size = file_size - 8 - header_len;
  parse_header(reinterpret_cast<const char*>(bytes + 8), static_cast<size_t>(header_len));
}

void SafetensorsFile::Impl::parse_header(const char* text, size_t len) {
  nlohmann::json hdr;
  try {
    hdr = nlohmann::json::parse(text, text + len);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("malformed JSON header: ") + e.what());
  }
  if (!hdr.is_object()) fail(path, "JSON header is not an object");

  auto as_u64 = [&](const nlohmann::json& v, const std::string& name, const char* what) -> uint64_t {
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
    fail_tensor(path, name, std::string(what) + " must be a non-negative integer, got " + v.dump());
  };

  for (auto it = hdr.begin(); it != hdr.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m)
        metadata[m.key()] = m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
      continue;
    }
    if (!v.is_object()) fail_tensor(path, name, "header entry is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) fail_tensor(path, name, "missing or non-string \"dtype\"");
    if (sh == v.end() || !sh->is_array()) fail_tensor(path, name, "missing or non-array \"shape\"");
    if (off == v.end() || !off->is_array() || off->size() != 2)
      fail_tensor(path, name, "\"data_offsets\" must be an array [begin, end]");
    SafetensorsTensorInfo info;
    info.name = name;
    info.dtype = dt->get<std::string>();
    const size_t esize = st_dtype_size(info.dtype);
    if (esize == 0) fail_tensor(path, name, "unknown dtype \"" + info.dtype + "\"");
    // numel * esize, saturating at UINT64_MAX (which no data section can match).
    uint64_t bytes = esize;
    bool any_zero = false;
    for (const auto& d : *sh) {
      const uint64_t dim = as_u64(d, name, "shape entry");
      if (dim > static_cast<uint64_t>(INT64_MAX)) fail_tensor(path, name, "shape entry too large");
      info.shape.push_back(static_cast<int64_t>(dim));
      if (dim == 0) any_zero = true;
      else bytes = bytes > UINT64_MAX / dim ? UINT64_MAX : bytes * dim;
    }
    if (any_zero) bytes = 0;
    info.begin = as_u64((*off)[0], name, "data_offsets begin");
    info.end = as_u64((*off)[1], name, "data_offsets end");
    if (info.begin > info.end)
      fail_tensor(path, name, "data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                                  "] has begin after end");
    if (info.end > data_size)
      fail_tensor(path, name, "data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                                  "] run past the data section (" + std::to_string(data_size) +
                                  " bytes; truncated file?)");
    if (bytes != info.end - info.begin)
      fail_tensor(path, name, "data_offsets span " + std::to_string(info.end - info.begin) + " bytes but " +
                                  info.dtype + " " + shape_to_string(info.shape) + " needs " +
                                  (bytes == UINT64_MAX ? std::string("more than 2^64") : std::to_string(bytes)));
    names.push_back(name);
    infos.emplace(name, std::move(info));
  }

  std::sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
    const auto &ia = infos.at(a), &ib = infos.at(b);
    return ia.begin != ib.begin ? ia.begin < ib.begin : ia.end < ib.end;
  });
  // Overlap check over non-empty tensors in offset order.
  const SafetensorsTensorInfo* prev = nullptr;
  for (const auto& n : names) {
    const auto& info = infos.at(n);
    if (info.begin == info.end) continue;
    if (prev && info.begin < prev->end)
      fail_tensor(path, n, "data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                               "] overlap tensor '" + prev->name + "' [" + std::to_string(prev->begin) + ", " +
                               std::to_string(prev->end) + "]");
    prev = &info;
  }
}

SafetensorsFile::SafetensorsFile(const std::string& path) : impl_(std::make_unique<Impl>()) { impl_->open(path); }
SafetensorsFile::~SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;

const std::string& SafetensorsFile::path() const { return impl_->path; }
const std::vector<std::string>& SafetensorsFile::names() const { return impl_->names; }
bool SafetensorsFile::has(const std::string& name) const { return impl_->infos.count(name) != 0; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return impl_->metadata; }

const SafetensorsTensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = impl_->infos.find(name);
  if (it == impl_->infos.end()) fail_tensor(impl_->path, name, "not in this file");
  return it->second;
}

const uint8_t* SafetensorsFile::raw(const std::string& name) const { return impl_->data + info(name).begin; }

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  std::vector<float> out(static_cast<size_t>(info(name).numel()));
  read_f32(name, 0, static_cast<int64_t>(out.size()), out.data());
  return out;
}

void SafetensorsFile::read_f32(const std::string& name, int64_t first, int64_t count, float* dst) const {
  const SafetensorsTensorInfo& ti = info(name);
  const int64_t n = ti.numel();
  if (first < 0 || count < 0 || first > n || count > n - first)
    fail_tensor(impl_->path, name, "element range [" + std::to_string(first) + ", " +
                                       std::to_string(first + count) + ") outside its " + std::to_string(n) +
                                       " elements");
  const uint8_t* src = impl_->data + ti.begin;
  if (ti.dtype == "F32") {
    parallel_ranges(count, [&](int64_t b, int64_t e) {
      std::memcpy(dst + b, src + (first + b) * 4, static_cast<size_t>(e - b) * 4);
    });
  } else if (ti.dtype == "BF16") {
    parallel_ranges(count, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] = bf16_bits_to_f32(load_u16(src + (first + i) * 2));
    });
  } else if (ti.dtype == "F16") {
    parallel_ranges(count, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] = f16_bits_to_float(load_u16(src + (first + i) * 2));
    });
  } else {
    fail_tensor(impl_->path, name, "dtype " + ti.dtype + " cannot be read as float (F32, BF16, F16 can)");
  }
}

// ---- writer -----------------------------------------------------------------------------------------------

int64_t safetensors_tensor_bytes(const std::vector<int64_t>& shape, DType dtype) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n * static_cast<int64_t>(dtype_size(dtype));
}

namespace {

std::string temp_name(const std::string& path) {
  return path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
}

// Writes through a FILE*, removes the temporary on failure, renames it over the target on commit().
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path), tmp_(temp_name(path)) {
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) fail(path_, "cannot create " + tmp_ + ": " + std::strerror(errno));
    std::setvbuf(f_, nullptr, _IOFBF, 1 << 22);
  }
  ~AtomicFile() {
    if (f_) std::fclose(f_);
    if (!committed_) std::remove(tmp_.c_str());
  }
  void write(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) fail(path_, "write to " + tmp_ + " failed: " + std::strerror(errno));
  }
  void commit() {
    if (std::fflush(f_) != 0 || ::fsync(fileno(f_)) != 0)
      fail(path_, "flushing " + tmp_ + " failed: " + std::strerror(errno));
    FILE* f = f_;
    f_ = nullptr;
    if (std::fclose(f) != 0) fail(path_, "closing " + tmp_ + " failed: " + std::strerror(errno));
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
      fail(path_, "renaming " + tmp_ + " failed: " + std::strerror(errno));
    committed_ = true;
  }

 private:
  std::string path_, tmp_;
  FILE* f_ = nullptr;
  bool committed_ = false;
};

}  // namespace

void write_file_atomic(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteEntry>& tensors, DType dtype,
                       const std::map<std::string, std::string>& metadata) {
  if (dtype != DType::F32 && dtype != DType::BF16)
    fail(path, std::string("can only write F32 or BF16, not ") + dtype_name(dtype));
  if (!host_is_little_endian()) fail(path, "big-endian hosts are not supported");
  const char* dt = dtype == DType::F32 ? "F32" : "BF16";

  nlohmann::ordered_json hdr = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json md = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) md[k] = v;
    hdr["__metadata__"] = std::move(md);
  }
  std::unordered_set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") fail(path, "invalid tensor name '" + t.name + "'");
    if (!seen.insert(t.name).second) fail_tensor(path, t.name, "written twice");
    for (int64_t s : t.shape)
      if (s < 0) fail_tensor(path, t.name, "negative dimension in shape " + shape_to_string(t.shape));
    const int64_t bytes = safetensors_tensor_bytes(t.shape, dtype);
    if (bytes > 0 && !t.data) fail_tensor(path, t.name, "no data");
    hdr[t.name] = {{"dtype", dt}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += static_cast<uint64_t>(bytes);
  }
  std::string text = hdr.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  AtomicFile f(path);
  uint8_t len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  f.write(len, 8);
  f.write(text.data(), text.size());
  std::vector<uint16_t> buf;
  for (const auto& t : tensors) {
    const int64_t numel = safetensors_tensor_bytes(t.shape, DType::U8);
    if (dtype == DType::F32) {
      f.write(t.data, static_cast<size_t>(numel) * 4);
      continue;
    }
    constexpr int64_t kChunk = int64_t(1) << 22;
    for (int64_t b = 0; b < numel; b += kChunk) {
      const int64_t e = std::min(numel, b + kChunk);
      buf.resize(static_cast<size_t>(e - b));
      parallel_ranges(e - b, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) buf[i] = f32_to_bf16_bits(t.data[b + i]);
      });
      f.write(buf.data(), buf.size() * 2);
    }
  }
  f.commit();
}

}  // namespace mxt
