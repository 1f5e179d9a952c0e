// A communication hook's per-rank state as bytes, for checkpoints (CommHook::SaveState /
// LoadState): error feedback and PowerSGD's warm-start Q, keyed by bucket, and what is
// hook-wide (PowerSGD's step and draw counts).
//
//   HookStateWriter w("powersgd", group_size, rank, layout);
//   w.Int(iter);  w.Int(bucket);  w.Floats(error);
//   std::string bytes = w.Finish();
//   ASSIGN_OR_RETURN(HookStateReader r, HookStateReader::Open(bytes, "powersgd", size, rank));
//   if (r.layout() != layout) ...   // per-bucket records of another bucket layout
//   while (!r.AtEnd()) { ASSIGN_OR_RETURN(int64_t b, r.Int()); ... }
//
// Layout (version 2): "BRHS", the version (i64), the hook's name, the group size and rank it was
// saved at, the fingerprint of the bucket layout (BucketPlan::Fingerprint(), CommAttach /
// CommHook::OnReplan) its per-bucket records belong to, then the hook's fields (native byte
// order: a checkpoint is read back on the same kind of machine). Version 1 (0.11 before the
// layout was recorded) is refused by its number: its per-bucket records cannot be told apart
// from another layout's. Open refuses another hook's state, another group size or another rank
// by name: the state follows this rank's elements of each bucket, so it cannot be resharded
// (the caller restarts the hook's warm-up instead by not loading it). Open does not compare
// the layout: the hook decides (hooks keep another layout's records pending, comm_hook.h).
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
  // `layout`: the fingerprint of the bucket layout the per-bucket records belong to.
  HookStateWriter(absl::string_view hook, int group_size, int rank, uint64_t layout);
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
  uint64_t layout() const { return layout_; }  // the bucket layout the state was saved with
  bool AtEnd() const { return at_ == bytes_.size(); }
  absl::StatusOr<int64_t> Int();
  absl::StatusOr<std::vector<float>> Floats();

 private:
  explicit HookStateReader(absl::string_view bytes) : bytes_(bytes) {}
  absl::Status Raw(void* p, size_t n);
  absl::string_view bytes_;
  size_t at_ = 0;
  uint64_t layout_ = 0;
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_HOOKS_HOOK_STATE_H_
