// RankBarrier: a reusable barrier among the n ranks of one local group, with a deadline, a
// sticky failure state, and errors that name the ranks that did not arrive.
//
//   absl::Status s = barrier.Arrive(my_rank, absl::Now() + timeout, work->info(), world_ranks);
//
// Generation-counted: a rank may re-enter for the next phase while slower ranks are still
// leaving the previous one. A waiter spins for `spin` before sleeping. Once Fail() is called
// (or a deadline passes), every current and future Arrive returns that error until the group
// is gone: a failed group never blocks again.
#ifndef BRAID_BACKENDS_LOCAL_RANK_BARRIER_H_
#define BRAID_BACKENDS_LOCAL_RANK_BARRIER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/work.h"

namespace braid::local {

class RankBarrier {
 public:
  RankBarrier(int n, absl::Duration spin);

  // Blocks until all n ranks arrived in this generation, the barrier failed, or `deadline`.
  // On a deadline the barrier fails with DeadlineExceeded naming the op (`info`, described
  // only then) and the missing ranks (as `rank_names[r]`, e.g. world ranks).
  absl::Status Arrive(int rank, absl::Time deadline, const WorkInfo& info,
                      const std::vector<int>& rank_names);
  // Makes every waiter and every later Arrive return `status` (the first failure wins).
  void Fail(absl::Status status);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  absl::Status failure() const;

 private:
  const int n_;
  const int64_t spin_ns_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int count_ = 0;              // guarded by mu_
  std::vector<char> arrived_;  // guarded by mu_
  absl::Status failure_;       // guarded by mu_
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> failed_{false};
};

}  // namespace braid::local

#endif  // BRAID_BACKENDS_LOCAL_RANK_BARRIER_H_
