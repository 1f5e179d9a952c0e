#include "scheduler/timeline.h"

#include <cerrno>
#include <utility>

#if defined(__linux__)
#include <pthread.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/json_string.h"
#include "comm/logging.h"
#include "comm/status_macros.h"
#include "comm/thread_start.h"
#include "scheduler/timeline_queue.h"

namespace braid::sched {
namespace {

constexpr size_t kChunkBytes = size_t{64} << 10;  // the writer's fwrite granularity
constexpr size_t kMaxQueueCapacity = size_t{1} << 26;

// Nanoseconds as microseconds with three exact decimals ("12.345"); `ns` >= 0.
void AppendMicros(int64_t ns, std::string* out) {
  absl::StrAppend(out, ns / 1000);
  const int frac = static_cast<int>(ns % 1000);
  const char digits[4] = {'.', static_cast<char>('0' + frac / 100),
                          static_cast<char>('0' + frac / 10 % 10),
                          static_cast<char>('0' + frac % 10)};
  out->append(digits, 4);
}

absl::Status IoError(int err, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat("timeline: ", what, " '", path, "'"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Timeline>> Timeline::Create(std::string path_prefix, int rank,
                                                           TimelineOptions options) {
  if (path_prefix.empty()) return std::unique_ptr<Timeline>(new Timeline());
  if (rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat("timeline: rank must be >= 0, got ", rank));
  }
  if (options.queue_capacity == 0 || options.queue_capacity > kMaxQueueCapacity) {
    return absl::InvalidArgumentError(absl::StrCat("timeline: queue_capacity must be in [1, ",
                                                   kMaxQueueCapacity, "], got ",
                                                   options.queue_capacity));
  }
  if (options.flush_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeline: flush_interval must be positive, got ",
                     absl::FormatDuration(options.flush_interval)));
  }
  std::string path = absl::StrCat(path_prefix, ".rank", rank, ".json");
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    const int err = errno;
    return absl::ErrnoToStatus(
        err, absl::StrCat("timeline: cannot open '", path, "' for writing (prefix '", path_prefix,
                          "', from BRAID_TIMELINE or Timeline::Create)"));
  }
  // The header: the opening of the event array and this rank's process row.
  std::string header = "{\"traceEvents\":[\n";
  absl::StrAppend(&header, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":", rank + 1,
                  ",\"args\":{\"name\":\"rank ", rank, "\"}},\n",
                  "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":", rank + 1,
                  ",\"args\":{\"sort_index\":", rank, "}}");
  if (std::fwrite(header.data(), 1, header.size(), file) != header.size()) {
    const int err = errno;
    std::fclose(file);
    return IoError(err, "cannot write", path);
  }
  std::unique_ptr<Timeline> timeline(new Timeline(std::move(path), rank, file, options));
  // Without its writer the timeline closes its file at once (the destructor's Close).
  Timeline* t = timeline.get();
  RETURN_IF_ERROR(StartThread(&t->writer_, absl::StrCat("the timeline writer of '", t->path_, "'"),
                              [t] { t->WriterLoop(); }));
#if defined(__linux__)
  pthread_setname_np(t->writer_.native_handle(), "braid-timeline");
#endif
  return timeline;
}

absl::StatusOr<std::unique_ptr<Timeline>> Timeline::FromOptions(const Options& opts, int rank) {
  return Create(opts.timeline, rank);
}

Timeline::Timeline() : enabled_(false) {}

Timeline::Timeline(std::string path, int rank, std::FILE* file, TimelineOptions options)
    : enabled_(true),
      rank_(rank),
      path_(std::move(path)),
      options_(options),
      origin_ns_(NowNs()),
      queue_(std::make_unique<TimelineQueue<Event>>(options.queue_capacity)),
      file_(file) {}

Timeline::~Timeline() {
  const absl::Status status = Close();
  if (!status.ok()) Log().error("{}", status.ToString());
}

int Timeline::Track(absl::string_view name) {
  if (!enabled_) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < tracks_.size(); ++i) {
    if (tracks_[i] == name) return static_cast<int>(i);
  }
  tracks_.emplace_back(name);
  return static_cast<int>(tracks_.size() - 1);
}

void Timeline::Push(int track, const char* name, int64_t ts_ns, int64_t dur_ns, int64_t arg) {
  if (!queue_->TryPush(Event{name, ts_ns, dur_ns, arg, track})) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
  }
}

uint64_t Timeline::written() const { return written_.load(std::memory_order_relaxed); }

