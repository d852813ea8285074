#include "mxtrain/cpus.hpp"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace mxt {

int machine_cpus() { return std::max(1u, std::thread::hardware_concurrency()); }

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return machine_cpus();
}

}  // namespace mxt
