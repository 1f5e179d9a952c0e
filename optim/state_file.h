// The per-rank state file behind checkpoint/resume of the sharded optimizer: a self-describing
// container (a header of run identity and hyper-parameters, then named typed byte blobs) that
// knows nothing of AdamW, buckets or plans beyond the numbers it is handed.
//
//   StateHeader h;
//   h.kind = "adamw";
//   h.plan_fingerprint = plan.Fingerprint();
//   h.world_size = 4; h.rank = 1; h.shard_group_size = 4; h.replica_group_size = 1;
//   h.step = 1200;
//   h.scalars = {{"lr", 3e-4}, {"beta1", 0.9}};
//   RETURN_IF_ERROR(WriteStateFile("/ckpt/rank1.braid", h,
//       {{"bucket3/master", static_cast<int32_t>(DType::kF32), n, master, n * 4}}));
//
//   ASSIGN_OR_RETURN(LoadedState s, ReadStateFile("/ckpt/rank1.braid"));
//   RETURN_IF_ERROR(CheckCompatible(s.header(), h, s.path()));
//   ASSIGN_OR_RETURN(const LoadedSection* m, s.Find("bucket3/master", DType::kF32, n));
//   std::memcpy(master, m->data(), m->bytes);
//
// Contract: payloads and scalars are stored as raw bits (resume is bit-exact); a file is written
// to a temporary, fsynced and renamed (never half-written under its name); a CRC-32C covers it;
// every length read is bounded by the file's size first. Errors: NotFound (file, section,
// scalar), DataLoss (not a state file, truncated, corrupt), FailedPrecondition (an unknown format
// version, another run's file, a section of the wrong shape), InvalidArgument (bad input), or a
// failed system call's errno; each names the path. The byte format: docs/design/optimizer.md.
#ifndef BRAID_OPTIM_STATE_FILE_H_
#define BRAID_OPTIM_STATE_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/dtype.h"
#include "optim/crc32c.h"  // internal::Crc32c, the file's checksum (exposed for tests)

namespace braid::optim {

inline constexpr char kStateFileMagic[8] = {'B', 'R', 'A', 'I', 'D', 'S', 'T', '\0'};
inline constexpr uint32_t kStateFileVersion = 1;
// Longest kind, scalar name or section name accepted (a bound for corrupt length fields).
inline constexpr size_t kStateFileMaxNameBytes = 4096;

// Who wrote the file and with what settings. The identity fields (kind, plan_fingerprint,
// world_size, rank, group sizes) are what CheckCompatible compares; step and scalars are
// state the optimizer restores.
struct StateHeader {
  std::string kind;                // e.g. "adamw"; non-empty
  uint64_t plan_fingerprint = 0;   // e.g. BucketPlan::Fingerprint(): bucket layout + parameters
  int32_t world_size = 0;          // >= 1
  int32_t rank = 0;                // in [0, world_size)
  int32_t shard_group_size = 0;    // >= 1
  int32_t replica_group_size = 0;  // >= 1
  int64_t step = 0;                // >= 0
  // Hyper-parameters and other doubles, stored bit-exactly; names unique and non-empty.
  std::vector<std::pair<std::string, double>> scalars;
};

// One blob to write; the caller's memory is read in place (not copied) during WriteStateFile.
struct StateSection {
  std::string name;            // unique within the file, non-empty, e.g. "bucket3/master"
  int32_t dtype = 0;           // static_cast<int32_t>(braid::DType)
  uint64_t count = 0;          // elements
  const void* data = nullptr;  // may be null only when bytes == 0
  size_t bytes = 0;            // must equal count * DTypeSize(dtype)
};

// One blob read back, owning its bytes (one allocation, aligned for any element type).
struct LoadedSection {
  std::string name;
  int32_t dtype = 0;
  uint64_t count = 0;
  size_t bytes = 0;
  std::unique_ptr<unsigned char[]> storage;  // null when bytes == 0

  const void* data() const { return storage.get(); }
};

// A whole file read back: its header and sections, with lookups whose errors name the path.
class LoadedState {
 public:
  LoadedState() = default;
  LoadedState(std::string path, StateHeader header, std::vector<LoadedSection> sections);

  const std::string& path() const { return path_; }
  const StateHeader& header() const { return header_; }
  const std::vector<LoadedSection>& sections() const { return sections_; }

  // NotFound naming the path and the section.
  absl::StatusOr<const LoadedSection*> Find(absl::string_view name) const;
  // Find, then FailedPrecondition unless the section holds exactly `count` elements of
  // `dtype` ("wrong shape": the file was written for different parameters).
  absl::StatusOr<const LoadedSection*> Find(absl::string_view name, DType dtype,
                                            uint64_t count) const;
  // The named scalar of the header, bit-exact; NotFound naming the path and the scalar.
  absl::StatusOr<double> Scalar(absl::string_view name) const;

 private:
  std::string path_;
  StateHeader header_;
  std::vector<LoadedSection> sections_;
  absl::flat_hash_map<std::string, size_t> index_;  // section name -> position in sections_
};

// Writes `path` atomically: a temporary file beside it ("<path>.tmp.<unique>"), fsync, rename
// over `path`, fsync of the directory. On any failure the temporary is removed and whatever
// was at `path` before is untouched. A process killed mid-write may leave a stale
// "<path>.tmp.*" behind (never a partial `path`); such leftovers are safe to delete.
absl::Status WriteStateFile(const std::string& path, const StateHeader& header,
                            const std::vector<StateSection>& sections);

// Reads and fully verifies `path` (magic, version, every length, checksum) before returning.
absl::StatusOr<LoadedState> ReadStateFile(const std::string& path);

// OK when `file` (read from `path`) was written by the same kind of optimizer, plan and
// position in the same world as `expected` describes. Otherwise FailedPrecondition naming the
// path and every identity field that differs, e.g. "state file /x/rank1.braid was written with
// world size 4, this run has 2". Step and scalars are not compared: they are the state.
absl::Status CheckCompatible(const StateHeader& file, const StateHeader& expected,
                             const std::string& path);

}  // namespace braid::optim

#endif  // BRAID_OPTIM_STATE_FILE_H_
