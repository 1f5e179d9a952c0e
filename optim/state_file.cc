// State file writer and reader: the format (documented in state_file.h) over the byte
// streams of state_file_io.h.
#include "optim/state_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "comm/check.h"
#include "comm/status_macros.h"
#include "optim/state_file_io.h"

namespace braid::optim {

// Payload elements are stored in host order; the format says little-endian, so refuse to build
// where the two differ rather than write files no other host can read.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "state files assume a little-endian host");
static_assert(sizeof(size_t) == 8, "section sizes are u64");

namespace {

using internal::BadInput;
using internal::Corrupt;
using internal::CreateTemp;
using internal::DirectoryOf;
using internal::GetLe;
using internal::ScopedFd;
using internal::StreamReader;
using internal::StreamWriter;
using internal::SyncDirectory;
using internal::SysError;
using internal::TempFileGuard;
using internal::Truncated;

constexpr size_t kMagicBytes = sizeof(kStateFileMagic);
constexpr size_t kPreambleBytes = 24;  // magic, version, header length, file length
constexpr size_t kTrailerBytes = 4;    // CRC-32C
// name length + dtype + count + payload bytes: the fixed part of a section record.
constexpr size_t kSectionFixedBytes = 4 + 4 + 8 + 8;

// ---- little-endian encoding --------------------------------------------------------------

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU32(std::string* out, uint32_t v) { PutLe(out, v, 4); }
void PutU64(std::string* out, uint64_t v) { PutLe(out, v, 8); }
void PutI32(std::string* out, int32_t v) { PutLe(out, static_cast<uint32_t>(v), 4); }
void PutI64(std::string* out, int64_t v) { PutLe(out, static_cast<uint64_t>(v), 8); }
void PutStr(std::string* out, absl::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}

uint64_t DoubleBits(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof(bits));
  return bits;
}
double BitsDouble(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof(d));
  return d;
}

// Parses the header body held in memory; every field read is bounded by the body's length.
class HeaderCursor {
 public:
  HeaderCursor(const std::string& body, uint64_t base, const std::string& path)
      : body_(body), base_(base), path_(path) {}

  absl::StatusOr<uint64_t> Le(int bytes, absl::string_view what) {
    RETURN_IF_ERROR(Need(static_cast<uint64_t>(bytes), what));
    uint64_t v = GetLe(reinterpret_cast<const unsigned char*>(body_.data()) + pos_, bytes);
    pos_ += static_cast<size_t>(bytes);
    return v;
  }

  absl::StatusOr<std::string> Str(absl::string_view what) {
    ASSIGN_OR_RETURN(uint64_t n, Le(4, absl::StrCat(what, " length")));
    if (n > kStateFileMaxNameBytes) {
      return Corrupt(path_, absl::StrCat(what, " length ", n, " exceeds the limit of ",
                                         kStateFileMaxNameBytes));
    }
    RETURN_IF_ERROR(Need(n, what));
    std::string s = body_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }

  uint64_t left() const { return body_.size() - pos_; }

 private:
  absl::Status Need(uint64_t n, absl::string_view what) {
    if (n > left()) {
      return Corrupt(path_, absl::StrCat(what, " at byte ", base_ + pos_, " needs ", n,
                                         " bytes, but the header ends ", left(), " bytes later"));
    }
    return absl::OkStatus();
  }

  const std::string& body_;
  uint64_t base_;  // file offset of body_[0], for messages
  const std::string& path_;
  size_t pos_ = 0;
};

// ---- validation shared by writer and reader ------------------------------------------------

// Returns an empty string when the header is well-formed, else what is wrong with it.
std::string HeaderProblem(const StateHeader& h) {
  if (h.kind.empty()) return "kind is empty";
  if (h.kind.size() > kStateFileMaxNameBytes) return "kind is too long";
  if (h.world_size < 1) return absl::StrCat("world size ", h.world_size, " is not positive");
  if (h.rank < 0 || h.rank >= h.world_size) {
    return absl::StrCat("rank ", h.rank, " is outside [0, ", h.world_size, ")");
  }
  if (h.shard_group_size < 1) {
    return absl::StrCat("shard group size ", h.shard_group_size, " is not positive");
  }
  if (h.replica_group_size < 1) {
    return absl::StrCat("replica group size ", h.replica_group_size, " is not positive");
  }
  if (h.step < 0) return absl::StrCat("step ", h.step, " is negative");
  absl::flat_hash_set<absl::string_view> names;
  for (const auto& [name, value] : h.scalars) {
    if (name.empty()) return "a scalar has an empty name";
    if (name.size() > kStateFileMaxNameBytes) return absl::StrCat("scalar name is too long");
    if (!names.insert(name).second) return absl::StrCat("scalar \"", name, "\" appears twice");
  }
  return "";
}

