#include "mxtrain/stop_signal.hpp"

#include <unistd.h>

#include <csignal>
#include <cstring>

namespace mxt {
namespace {

volatile std::sig_atomic_t g_stop = 0;

// Only async-signal-safe calls here: write(2), sigaction, raise.
extern "C" void on_stop_signal(int sig) {
  if (g_stop != 0 && sig != SIGUSR1) {  // asked twice: stop now, as without the handler
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig);
    return;
  }
  if (g_stop == 0) g_stop = sig;
  static const char msg[] =
      "mxtrain: stop requested: ending the current step, then saving a checkpoint (checkpoint.ckpt_dir) and "
      "exiting; SIGINT or SIGTERM again stops at once, without saving\n";
  const ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : stop_signals()) sigaction(sig, &sa, nullptr);
}

std::array<int, 3> stop_signals() { return {SIGTERM, SIGINT, SIGUSR1}; }

int stop_signal() { return g_stop; }

void clear_stop_signal() { g_stop = 0; }

const char* stop_signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace mxt
