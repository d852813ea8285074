#pragma once
// How many CPUs this process may run on: its affinity mask (mpirun pins each rank to one core by default), not
// the machine's count, so thread pools are sized to what can really run in parallel.
namespace mxt {
int usable_cpus();
int machine_cpus();
}  // namespace mxt
