#include "comm/flight_recorder.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/dtype.h"
#include "comm/group.h"
#include "comm/json_string.h"
#include "comm/logging.h"
#include "comm/status_macros.h"

namespace braid {
namespace {

// Copies `src` into a NUL-terminated field, marking a cut with a final '~'.
template <size_t N>
void CopyField(char (&dst)[N], absl::string_view src) {
  const size_t n = src.size() < N - 1 ? src.size() : N - 1;
  std::memcpy(dst, src.data(), n);
  if (n < src.size()) dst[N - 2] = '~';
  dst[n] = '\0';
}

// A per-slot spin lock: writers to one slot are a record and its own finish (or a record that
// wrapped around onto a late finish), so contention is rare and short.
class SlotLock {
 public:
  explicit SlotLock(std::atomic<bool>& busy) : busy_(busy) {
    while (busy_.exchange(true, std::memory_order_acquire)) std::this_thread::yield();
  }
  ~SlotLock() { busy_.store(false, std::memory_order_release); }
  SlotLock(const SlotLock&) = delete;
  SlotLock& operator=(const SlotLock&) = delete;

 private:
  std::atomic<bool>& busy_;
};

}  // namespace

absl::string_view FlightStateName(FlightState s) {
  switch (s) {
    case FlightState::kIssued:
      return "issued";
    case FlightState::kCompleted:
      return "completed";
    case FlightState::kFailed:
      return "failed";
  }
  return "invalid";
}

FlightRecorder::Config FlightRecorder::Config::FromOptions(const Options& o) {
  Config c;
  c.entries = o.flight_recorder_entries;
  c.dir = o.flight_recorder_dir;
  c.signal = o.flight_recorder_signal;
  return c;
}

std::shared_ptr<FlightRecorder> FlightRecorder::Create(const Config& config, int rank,
                                                       const std::shared_ptr<AbortDomain>& domain) {
  if (config.entries == 0) return nullptr;
  std::string path = config.dir.empty()
                         ? std::string()
                         : absl::StrCat(config.dir, "/braid_flight.rank", rank, ".jsonl");
  std::shared_ptr<FlightRecorder> r(new FlightRecorder(config.entries, rank, std::move(path)));
  if (domain != nullptr && !r->auto_path_.empty()) {
    FlightRecorder* raw = r.get();  // the subscription dies first in ~FlightRecorder
    r->on_abort_ = domain->Subscribe([raw](const absl::Status& cause) {
      raw->DumpOnce(absl::StrCat("job aborted: ", cause.message()));
    });
  }
  return r;
}

FlightRecorder::FlightRecorder(size_t entries, int rank, std::string auto_path)
    : rank_(rank),
      auto_path_(std::move(auto_path)),
      capacity_(entries),
      slots_(new Slot[entries]) {}

FlightRecorder::~FlightRecorder() {
  on_signal_.Reset();
  on_abort_.Reset();
}

absl::Status FlightRecorder::DumpOnSignal(int signo) {
  if (auto_path_.empty()) {
    return absl::FailedPreconditionError(
        "BRAID_FLIGHT_RECORDER_SIGNAL needs BRAID_FLIGHT_RECORDER_DIR (where to write the dumps)");
  }
  ASSIGN_OR_RETURN(on_signal_, FlightSignal::Subscribe(signo, [this](absl::string_view reason) {
                     const absl::Status st = DumpTo(auto_path_, reason);
                     if (!st.ok())
                       Log().warn("flight recorder dump on a signal: {}", st.ToString());
                   }));
  return absl::OkStatus();
}

int64_t FlightRecorder::NowNs() { return absl::GetCurrentTimeNanos(); }

void FlightRecorder::Record(const CollectiveArgs& args, int group_rank, int group_size, Work& work,
                            int64_t issued_ns) {
  const uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
  const WorkInfo& info = work.info();
  {
    Slot& slot = SlotOf(id);
    SlotLock lock(slot.busy);
    FlightRecord& r = slot.record;
    r.id = id;
    CopyField(r.group, info.group);
    CopyField(r.op, info.op);
    CopyField(r.label, info.label);
    r.error[0] = '\0';
    r.seq = info.seq;
    r.count = args.count;
    const bool barrier = args.kind == CollectiveKind::kBarrier;
    r.dtype = barrier ? -1 : static_cast<int32_t>(args.dtype);
    r.bytes = barrier ? 0 : args.count * DTypeSize(args.dtype);
    r.group_rank = group_rank;
    r.group_size = group_size;
    r.status_code = 0;
    r.issued_ns = issued_ns;
    r.started_ns = 0;
    r.completed_ns = 0;
    r.state = FlightState::kIssued;
  }
  work.Observe(shared_from_this(), id);
}

void FlightRecorder::WorkFinished(uint64_t id, const absl::Status& status, int64_t started_ns) {
  const int64_t now = NowNs();
  {
    Slot& slot = SlotOf(id);
    SlotLock lock(slot.busy);
    FlightRecord& r = slot.record;
    if (r.id != id) return;  // overwritten by a newer record: this one is gone from the ring
    r.started_ns = started_ns;
    r.completed_ns = now;
    r.state = status.ok() ? FlightState::kCompleted : FlightState::kFailed;
    r.status_code = static_cast<int32_t>(status.code());
    if (!status.ok()) CopyField(r.error, status.message());
  }
  if (!status.ok() && !auto_path_.empty()) {
    DumpOnce(absl::StrCat("collective failed: ", status.message()));
  }
}

void FlightRecorder::WorkStarted(uint64_t id, int64_t started_ns) {
  Slot& slot = SlotOf(id);
  SlotLock lock(slot.busy);
  if (slot.record.id == id) slot.record.started_ns = started_ns;
}

std::vector<FlightRecord> FlightRecorder::Snapshot() const {
  const uint64_t end = next_id_.load(std::memory_order_acquire);
  const uint64_t begin = end > capacity_ ? end - capacity_ : 0;
  std::vector<FlightRecord> out;
  out.reserve(end - begin);
  for (uint64_t id = begin; id < end; ++id) {
    Slot& slot = SlotOf(id);
    SlotLock lock(slot.busy);
    // A slot claimed but not yet filled holds an older id, one overwritten since holds a newer
    // one: keep only what is still this id's record.
    if (slot.record.id == id) out.push_back(slot.record);
  }
  return out;
}

std::string FlightRecordJson(const FlightRecord& r) {
  std::string s = absl::StrCat("{\"id\":", r.id, ",\"group\":");
  AppendJsonString(r.group, &s);
  absl::StrAppend(&s, ",\"group_rank\":", r.group_rank, ",\"group_size\":", r.group_size,
                  ",\"seq\":", r.seq, ",\"op\":");
  AppendJsonString(r.op, &s);
  absl::StrAppend(&s, ",\"dtype\":\"",
                  r.dtype < 0 ? absl::string_view("none") : DTypeName(static_cast<DType>(r.dtype)),
                  "\",\"count\":", r.count, ",\"bytes\":", r.bytes, ",\"label\":");
  AppendJsonString(r.label, &s);
  absl::StrAppend(&s, ",\"state\":\"", FlightStateName(r.state), "\",\"issued_ns\":", r.issued_ns,
                  ",\"started_ns\":", r.started_ns, ",\"completed_ns\":", r.completed_ns,
                  ",\"error\":");
  AppendJsonString(r.error, &s);
  s.push_back('}');
  return s;
}

absl::Status FlightRecorder::DumpTo(const std::string& path, absl::string_view reason) const {
  const std::vector<FlightRecord> records = Snapshot();
  std::string header =
      absl::StrCat("{\"braid_flight_recorder\":1,\"rank\":", rank_, ",\"capacity\":", capacity_,
                   ",\"recorded\":", recorded(), ",\"dumped_ns\":", NowNs(), ",\"reason\":");
  AppendJsonString(reason, &header);
  header.append("}\n");
  // Written to a temporary name and renamed, so a reader never sees half a dump.
  const std::string tmp = absl::StrCat(path, ".tmp");
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    const int err = errno;
    const std::string msg = absl::StrCat("flight recorder of rank ", rank_, ": cannot open '", tmp,
                                         "': ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::FailedPreconditionError(msg);
  }
  bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (const FlightRecord& r : records) {
    std::string line = FlightRecordJson(r);
    line.push_back('\n');
    ok = ok && std::fwrite(line.data(), 1, line.size(), f) == line.size();
  }
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat(
        "flight recorder of rank ", rank_, ": cannot write '", path, "': ", std::strerror(err)));
  }
  return absl::OkStatus();
}

void FlightRecorder::DumpOnce(absl::string_view reason) {
  if (auto_path_.empty() || auto_dumped_.exchange(true)) return;
  const absl::Status s = DumpTo(auto_path_, reason);
  if (s.ok()) {
    Log().warn("rank {}: flight recorder written to {} ({})", rank_, auto_path_,
               std::string(reason));
  } else {
    Log().error("{}", std::string(s.message()));
  }
}

}  // namespace braid
