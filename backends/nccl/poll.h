// PollUntil: the one polling loop of the backend (nonblocking communicator states, events),
// always against a deadline.
//
//   absl::Status s = PollUntil(deadline, [&]() -> std::optional<absl::Status> {
//     if (!ready()) return std::nullopt;   // keep polling
//     return absl::OkStatus();             // done (or an error to return)
//   });                                    // DeadlineExceeded("") when the deadline passes
//
// Pacing: yields for the first 20 ms, then sleeps 1/20 of the time waited so far (at most
// 1 ms): a short ncclInProgress costs a few microseconds, a long one little CPU.
#ifndef BRAID_BACKENDS_NCCL_POLL_H_
#define BRAID_BACKENDS_NCCL_POLL_H_

#include <algorithm>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace braid::nccl {

template <typename F>
absl::Status PollUntil(absl::Time deadline, F&& step) {
  const absl::Time start = absl::Now();
  for (;;) {
    std::optional<absl::Status> r = step();
    if (r.has_value()) return *std::move(r);
    const absl::Time now = absl::Now();
    if (now >= deadline) return absl::DeadlineExceededError("");
    const absl::Duration waited = now - start;
    if (waited < absl::Milliseconds(20)) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(std::min({absl::Milliseconds(1), waited / 20, deadline - now}));
    }
  }
}

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_POLL_H_