void Timeline::WriterLoop() {
  std::string buf;
  buf.reserve(kChunkBytes + 1024);
  const auto interval = absl::ToChronoNanoseconds(options_.flush_interval);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    const bool stopping = stop_;  // read before draining: everything pushed before Close() is seen
    lock.unlock();
    Drain(&buf);
    WriteOut(&buf);
    if (write_status_.ok() && std::fflush(file_) != 0) {
      write_status_ = IoError(errno, "cannot write", path_);
    }
    const uint64_t popped = queue_->popped();
    lock.lock();
    published_status_ = write_status_;
    flushed_upto_ = popped;
    flushed_cv_.notify_all();
    if (stopping) break;
    wake_writer_.wait_for(lock, interval,
                          [this] { return stop_ || flush_target_ > flushed_upto_; });
  }
  writer_exited_ = true;
  flushed_cv_.notify_all();
}

void Timeline::Drain(std::string* buf) {
  Event e;
  uint64_t n = 0;
  while (queue_->TryPop(&e)) {
    AppendEvent(e, buf);
    ++n;
    if (buf->size() >= kChunkBytes) WriteOut(buf);
  }
  written_.fetch_add(n, std::memory_order_relaxed);
}

void Timeline::WriteOut(std::string* buf) {
  if (!buf->empty() && write_status_.ok() &&
      std::fwrite(buf->data(), 1, buf->size(), file_) != buf->size()) {
    write_status_ = IoError(errno, "cannot write", path_);
  }
  buf->clear();
}

void Timeline::AppendEvent(const Event& e, std::string* out) const {
  out->append(",\n{\"name\":");
  AppendJsonString(e.name == nullptr ? absl::string_view() : absl::string_view(e.name), out);
  out->append(e.dur_ns == kInstantDuration ? ",\"ph\":\"i\",\"s\":\"t\""
              : e.dur_ns == kCounterSample ? ",\"ph\":\"C\""
                                           : ",\"ph\":\"X\"");
  absl::StrAppend(out, ",\"pid\":", rank_ + 1, ",\"tid\":", int64_t{e.track} + 1, ",\"ts\":");
  // The viewer rejects negative timestamps: an event from before creation is pinned at 0.
  AppendMicros(e.ts_ns > origin_ns_ ? e.ts_ns - origin_ns_ : 0, out);
  if (e.dur_ns == kCounterSample) {  // the series is named after the event
    out->append(",\"args\":{");
    AppendJsonString(e.name == nullptr ? absl::string_view() : absl::string_view(e.name), out);
    absl::StrAppend(out, ":", e.arg, "}}");
    return;
  }
  if (e.dur_ns != kInstantDuration) {
    out->append(",\"dur\":");
    AppendMicros(e.dur_ns, out);
  }
  if (e.arg >= 0) absl::StrAppend(out, ",\"args\":{\"v\":", e.arg, "}");
  out->push_back('}');
}

void Timeline::AppendTrailer(std::string* out) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < tracks_.size(); ++i) {
      absl::StrAppend(out, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":", rank_ + 1,
                      ",\"tid\":", i + 1, ",\"args\":{\"name\":");
      AppendJsonString(tracks_[i], out);
      absl::StrAppend(out, "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":", rank_ + 1,
                      ",\"tid\":", i + 1, ",\"args\":{\"sort_index\":", i, "}}");
    }
  }
  absl::StrAppend(out, "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"braid_rank\":", rank_,
                  ",\"events_written\":", written(), ",\"events_dropped\":", dropped(),
                  ",\"queue_capacity\":", queue_->capacity(), "}}\n");
}

absl::Status Timeline::Flush() {
  if (!enabled_) return absl::OkStatus();
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = queue_->pushed();
  if (target > flush_target_) flush_target_ = target;
  wake_writer_.notify_one();
  flushed_cv_.wait(lock, [&] { return writer_exited_ || flushed_upto_ >= target; });
  return published_status_;
}

absl::Status Timeline::Close() {
  std::lock_guard<std::mutex> close_lock(close_mu_);
  if (closed_) return close_status_;
  closed_ = true;
  if (!enabled_) return close_status_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_writer_.notify_one();
  if (writer_.joinable()) writer_.join();  // not when it could not be started
  // The writer has exited: the file is ours.
  std::string trailer;
  AppendTrailer(&trailer);
  WriteOut(&trailer);
  absl::Status status = write_status_;
  if (std::fclose(file_) != 0 && status.ok()) status = IoError(errno, "cannot close", path_);
  file_ = nullptr;
  close_status_ = status;
  return status;
}

}  // namespace braid::sched