// Returns an empty string when the section's name, dtype, count and bytes agree.
std::string SectionShapeProblem(absl::string_view name, int32_t dtype, uint64_t count,
                                uint64_t bytes) {
  if (name.empty()) return "a section has an empty name";
  if (name.size() > kStateFileMaxNameBytes) return "a section name is too long";
  if (!IsValidDType(dtype)) {
    return absl::StrCat("section \"", name, "\" has unknown dtype ", dtype);
  }
  const uint64_t elem = DTypeSize(static_cast<DType>(dtype));
  if (bytes % elem != 0 || bytes / elem != count) {
    return absl::StrCat("section \"", name, "\" holds ", bytes, " bytes, but ", count, " ",
                        DTypeName(static_cast<DType>(dtype)), " elements need ",
                        count <= std::numeric_limits<uint64_t>::max() / elem
                            ? absl::StrCat(count * elem)
                            : std::string("2^64 or more"));
  }
  return "";
}

std::string EncodeHeaderBody(const StateHeader& h, size_t section_count) {
  std::string body;
  PutStr(&body, h.kind);
  PutU64(&body, h.plan_fingerprint);
  PutI32(&body, h.world_size);
  PutI32(&body, h.rank);
  PutI32(&body, h.shard_group_size);
  PutI32(&body, h.replica_group_size);
  PutI64(&body, h.step);
  PutU32(&body, static_cast<uint32_t>(h.scalars.size()));
  for (const auto& [name, value] : h.scalars) {
    PutStr(&body, name);
    PutU64(&body, DoubleBits(value));
  }
  PutU32(&body, static_cast<uint32_t>(section_count));
  return body;
}

absl::StatusOr<StateHeader> ParseHeaderBody(const std::string& body, uint64_t base,
                                            uint64_t max_sections, uint32_t* section_count,
                                            const std::string& path) {
  HeaderCursor in(body, base, path);
  StateHeader h;
  ASSIGN_OR_RETURN(h.kind, in.Str("kind"));
  ASSIGN_OR_RETURN(h.plan_fingerprint, in.Le(8, "plan fingerprint"));
  ASSIGN_OR_RETURN(uint64_t world, in.Le(4, "world size"));
  ASSIGN_OR_RETURN(uint64_t rank, in.Le(4, "rank"));
  ASSIGN_OR_RETURN(uint64_t shard, in.Le(4, "shard group size"));
  ASSIGN_OR_RETURN(uint64_t replica, in.Le(4, "replica group size"));
  ASSIGN_OR_RETURN(uint64_t step, in.Le(8, "step"));
  h.world_size = static_cast<int32_t>(static_cast<uint32_t>(world));
  h.rank = static_cast<int32_t>(static_cast<uint32_t>(rank));
  h.shard_group_size = static_cast<int32_t>(static_cast<uint32_t>(shard));
  h.replica_group_size = static_cast<int32_t>(static_cast<uint32_t>(replica));
  h.step = static_cast<int64_t>(step);

  ASSIGN_OR_RETURN(uint64_t scalar_count, in.Le(4, "scalar count"));
  // Each scalar takes at least 4 + 1 + 8 bytes: bound the count before reserving.
  if (scalar_count > in.left() / 13) {
    return Corrupt(path, absl::StrCat("scalar count ", scalar_count, " does not fit in the ",
                                      body.size(), "-byte header"));
  }
  h.scalars.reserve(static_cast<size_t>(scalar_count));
  for (uint64_t i = 0; i < scalar_count; ++i) {
    ASSIGN_OR_RETURN(std::string name, in.Str(absl::StrCat("scalar ", i, " name")));
    ASSIGN_OR_RETURN(uint64_t bits, in.Le(8, absl::StrCat("scalar \"", name, "\"")));
    h.scalars.emplace_back(std::move(name), BitsDouble(bits));
  }
  ASSIGN_OR_RETURN(uint64_t sections, in.Le(4, "section count"));
  if (in.left() != 0) {
    return Corrupt(path, absl::StrCat("header has ", in.left(), " unexpected bytes at its end"));
  }
  if (sections > max_sections) {
    return Corrupt(path,
                   absl::StrCat("section count ", sections, " cannot fit in the rest of the file"));
  }
  std::string problem = HeaderProblem(h);
  if (!problem.empty()) return Corrupt(path, absl::StrCat("header: ", problem));
  *section_count = static_cast<uint32_t>(sections);
  return h;
}

