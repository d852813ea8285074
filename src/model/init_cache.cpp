#include "mxtrain/init_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "mxtrain/cpus.hpp"
#include "mxtrain/rng.hpp"

namespace mxt {

namespace {

// Bump with any change to what init_params_host draws (generator, chunking, stream seeds): old files then miss.
constexpr uint64_t kGeneratorVersion = 1;
constexpr char kMagic[8] = {'M', 'X', 'T', 'I', 'N', 'I', 'T', '1'};

struct Header {
  char magic[8];
  uint64_t key;
  int64_t dense_numel, expert_numel;
};

// The file's float ranges, [offset in floats, count) over dense then expert, cut into pieces for the threads.
struct Piece {
  float* dst;
  int64_t count;
  off_t at;  // byte offset in the file
};

std::vector<Piece> pieces_of(float* dense, int64_t dense_n, float* expert, int64_t expert_n) {
  constexpr int64_t kPiece = int64_t{1} << 24;  // 64 MiB
  std::vector<Piece> out;
  off_t at = sizeof(Header);
  for (auto [p, n] : {std::pair{dense, dense_n}, std::pair{expert, expert_n}}) {
    for (int64_t i = 0; i < n; i += kPiece) {
      const int64_t c = std::min(kPiece, n - i);
      out.push_back({p + i, c, at + static_cast<off_t>(i * sizeof(float))});
    }
    at += static_cast<off_t>(n * sizeof(float));
  }
  return out;
}

// Runs io(piece) over the pieces on a few threads; false when any returned false.
template <class F>
bool parallel_io(const std::vector<Piece>& pieces, F io) {
  std::atomic<size_t> next{0};
  std::atomic<bool> ok{true};
  auto work = [&] {
    for (size_t i; ok && (i = next.fetch_add(1)) < pieces.size();)
      if (!io(pieces[i])) ok = false;
  };
  const int n = std::clamp(usable_cpus(), 1, 16);
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  return ok;
}

// Reads (or writes) `bytes` at file offset `at`, resuming after short transfers and EINTR.
bool full_io(bool write, int fd, void* buf, size_t bytes, off_t at) {
  auto* p = static_cast<char*>(buf);
  while (bytes > 0) {
    const ssize_t r = write ? ::pwrite(fd, p, bytes, at) : ::pread(fd, p, bytes, at);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    at += r;
    bytes -= static_cast<size_t>(r);
  }
  return true;
}

// Reads the key's file into dense / expert; false (and why, in problem) when it is missing or does not match.
bool read_file(const std::string& path, uint64_t key, const ParamLayout& layout, float* dense, float* expert,
               std::string& problem) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    problem = errno == ENOENT ? "" : path + ": " + std::strerror(errno);
    return false;
  }
  Header h{};
  struct stat st {};
  const off_t want = static_cast<off_t>(sizeof(Header)) +
                     static_cast<off_t>((layout.dense_numel + layout.expert_numel) * sizeof(float));
  bool ok = full_io(false, fd, &h, sizeof(h), 0) && std::memcmp(h.magic, kMagic, sizeof(kMagic)) == 0 &&
            h.key == key && h.dense_numel == layout.dense_numel && h.expert_numel == layout.expert_numel &&
            ::fstat(fd, &st) == 0 && st.st_size == want;
  if (!ok) {
    problem = path + ": not this model's initial weights (header or size differ): drawn again";
  } else {
    ok = parallel_io(pieces_of(dense, layout.dense_numel, expert, layout.expert_numel), [&](const Piece& p) {
      return full_io(false, fd, p.dst, static_cast<size_t>(p.count) * sizeof(float), p.at);
    });
    if (!ok) problem = path + ": short read: drawn again";
  }
  ::close(fd);
  return ok;
}

// Writes dense / expert under a temporary name, then renames it into place; false (and why) on any failure.
bool write_file(const std::string& path, uint64_t key, const ParamLayout& layout, const float* dense,
                const float* expert, std::string& problem) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    problem = tmp + ": " + std::strerror(errno);
    return false;
  }
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.key = key;
  h.dense_numel = layout.dense_numel;
  h.expert_numel = layout.expert_numel;
  std::atomic<int> err{0};  // the first failing write's errno (set by whichever thread failed)
  auto write = [&](const void* buf, size_t bytes, off_t at) {
    if (full_io(true, fd, const_cast<void*>(buf), bytes, at)) return true;
    int none = 0;
    err.compare_exchange_strong(none, errno ? errno : EIO);
    return false;
  };
  bool ok = write(&h, sizeof(h), 0) &&
            parallel_io(pieces_of(const_cast<float*>(dense), layout.dense_numel, const_cast<float*>(expert),
                                  layout.expert_numel),
                        [&](const Piece& p) {
                          return write(p.dst, static_cast<size_t>(p.count) * sizeof(float), p.at);
                        });
  if (::close(fd) != 0 && ok) {
    err = errno;
    ok = false;
  }
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ok = false;
  }
  if (!ok) {
    problem = path + ": not written (" + std::strerror(err.load()) + ")";
    ::unlink(tmp.c_str());
  }
  return ok;
}

}  // namespace

uint64_t init_cache_key(const ParamLayout& layout, const ModelConfig& m, uint64_t seed) {
  std::string s = "v" + std::to_string(kGeneratorVersion) + " seed " + std::to_string(seed) + " range ";
  uint64_t range_bits = 0;
  static_assert(sizeof(range_bits) == sizeof(m.initializer_range));
  std::memcpy(&range_bits, &m.initializer_range, sizeof(range_bits));
  s += std::to_string(range_bits) + " experts " + std::to_string(layout.first_expert) + "+" +
       std::to_string(layout.num_local_experts) + " sizes " + std::to_string(layout.dense_numel) + "," +
       std::to_string(layout.expert_numel);
  for (const ParamInfo& p : layout.params)
    s += "|" + p.name + ":" + std::to_string(p.offset) + ":" + std::to_string(p.numel) + (p.expert ? "e" : "d") +
         (p.is_norm ? "n" : "");
  return hash_string(s);
}

std::string init_cache_path(const std::string& dir, uint64_t key) {
  char name[40];
  std::snprintf(name, sizeof(name), "init-%016llx.f32", static_cast<unsigned long long>(key));
  return (std::filesystem::path(dir) / name).string();
}

InitCacheOutcome init_params_cached(const std::string& dir, const ParamLayout& layout, const ModelConfig& m,
                                    uint64_t seed, float* dense, float* expert) {
  const uint64_t key = init_cache_key(layout, m, seed);
  InitCacheOutcome o{InitCacheOutcome::kRead, init_cache_path(dir, key), {}};
  if (read_file(o.path, key, layout, dense, expert, o.problem)) return o;
  init_params_host(layout, m, seed, dense, expert);
  auto add_problem = [&](const std::string& what) { o.problem += (o.problem.empty() ? "" : "; ") + what; };
  o.how = InitCacheOutcome::kNotWritten;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::string why;
  if (ec)
    add_problem(dir + ": " + ec.message() + " (not cached)");
  else if (write_file(o.path, key, layout, dense, expert, why))
    o.how = InitCacheOutcome::kWritten;
  else
    add_problem(why);
  return o;
}

}  // namespace mxt
