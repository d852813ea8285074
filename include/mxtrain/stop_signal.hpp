#pragma once
// Graceful stop. SIGTERM (Slurm's scancel and time limit, `kill`), SIGINT (Ctrl-C) and SIGUSR1 (what mpirun
// forwards to every rank, and what `sbatch --signal=USR1@300` sends ahead of a time limit) ask the trainer to end
// its current step, save a checkpoint and exit with kStopExitCode. A second SIGTERM or SIGINT ends the process
// at once. The ranks agree on the step through the loss reduction every step already makes, so one signalled
// rank stops them all at the same step.
#include <array>

namespace mxt {

// "Temporary failure, try again" (sysexits EX_TEMPFAIL): rerun the same command to resume.
constexpr int kStopExitCode = 75;

// Installs the handlers (idempotent). Handlers use SA_RESTART, so file and socket I/O is not interrupted.
void install_stop_handlers();
// The signals handled: SIGTERM, SIGINT, SIGUSR1.
std::array<int, 3> stop_signals();
// The first stop signal caught since installation (or the last clear), 0 if none.
int stop_signal();
void clear_stop_signal();  // tests
const char* stop_signal_name(int sig);

}  // namespace mxt