absl::StatusOr<LoadedSection> ReadSection(StreamReader& in, uint32_t index,
                                          const std::string& path) {
  const std::string label = absl::StrCat("section ", index);
  LoadedSection s;
  ASSIGN_OR_RETURN(uint64_t name_len, in.ReadLe(4, absl::StrCat(label, " name length")));
  if (name_len > kStateFileMaxNameBytes) {
    return Corrupt(path, absl::StrCat(label, " name length ", name_len, " exceeds the limit of ",
                                      kStateFileMaxNameBytes));
  }
  s.name.resize(static_cast<size_t>(name_len));
  RETURN_IF_ERROR(in.Read(s.name.data(), name_len, absl::StrCat(label, " name")));
  const std::string named = absl::StrCat("section \"", s.name, "\"");
  ASSIGN_OR_RETURN(uint64_t dtype, in.ReadLe(4, absl::StrCat(named, " dtype")));
  ASSIGN_OR_RETURN(s.count, in.ReadLe(8, absl::StrCat(named, " element count")));
  ASSIGN_OR_RETURN(uint64_t bytes, in.ReadLe(8, absl::StrCat(named, " byte length")));
  s.dtype = static_cast<int32_t>(static_cast<uint32_t>(dtype));
  std::string problem = SectionShapeProblem(s.name, s.dtype, s.count, bytes);
  if (!problem.empty()) return Corrupt(path, problem);
  // Bounded before allocating: a corrupt length fails here instead of in operator new.
  if (bytes > in.remaining()) {
    return Corrupt(path, absl::StrCat(named, " at byte ", in.offset(), " claims ", bytes,
                                      " payload bytes, but only ", in.remaining(),
                                      " remain before the checksum"));
  }
  s.bytes = static_cast<size_t>(bytes);
  if (s.bytes > 0) {
    // Uninitialized on purpose: every byte is about to be overwritten by read().
    s.storage.reset(new unsigned char[s.bytes]);
    RETURN_IF_ERROR(in.Read(s.storage.get(), bytes, absl::StrCat(named, " payload")));
  }
  return s;
}

}  // namespace

// ---- LoadedState -----------------------------------------------------------------------------

LoadedState::LoadedState(std::string path, StateHeader header, std::vector<LoadedSection> sections)
    : path_(std::move(path)), header_(std::move(header)), sections_(std::move(sections)) {
  index_.reserve(sections_.size());
  for (size_t i = 0; i < sections_.size(); ++i) index_.emplace(sections_[i].name, i);
}

absl::StatusOr<const LoadedSection*> LoadedState::Find(absl::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(
        absl::StrCat("state file ", path_, " has no section \"", name, "\""));
  }
  return &sections_[it->second];
}

absl::StatusOr<const LoadedSection*> LoadedState::Find(absl::string_view name, DType dtype,
                                                       uint64_t count) const {
  ASSIGN_OR_RETURN(const LoadedSection* s, Find(name));
  if (s->dtype != static_cast<int32_t>(dtype) || s->count != count) {
    const std::string file_type = IsValidDType(s->dtype)
                                      ? std::string(DTypeName(static_cast<DType>(s->dtype)))
                                      : absl::StrCat("dtype ", s->dtype);
    return absl::FailedPreconditionError(
        absl::StrCat("state file ", path_, ": section \"", name, "\" holds ", s->count, " ",
                     file_type, " elements, this run expects ", count, " ", DTypeName(dtype),
                     " elements (the parameters or the bucket plan differ)"));
  }
  return s;
}

absl::StatusOr<double> LoadedState::Scalar(absl::string_view name) const {
  for (const auto& [n, v] : header_.scalars) {
    if (n == name) return v;
  }
  return absl::NotFoundError(absl::StrCat("state file ", path_, " has no scalar \"", name, "\""));
}

// ---- WriteStateFile --------------------------------------------------------------------------

