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
// Why a file of our own rather than a general serializer: resume must be bit-exact (payloads
// and scalars are stored as raw bits, NaN payloads and -0.0 included), a crash mid-save must
// never leave a half-written file under the final name (write to a temporary, fsync, rename),
// and hundreds of MB per rank are streamed straight from and into the optimizer's buffers.
//
// Format, version 1 (integers little-endian, fixed width; "str" = u32 byte length + bytes):
//
//   offset  size  field
//   0       8     magic "BRAIDST\0"
//   8       4     u32 format version (1)
//   12      4     u32 H: header body length in bytes
//   16      8     u64 total file length in bytes, magic and checksum included
//   24      H     header body: str kind, u64 plan_fingerprint, i32 world_size, i32 rank,
//                 i32 shard_group_size, i32 replica_group_size, i64 step,
//                 u32 scalar count, then per scalar {str name, u64 bits of the f64 value},
//                 u32 section count
//   24+H    ...   sections, each: str name, i32 dtype (a braid::DType value), u64 element
//                 count, u64 payload bytes (== count * DTypeSize(dtype)), payload bytes
//                 (elements in host order, which is little-endian on every supported target)
//   end-4   4     u32 CRC-32C (Castagnoli) of every byte from offset 8 up to here
//
// CRC-32C (optim/crc32c.h) is computed in software (slicing-by-8) so the file needs no library
// and no CPU feature; it catches every burst error up to 32 bits and random corruption with
// probability 1 - 2^-32, which is what a torn or bit-rotted checkpoint needs. The bytes move
// through optim/state_file_io.h (atomic write, bounded checksummed reads). Every length read
// from a file is bounded by the file's real size before anything is allocated, so a corrupt
// or hostile file yields a DataLoss status naming the path, never a crash or a huge
// allocation.
//
// Error codes: NotFound (no such file, section or scalar), DataLoss (not a state file,
// truncated, corrupt, checksum mismatch), FailedPrecondition (a format version this build does
// not read; a file from a different run: CheckCompatible, or a section of the wrong shape),
// InvalidArgument (bad input to WriteStateFile), or the errno of a failed system call.
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
