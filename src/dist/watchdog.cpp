#include "dist/watchdog.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "mxtrain/comm.hpp"

namespace mxt {

Watchdog::Watchdog(double timeout_s, Fire on_timeout, double poll_s)
    : timeout_s_(timeout_s), fire_(std::move(on_timeout)), poll_(poll_s) {
  if (!fire_) fire_ = [](const std::string& m) { abort_job(m, 5); };
  if (timeout_s_ > 0) thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Watchdog::Scope::~Scope() {
  if (w_) w_->end(id_);
}

Watchdog::Scope Watchdog::guard(std::string what) {
  if (timeout_s_ <= 0) return Scope(nullptr, 0);
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  ops_.push_back({id, std::move(what),
                  Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_)),
                  nullptr});
  return Scope(this, id);
}

void Watchdog::watch(std::string what, std::function<bool()> done) {
  if (timeout_s_ <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  ops_.push_back({next_id_++, std::move(what),
                  Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_)),
                  std::move(done)});
}

uint64_t Watchdog::add_health_check(std::function<std::string()> check) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  checks_.emplace_back(id, std::move(check));
  return id;
}

void Watchdog::remove_health_check(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);  // checks run under the lock: none is running after this
  checks_.erase(std::remove_if(checks_.begin(), checks_.end(), [id](const auto& c) { return c.first == id; }),
                checks_.end());
}

size_t Watchdog::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_.size();
}

void Watchdog::end(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(ops_.begin(), ops_.end(), [id](const Op& o) { return o.id == id; });
  if (it != ops_.end()) ops_.erase(it);
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, poll_, [this] { return stop_; });
    if (stop_ || fired_) continue;
    std::string message;
    for (const auto& check : checks_) {
      message = check.second();
      if (!message.empty()) break;
    }
    const auto now = Clock::now();
    for (auto it = ops_.begin(); message.empty() && it != ops_.end();) {
      if (it->done && it->done()) {
        it = ops_.erase(it);
        continue;
      }
      if (now > it->deadline)
        message = fmt::format("{} did not complete within parallelism.timeout_s={} s: a peer rank has died or "
                              "hangs (or the timeout is too short for this step); aborting the job",
                              it->what, timeout_s_);
      ++it;
    }
    if (message.empty()) continue;
    fired_ = true;
    lock.unlock();  // the action may block or end the process: never under the lock
    fire_(message);
    lock.lock();
  }
}

}  // namespace mxt
