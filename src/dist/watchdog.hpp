#pragma once
// A watchdog thread for collectives: a rank whose peer died or hangs would otherwise wait forever inside a
// collective (MPI blocks the host; NCCL blocks the GPU stream and then the host's next sync). Each watched
// operation has a deadline of timeout_s; when one passes, on_timeout gets a message naming the operation and
// the group, and the default action (abort_job) ends every rank with a non-zero exit.
//
// Two kinds of operations:
// - host-blocking (MPI): a Scope is open while the call runs;
// - asynchronous (NCCL): watch() registers a poll function (an event query) that says when the operation is
//   done; the thread polls the oldest ones in order.
// Health checks (e.g. ncclCommGetAsyncError) run on the thread at every poll and fire at once when they
// report an error.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mxt {

class Watchdog {
 public:
  using Fire = std::function<void(const std::string& message)>;
  // timeout_s <= 0: nothing is watched and no thread runs. on_timeout defaults to abort_job(message, 5).
  explicit Watchdog(double timeout_s, Fire on_timeout = nullptr, double poll_s = 0.2);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  double timeout_s() const { return timeout_s_; }

  class Scope {
   public:
    Scope(Watchdog* w, uint64_t id) : w_(w), id_(id) {}
    Scope(Scope&& o) noexcept : w_(o.w_), id_(o.id_) { o.w_ = nullptr; }
    Scope(const Scope&) = delete;
    ~Scope();

   private:
    Watchdog* w_;
    uint64_t id_;
  };
  // A host-blocking operation, watched until the Scope ends.
  Scope guard(std::string what);
  // An asynchronous operation, watched until done() returns true (called on the watchdog thread).
  void watch(std::string what, std::function<bool()> done);
  // check returns "" while healthy, else an error message (fires at once). Called on the watchdog thread.
  // Returns an id for remove_health_check, after which the check is never running or called again.
  uint64_t add_health_check(std::function<std::string()> check);
  void remove_health_check(uint64_t id);
  // Operations being watched now (for tests).
  size_t pending() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Op {
    uint64_t id;
    std::string what;
    Clock::time_point deadline;
    std::function<bool()> done;  // empty for host-blocking scopes
  };
  void loop();
  void end(uint64_t id);

  double timeout_s_;
  Fire fire_;
  std::chrono::duration<double> poll_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> ops_;
  std::vector<std::pair<uint64_t, std::function<std::string()>>> checks_;
  uint64_t next_id_ = 1;
  bool stop_ = false, fired_ = false;
  std::thread thread_;
};

}  // namespace mxt