absl::Status WriteStateFile(const std::string& path, const StateHeader& header,
                            const std::vector<StateSection>& sections) {
  // Validate everything before touching the filesystem, so bad input never costs a file.
  if (path.empty() || path.back() == '/') return BadInput(path, "path names no file");
  std::string problem = HeaderProblem(header);
  if (!problem.empty()) return BadInput(path, problem);
  if (header.scalars.size() > std::numeric_limits<uint32_t>::max() ||
      sections.size() > std::numeric_limits<uint32_t>::max()) {
    return BadInput(path, "too many scalars or sections");
  }
  absl::flat_hash_set<absl::string_view> names;
  uint64_t sections_bytes = 0;
  for (const StateSection& s : sections) {
    problem = SectionShapeProblem(s.name, s.dtype, s.count, s.bytes);
    if (!problem.empty()) return BadInput(path, problem);
    if (s.data == nullptr && s.bytes > 0) {
      return BadInput(path, absl::StrCat("section \"", s.name, "\" has no data"));
    }
    if (!names.insert(s.name).second) {
      return BadInput(path, absl::StrCat("section \"", s.name, "\" appears twice"));
    }
    sections_bytes += kSectionFixedBytes + s.name.size() + s.bytes;
  }
  const std::string body = EncodeHeaderBody(header, sections.size());
  if (body.size() > std::numeric_limits<uint32_t>::max()) {
    return BadInput(path, "header is larger than 4 GiB");
  }
  const uint64_t file_bytes = kPreambleBytes + body.size() + sections_bytes + kTrailerBytes;

  ASSIGN_OR_RETURN(auto created, CreateTemp(path));
  const std::string& tmp = created.first;
  TempFileGuard guard(tmp);
  ScopedFd fd(created.second);

  StreamWriter out(fd.get(), path);
  RETURN_IF_ERROR(out.PutUnchecksummed(kStateFileMagic, kMagicBytes));
  std::string fixed;
  PutU32(&fixed, kStateFileVersion);
  PutU32(&fixed, static_cast<uint32_t>(body.size()));
  PutU64(&fixed, file_bytes);
  RETURN_IF_ERROR(out.Put(fixed));
  RETURN_IF_ERROR(out.Put(body));
  for (const StateSection& s : sections) {
    fixed.clear();
    PutStr(&fixed, s.name);
    PutI32(&fixed, s.dtype);
    PutU64(&fixed, s.count);
    PutU64(&fixed, s.bytes);
    RETURN_IF_ERROR(out.Put(fixed));
    if (s.bytes > 0) RETURN_IF_ERROR(out.Put(s.data, s.bytes));
  }
  fixed.clear();
  PutU32(&fixed, out.crc());
  RETURN_IF_ERROR(out.PutUnchecksummed(fixed.data(), fixed.size()));
  RETURN_IF_ERROR(out.Flush());
  BRAID_CHECK(out.written() == file_bytes);  // the length in the preamble must be the truth

  // Data on disk before the name points at it: otherwise a crash after the rename could
  // expose a file of the right name and length full of zeros.
  if (::fsync(fd.get()) != 0) return SysError(errno, path, "fsync failed");
  RETURN_IF_ERROR(fd.Close(path));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return SysError(errno, path, absl::StrCat("cannot rename ", tmp, " to it"));
  }
  guard.Keep();  // the temporary is now `path`
  return SyncDirectory(DirectoryOf(path), path);
}

// ---- ReadStateFile ---------------------------------------------------------------------------

