// Fault injection for the local backend (tests): make one rank fail, or stall, at a given
// collective, and check that every other rank gets an error naming it instead of hanging.
//
//   auto* local = static_cast<LocalBackend*>(backend.get());
//   local->faults().FailRank(/*world_rank=*/2, /*seq=*/5);            // any group
//   local->faults().StallRank(1, 0, absl::Seconds(10), "world");      // only group "world"
//   local->faults().StallRankInCopy(1, 0, absl::Milliseconds(300));   // after the rendezvous
//
// Sequence numbers are per group, counted from 0 in issue order (WorkInfo::seq).
#ifndef BRAID_BACKENDS_LOCAL_FAULT_INJECTOR_H_
#define BRAID_BACKENDS_LOCAL_FAULT_INJECTOR_H_

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace braid::local {

struct Fault {
  enum class Kind { kFail, kStall, kStallInCopy };
  Kind kind = Kind::kFail;
  int world_rank = 0;
  uint64_t seq = 0;
  std::string group;  // empty: any group
  absl::Duration stall = absl::ZeroDuration();
  std::string message;
};

class FaultInjector {
 public:
  void FailRank(int world_rank, uint64_t seq, std::string group = "",
                std::string message = "injected failure");
  // The rank sleeps `duration` before joining the collective (ends early if the group fails).
  void StallRank(int world_rank, uint64_t seq, absl::Duration duration, std::string group = "");
  // The rank joins the collective (its peers see it arrive), then sleeps the whole `duration`
  // before it touches the peers' buffers, whatever happens to the group meanwhile: a thread
  // descheduled between the rendezvous and its copy.
  void StallRankInCopy(int world_rank, uint64_t seq, absl::Duration duration,
                       std::string group = "");
  // Removes and returns the fault matching (rank, group, seq), if any.
  std::optional<Fault> Take(int world_rank, absl::string_view group, uint64_t seq);
  void Clear();

 private:
  std::mutex mu_;
  std::vector<Fault> faults_;
};

}  // namespace braid::local

#endif  // BRAID_BACKENDS_LOCAL_FAULT_INJECTOR_H_
