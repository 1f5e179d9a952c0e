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
#include <map>
#include <string>
#include <utility>
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

// The per-bucket records a hook loaded from a checkpoint, kept by the bucket layout they were
// saved in (comm_hook.h): records of the current layout wait in loaded() until their bucket
// runs; another layout's are never applied to these buckets, but wait pending for the re-plan
// that yields their layout (installed then), and are dropped by a re-plan to any other layout
// or once a stage runs a second step still in another layout (NoteRun). One per hook, used
// from its Run / OnReplan / SaveState / LoadState (the reducer serializes those).
template <typename Key, typename Record>
class LayoutRecords {
 public:
  using Records = std::map<Key, Record>;
  uint64_t layout() const { return layout_; }  // the buckets' (Attach, Replan)
  void Attach(uint64_t layout) { layout_ = layout; }
  // The buckets moved to `layout`: records loaded for the old ones go; pending ones of
  // `layout` are installed, others dropped.
  void Replan(uint64_t layout) {
    loaded_.clear();
    layout_ = layout;
    if (!pending_.empty() && pending_layout_ == layout_) loaded_ = std::move(pending_);
    DropPending();
  }
  // LoadState's records, saved under `saved_layout`; replaces whatever was loaded or pending.
  void Load(Records records, uint64_t saved_layout) {
    loaded_.clear();
    DropPending();
    if (saved_layout == layout_) {
      loaded_ = std::move(records);
    } else {
      pending_ = std::move(records);
      pending_layout_ = saved_layout;
    }
  }
  // Run of a bucket of stage `stage_bit` (one bit per stage); `last`: the step's last bucket.
  void NoteRun(bool last, unsigned stage_bit = 1) {
    if (pending_stepped_ & stage_bit) DropPending();  // a second step, still in another layout
    if (last && !pending_.empty()) pending_stepped_ |= stage_bit;
  }
  // What SaveState writes besides the live state: the pending records (then only those, under
  // their layout) while there are, else the loaded ones not run yet (under the current one).
  bool pending() const { return !pending_.empty(); }
  uint64_t saved_layout() const { return pending() ? pending_layout_ : layout_; }
  const Records& to_save() const { return pending() ? pending_ : loaded_; }
  Records& loaded() { return loaded_; }  // taken by Run as their buckets run

 private:
  void DropPending() {
    pending_.clear();
    pending_layout_ = 0;
    pending_stepped_ = 0;
  }
  uint64_t layout_ = 0;
  Records loaded_, pending_;
  uint64_t pending_layout_ = 0;
  unsigned pending_stepped_ = 0;  // stages whose step's last bucket ran since the load
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_HOOKS_HOOK_STATE_H_
