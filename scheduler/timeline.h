// Timeline: a per-rank trace of what the scheduler did and when, written as Chrome trace JSON
// (opens in https://ui.perfetto.dev or chrome://tracing), one row per track.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Timeline> tl, Timeline::FromOptions(opts, rank));
//   const int marks = tl->Track("marks");             // setup: register rows (may allocate)
//   const int world = tl->Track("group world");
//   ...
//   tl->Instant(marks, "mark", param_index);          // hot path: one branch when off
//   const int64_t t0 = Timeline::NowNs();
//   ... the collective runs ...
//   tl->Complete(world, "allreduce", t0, Timeline::NowNs(), bucket);
//   { TimelineSpan wait(*tl, waits, "wait", bucket); RETURN_IF_ERROR(work->Wait(deadline)); }
//   RETURN_IF_ERROR(tl->Close());                      // flush, join, report I/O errors
//
// With BRAID_TIMELINE=/tmp/run7 rank 3 writes /tmp/run7.rank3.json:
//   {"traceEvents":[ {"ph":"M", process/thread names...}, {"ph":"X","name":"allreduce",...}, ...],
//    "displayTimeUnit":"ms","otherData":{"braid_rank":3,"events_written":N,"events_dropped":D,...}}
// Ranks are processes ("pid" = rank + 1, named "rank <r>"; Perfetto treats pid 0 specially) and
// tracks are threads ("tid" = track id + 1, named by Track()), so each track is a named row.
// Timestamps are microseconds since the Timeline was created (NowNs() is the time base).
//
// Why this shape (Horovod's timeline, the c10d flight recorder): recording must not perturb the
// schedule it observes. A record call copies a 40-byte event into a bounded lock-free queue
// (TimelineQueue) and returns; a writer thread formats and writes the JSON. When the queue is
// full the event is dropped and counted (dropped(), "events_dropped" in the file): a recording
// thread never waits for the disk. When disabled (empty prefix) every record call is a single
// predictable branch on a const member, with no clock read and no allocation.
//
// Threading: Track(), record calls and Flush() may be called from any thread. Record calls that
// race with or follow Close() are not written. Names passed to Instant/Complete are stored as
// pointers: string literals, or strings that outlive the Timeline. On one track, spans should nest
// or be disjoint (the viewer draws a track as a stack); put concurrent activities on separate
// tracks (e.g. one per group).
#ifndef BRAID_SCHEDULER_TIMELINE_H_
#define BRAID_SCHEDULER_TIMELINE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/options.h"

namespace braid::sched {

template <typename T>
class TimelineQueue;

struct TimelineOptions {
  // Events buffered between recorders and the writer (rounded up to a power of two). About 48
  // bytes each; the default holds 16k events (768 KiB), i.e. bursts far above any schedule's rate.
  size_t queue_capacity = size_t{1} << 14;
  // How often the writer wakes to drain the queue when nobody calls Flush()/Close().
  absl::Duration flush_interval = absl::Milliseconds(2);
};

class Timeline {
 public:
  // Disabled (no file, no thread) when `path_prefix` is empty. Otherwise opens
  // "<path_prefix>.rank<rank>.json" now (truncating an existing file), so a bad path is an error
  // here that names the file, and starts the writer thread.
  static absl::StatusOr<std::unique_ptr<Timeline>> Create(std::string path_prefix, int rank,
                                                          TimelineOptions options = {});
  // Create(opts.timeline, rank): the BRAID_TIMELINE knob.
  static absl::StatusOr<std::unique_ptr<Timeline>> FromOptions(const Options& opts, int rank);

  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;
  ~Timeline();  // Close(); an I/O error at this point is logged, not lost silently

  bool enabled() const { return enabled_; }
  int rank() const { return rank_; }
  // "<prefix>.rank<r>.json", or empty when disabled.
  const std::string& path() const { return path_; }

  // Registers a row named `name` (the same name returns the same id) and returns its id, a small
  // integer. Meant for setup: it takes a lock and may allocate. Returns 0 when disabled.
  int Track(absl::string_view name);

  // An instant ("ph":"i") on `track` at NowNs(); `arg` >= 0 is shown as args.v (e.g. the index
  // of the parameter marked ready).
  void Instant(int track, const char* name, int64_t arg = -1) {
    if (enabled_) Push(track, name, NowNs(), kInstantDuration, arg);
  }
  // The same at an explicit time (a NowNs() reading taken earlier).
  void InstantAt(int track, const char* name, int64_t ts_ns, int64_t arg = -1) {
    if (enabled_) Push(track, name, ts_ns, kInstantDuration, arg);
  }
  // A span ("ph":"X") from `start_ns` to `end_ns` (NowNs() readings). A negative duration is
  // written as 0; a start before the Timeline's creation is written at 0.
  void Complete(int track, const char* name, int64_t start_ns, int64_t end_ns, int64_t arg = -1) {
    if (enabled_) Push(track, name, start_ns, end_ns > start_ns ? end_ns - start_ns : 0, arg);
  }

