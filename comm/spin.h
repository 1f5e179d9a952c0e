// Bounded busy-polling: a sleeping hand-off costs ~40 us on small VMs, a spin ~4 us; spin for a
// short budget, then let the caller block.
#ifndef BRAID_COMM_SPIN_H_
#define BRAID_COMM_SPIN_H_

#include <chrono>
#include <cstdint>
#include <thread>

namespace braid {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls `ready()` for up to `budget_ns`; returns whether it became true. Yields the CPU every
// few hundred polls so an oversubscribed machine still runs the thread we wait for.
template <typename Pred>
bool SpinUntil(Pred ready, int64_t budget_ns) {
  if (ready()) return true;
  if (budget_ns <= 0) return false;
  const auto end = std::chrono::steady_clock::now() + std::chrono::nanoseconds(budget_ns);
  for (uint32_t i = 1;; ++i) {
    if (ready()) return true;
    if ((i & 255) == 0) {
      if (std::chrono::steady_clock::now() >= end) return ready();
      std::this_thread::yield();
    } else {
      CpuRelax();
    }
  }
}

}  // namespace braid

#endif  // BRAID_COMM_SPIN_H_
