// A communication hook's per-rank state as bytes, for checkpoints (CommHook::SaveState /
// LoadState): error feedback and PowerSGD's warm-start Q, keyed by bucket, and what is
// hook-wide (PowerSGD's step and draw counts).
//
//   HookStateWriter w("powersgd", group_size, rank);
//   w.Key(bucket);  w.Int(iter);  w.Floats(error);
//   std::string bytes = w.Finish();
//   ASSIGN_OR_RETURN(HookStateReader r, HookStateReader::Open(bytes, "powersgd", size, rank));
//   while (!r.AtEnd()) { ASSIGN_OR_RETURN(int64_t b, r.Int()); ... }
//
// Layout: "BRHS" u32 version, the hook's name, the group size and rank it was saved at, then
// the hook's fields (native byte order: a checkpoint is read back on the same kind of machine).
// Open refuses another hook's state, another group size or another rank by name: the state
// follows this rank's elements of each bucket, so it cannot be resharded (the caller restarts
// the hook's warm-up instead by not loading it).
#ifndef BRAID_SCHEDULER_HOOKS_HOOK_STATE_H_
#define BRAID_SCHEDULER_HOOKS_HOOK_STATE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace braid::sched {

class HookStateWriter {
 public:
  HookStateWriter(absl::string_view hook, int group_size, int rank);
  void Int(int64_t v);
  void Floats(const std::vector<float>& v);
  std::string Finish() { return std::move(out_); }

 private:
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

class HookStateReader {
 public:
  // FailedPrecondition naming what differs (hook, group size, rank); InvalidArgument for bytes
  // that are no hook state.
  static absl::StatusOr<HookStateReader> Open(absl::string_view bytes, absl::string_view hook,
                                              int group_size, int rank);
  bool AtEnd() const { return at_ == bytes_.size(); }
  absl::StatusOr<int64_t> Int();
  absl::StatusOr<std::vector<float>> Floats();

 private:
  explicit HookStateReader(absl::string_view bytes) : bytes_(bytes) {}
  absl::Status Raw(void* p, size_t n);
  absl::string_view bytes_;
  size_t at_ = 0;
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_HOOKS_HOOK_STATE_H_