  // A counter sample ("ph":"C") on `track`: the viewer draws `name`'s value over time as a
  // stepped graph (e.g. bytes allocated). `value` >= 0.
  void Counter(int track, const char* name, int64_t value) {
    if (enabled_) Push(track, name, NowNs(), kCounterSample, value);
  }

  // Steady clock in nanoseconds: the time base of every event.
  static int64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // Blocks until every event recorded before the call is in the file (written and fflush'ed);
  // returns the first I/O error so far. Not for the hot path. OK and immediate when disabled.
  absl::Status Flush();
  // Drains the queue, writes the track names and the counts, closes the file and joins the
  // writer. Idempotent: later calls return the first call's result. Reports I/O errors (disk
  // full, a failed close) naming the file.
  absl::Status Close();

  // Events lost because the queue was full (also written as "events_dropped").
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  // Events written to the file so far.
  uint64_t written() const;

 private:
  struct Event {
    const char* name;
    int64_t ts_ns;
    int64_t dur_ns;  // kInstantDuration for an instant, kCounterSample for a counter
    int64_t arg;
    int32_t track;
  };
  static constexpr int64_t kInstantDuration = -1;
  static constexpr int64_t kCounterSample = -2;  // arg is the counter's value

  Timeline(std::string path, int rank, std::FILE* file, TimelineOptions options);
  Timeline();  // disabled

  // Out of line so that call sites only inline the branch.
  void Push(int track, const char* name, int64_t ts_ns, int64_t dur_ns, int64_t arg);
  void WriterLoop();
  // Writer thread only: pops everything available into `buf`, writing it out in chunks.
  void Drain(std::string* buf);
  void WriteOut(std::string* buf);  // writer (or Close after the join)
  void AppendEvent(const Event& e, std::string* out) const;
  void AppendTrailer(std::string* out) const;

  const bool enabled_;
  const int rank_ = 0;
  const std::string path_;
  const TimelineOptions options_;
  const int64_t origin_ns_ = 0;
  std::unique_ptr<TimelineQueue<Event>> queue_;
  std::atomic<uint64_t> dropped_{0};

  std::FILE* file_ = nullptr;  // owned; closed by Close()
  absl::Status write_status_;  // writer thread's first I/O error (Close reads it after the join)
  std::atomic<uint64_t> written_{0};

  mutable std::mutex mu_;
  std::condition_variable wake_writer_;  // stop_ or a flush request
  std::condition_variable flushed_cv_;   // flushed_upto_ advanced or the writer exited
  bool stop_ = false;                    // guarded by mu_
  bool writer_exited_ = false;           // guarded by mu_
  uint64_t flush_target_ = 0;            // guarded by mu_: pushes to write before Flush returns
  uint64_t flushed_upto_ = 0;            // guarded by mu_: pushes written and fflush'ed
  absl::Status published_status_;        // guarded by mu_: write_status_ as of the last round
  std::vector<std::string> tracks_;      // guarded by mu_

  std::mutex close_mu_;        // serializes Close()
  bool closed_ = false;        // guarded by close_mu_
  absl::Status close_status_;  // guarded by close_mu_
  std::thread writer_;
};

// Records a span on `track` from construction to destruction (e.g. a Wait()). When the timeline
// is disabled it reads no clock.
//
//   { TimelineSpan span(timeline, waits, "wait params", bucket); RETURN_IF_ERROR(w->Wait(t)); }
class TimelineSpan {
 public:
  TimelineSpan(Timeline& timeline, int track, const char* name, int64_t arg = -1)
      : timeline_(timeline),
        track_(track),
        name_(name),
        arg_(arg),
        start_ns_(timeline.enabled() ? Timeline::NowNs() : 0) {}
  ~TimelineSpan() {
    if (timeline_.enabled()) timeline_.Complete(track_, name_, start_ns_, Timeline::NowNs(), arg_);
  }
  TimelineSpan(const TimelineSpan&) = delete;
  TimelineSpan& operator=(const TimelineSpan&) = delete;

  void set_arg(int64_t arg) { arg_ = arg; }

 private:
  Timeline& timeline_;
  const int track_;
  const char* const name_;
  int64_t arg_;
  const int64_t start_ns_;
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_TIMELINE_H_
