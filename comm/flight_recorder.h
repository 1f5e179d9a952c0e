// FlightRecorder: the last N collectives one rank issued, kept so that a hang can be diagnosed
// after the fact (c10d's flight recorder, Horovod's stall inspector). Every collective of every
// group of the rank is recorded where all backends' calls pass (Group::ValidateAndLaunch) and
// updated when its Work finishes; the world group owns the recorder and splits share it.
//
//   // Backend::WorldGroup attaches one per rank (BRAID_FLIGHT_RECORDER_ENTRIES, default 2048).
//   FlightRecorder* fr = world->flight_recorder();           // null when recording is off
//   RETURN_IF_ERROR(fr->DumpTo("/tmp/hang.rank0.jsonl", "asked by the host"));
//   // $ braid_flight /tmp/hang.rank*.jsonl   -> "rank 2 never arrived at allreduce #17 ..."
//
// Contract: a fixed ring of `entries` records allocated once; recording copies into a slot
// (names are cut to their fields' sizes, the cut marked "~") and allocates nothing. Record and
// finish may run on any threads at once; a slot reused by a newer record ignores the older
// record's late finish. Dumps (docs/hardening.md#flight-recorder has the format) go to
// `<dir>/braid_flight.rank<R>.jsonl`: automatically, once per recorder, when a recorded
// collective fails or the job's abort domain aborts, if BRAID_FLIGHT_RECORDER_DIR is set; on
// demand through DumpTo / braid_flight_recorder_dump; and on every SIGUSR1 (or SIGUSR2) when
// BRAID_FLIGHT_RECORDER_SIGNAL asks for it (DumpOnSignal, comm/flight_signal.h). Otherwise
// Braid installs no signal handler: a host that handles signals itself calls
// braid_flight_recorder_dump from the thread that handles them.
#ifndef BRAID_COMM_FLIGHT_RECORDER_H_
#define BRAID_COMM_FLIGHT_RECORDER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "comm/abort_domain.h"
#include "comm/flight_signal.h"
#include "comm/options.h"
#include "comm/work.h"

namespace braid {

struct CollectiveArgs;

enum class FlightState : uint8_t { kIssued, kCompleted, kFailed };
absl::string_view FlightStateName(FlightState s);  // "issued", "completed", "failed"

// One recorded collective: plain data of a fixed size.
struct FlightRecord {
  uint64_t id = 0;         // this rank's record count when it was issued (0, 1, ...)
  char group[48] = {};     // group name, e.g. "world/shard0"
  char op[24] = {};        // "allreduce", "reduce_scatter", ...
  char label[40] = {};     // the caller's tag (e.g. "bucket 3"); may be empty
  char error[96] = {};     // a failed op's status message
  uint64_t seq = 0;        // the group's sequence number (identical on every rank)
  uint64_t count = 0;      // elements, NCCL's per-call count (comm/group.h CollectiveArgs)
  uint64_t bytes = 0;      // count * element size
  int32_t group_rank = 0;  // this rank in the group
  int32_t group_size = 0;
  int32_t dtype = -1;        // DType value; -1 for a barrier
  int32_t status_code = 0;   // absl::StatusCode of a failed op
  int64_t issued_ns = 0;     // wall clock, ns since the Unix epoch
  int64_t started_ns = 0;    // 0: the backend does not report a start
  int64_t completed_ns = 0;  // 0: still in flight
  FlightState state = FlightState::kIssued;
};

class FlightRecorder final : public WorkObserver,
                             public std::enable_shared_from_this<FlightRecorder> {
 public:
  struct Config {
    size_t entries = 2048;  // ring size; 0: no recorder (Create returns null)
    std::string dir;        // automatic dumps; empty: none
    int signal = 0;         // SIGUSR1 / SIGUSR2: Backend::WorldGroup calls DumpOnSignal; 0: off
    static Config FromOptions(const Options& o);
  };
  // `rank`: the world rank, naming the dump file. `domain` may be null; if not, an abort of it
  // dumps the ring (when config.dir is set).
  static std::shared_ptr<FlightRecorder> Create(const Config& config, int rank,
                                                const std::shared_ptr<AbortDomain>& domain);
  ~FlightRecorder() override;
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  static int64_t NowNs();  // wall clock, ns since the Unix epoch

  // Records `work` (just returned by a backend for `args`) issued at `issued_ns`, and observes it.
  void Record(const CollectiveArgs& args, int group_rank, int group_size, Work& work,
              int64_t issued_ns);
  void WorkFinished(uint64_t token, const absl::Status& status, int64_t started_ns) override;
  void WorkStarted(uint64_t token, int64_t started_ns) override;

  int rank() const { return rank_; }
  size_t capacity() const { return capacity_; }
  uint64_t recorded() const { return next_id_.load(std::memory_order_relaxed); }
  std::vector<FlightRecord> Snapshot() const;  // the ring, oldest first (allocates)

  // Writes the ring to `path` (JSON lines); `reason` goes into the header.
  absl::Status DumpTo(const std::string& path, absl::string_view reason) const;
  // "<dir>/braid_flight.rank<R>.jsonl", or empty without a dir.
  const std::string& auto_path() const { return auto_path_; }
  // The automatic dump: the first call writes auto_path() (if any), later calls do nothing.
  void DumpOnce(absl::string_view reason);
  // From now on every `signo` writes auto_path() again (reason "signal SIGUSR1"), on
  // FlightSignal's thread. FailedPrecondition without a dir; FlightSignal::Subscribe's errors.
  absl::Status DumpOnSignal(int signo);

 private:
  struct Slot {
    std::atomic<bool> busy{false};
    FlightRecord record;
  };
  FlightRecorder(size_t entries, int rank, std::string auto_path);
  Slot& SlotOf(uint64_t id) const { return slots_[id % capacity_]; }

  const int rank_;
  const std::string auto_path_;
  const size_t capacity_;
  const std::unique_ptr<Slot[]> slots_;  // allocated once
  std::atomic<uint64_t> next_id_{0};
  std::atomic<bool> auto_dumped_{false};
  FlightSignal::Subscription on_signal_;  // unsubscribed first in ~FlightRecorder
  AbortDomain::Subscription on_abort_;    // last: unsubscribed before the rest goes
};

// One record as a JSON object on one line (the dump's format; no trailing newline).
std::string FlightRecordJson(const FlightRecord& r);

}  // namespace braid

#endif  // BRAID_COMM_FLIGHT_RECORDER_H_