absl::StatusOr<LoadedState> ReadStateFile(const std::string& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return SysError(errno, path, "cannot open");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return SysError(errno, path, "fstat failed");
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("state file ", path, " is not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) return Truncated(path, 0, "the file is empty");
  StreamReader in(fd.get(), size, path);

  // Magic first, so that a file that is not ours says so instead of "truncated".
  char magic[kMagicBytes];
  const uint64_t magic_have = std::min<uint64_t>(size, kMagicBytes);
  RETURN_IF_ERROR(in.Read(magic, magic_have, "the magic", /*checksummed=*/false));
  if (std::memcmp(magic, kStateFileMagic, static_cast<size_t>(magic_have)) != 0) {
    return absl::DataLossError(
        absl::StrCat("state file ", path, " is not a Braid state file (wrong magic bytes)"));
  }
  if (size < kMagicBytes) return Truncated(path, size, "inside the magic");

  if (size < kMagicBytes + 4) return Truncated(path, size, "inside the format version");
  ASSIGN_OR_RETURN(uint64_t version, in.ReadLe(4, "the format version"));
  if (version > kStateFileVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state file ", path, " has format version ", version, ", this build reads version ",
        kStateFileVersion, " (written by a newer Braid?)"));
  }
  if (version != kStateFileVersion) {
    return Corrupt(path, absl::StrCat("format version ", version,
                                      " is unknown (this build "
                                      "reads version ",
                                      kStateFileVersion, ")"));
  }

  if (size < kPreambleBytes) return Truncated(path, size, "inside the preamble");
  ASSIGN_OR_RETURN(uint64_t header_bytes, in.ReadLe(4, "the header length"));
  ASSIGN_OR_RETURN(uint64_t file_bytes, in.ReadLe(8, "the file length"));
  if (size < file_bytes) {
    return Truncated(path, size, absl::StrCat("the file should be ", file_bytes, " bytes"));
  }
  if (size > file_bytes) {
    return Corrupt(path,
                   absl::StrCat("it records a length of ", file_bytes, " bytes but holds ", size));
  }
  // From here on reads stop before the trailing checksum.
  in.set_limit(size - kTrailerBytes);
  if (size < kPreambleBytes + kTrailerBytes || header_bytes > in.remaining()) {
    return Corrupt(path, absl::StrCat("header length ", header_bytes, " does not fit in a ", size,
                                      "-byte file"));
  }
  std::string body(static_cast<size_t>(header_bytes), '\0');
  RETURN_IF_ERROR(in.Read(body.data(), header_bytes, "the header"));
  uint32_t section_count = 0;
  ASSIGN_OR_RETURN(StateHeader header,
                   ParseHeaderBody(body, kPreambleBytes, in.remaining() / kSectionFixedBytes,
                                   &section_count, path));

  std::vector<LoadedSection> sections;
  sections.reserve(section_count);
  absl::flat_hash_set<std::string> names;
  for (uint32_t i = 0; i < section_count; ++i) {
    ASSIGN_OR_RETURN(LoadedSection s, ReadSection(in, i, path));
    if (!names.insert(s.name).second) {
      return Corrupt(path, absl::StrCat("section \"", s.name, "\" appears twice"));
    }
    sections.push_back(std::move(s));
  }
  if (in.remaining() != 0) {
    return Corrupt(path, absl::StrCat(in.remaining(), " unexpected bytes after the last section",
                                      " at byte ", in.offset()));
  }

  const uint32_t computed = in.crc();
  in.set_limit(size);
  ASSIGN_OR_RETURN(uint64_t stored, in.ReadLe(4, "the checksum", /*checksummed=*/false));
  if (stored != computed) {
    return absl::DataLossError(absl::StrFormat(
        "state file %s: checksum mismatch: file is corrupt (stored CRC-32C %08x, computed %08x)",
        path, stored, computed));
  }
  return LoadedState(path, std::move(header), std::move(sections));
}

// ---- CheckCompatible -------------------------------------------------------------------------

absl::Status CheckCompatible(const StateHeader& file, const StateHeader& expected,
                             const std::string& path) {
  std::vector<std::string> diffs;
  if (file.kind != expected.kind) {
    diffs.push_back(absl::StrCat("by optimizer kind \"", file.kind, "\", this run uses \"",
                                 expected.kind, "\""));
  }
  if (file.world_size != expected.world_size) {
    diffs.push_back(
        absl::StrCat("with world size ", file.world_size, ", this run has ", expected.world_size));
  }
  if (file.rank != expected.rank) {
    diffs.push_back(absl::StrCat("by rank ", file.rank, ", this is rank ", expected.rank,
                                 " (each rank must load its own file)"));
  }
  if (file.shard_group_size != expected.shard_group_size) {
    diffs.push_back(absl::StrCat("with shard group size ", file.shard_group_size, ", this run has ",
                                 expected.shard_group_size));
  }
  if (file.replica_group_size != expected.replica_group_size) {
    diffs.push_back(absl::StrCat("with replica group size ", file.replica_group_size,
                                 ", this run has ", expected.replica_group_size));
  }
  if (file.plan_fingerprint != expected.plan_fingerprint) {
    diffs.push_back(absl::StrFormat(
        "for a different bucket plan or parameters (plan fingerprint %016x, this run's is "
        "%016x)",
        file.plan_fingerprint, expected.plan_fingerprint));
  }
  if (diffs.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("state file ", path, " was written ", absl::StrJoin(diffs, "; and ")));
}

}  // namespace braid::optim
