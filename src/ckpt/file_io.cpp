// Durable file writes (write + fsync, every error naming the file), directory fsync, free-space queries, and
// the test hooks that inject a full disk.
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "ckpt/ckpt_internal.hpp"

namespace mxt::ckpt {
namespace {
std::atomic<int64_t> g_fail_after{-1}, g_written{0}, g_free_bytes{-1};
std::atomic<int> g_fail_errno{ENOSPC};

[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw CheckpointError("checkpoint file " + path + ": " + what + ": " + std::strerror(err));
}
}  // namespace

namespace testing {
void fail_writes_after(int64_t bytes, int err) {
  g_written = 0;
  g_fail_errno = err;
  g_fail_after = bytes;
}
void set_free_bytes(int64_t bytes) { g_free_bytes = bytes; }
}  // namespace testing

int injected_write_error(size_t n) {
  const int64_t limit = g_fail_after.load();
  if (limit < 0) return 0;
  return g_written.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n) > limit ? g_fail_errno.load() : 0;
}

int64_t free_bytes(const std::string& dir) {
  const int64_t forced = g_free_bytes.load();
  if (forced >= 0) return forced;
  struct statvfs st {};
  if (statvfs(dir.c_str(), &st) != 0) return -1;  // unknown: the writes will tell
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

DurableFile::DurableFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path_, "cannot create", errno);
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) ::close(fd_);
}

void DurableFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  if (const int err = injected_write_error(n))
    fail(path_, "write failed after " + std::to_string(written_) + " bytes", err);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(path_, "write failed after " + std::to_string(written_) + " bytes", errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
}

void DurableFile::close() {
  if (::fsync(fd_) != 0) fail(path_, "fsync failed", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(path_, "close failed", errno);
}

void write_durable(const std::string& path, const std::string& text) {
  DurableFile f(path);
  f.write(text.data(), text.size());
  f.close();
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open to fsync", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail(path, "fsync failed", err);
}

}  // namespace mxt::ckpt
