// State files: bit-exact round trips, every class of damaged file as a clean error naming the
// path (never a crash, a huge allocation or a silent success), run-compatibility checks, and
// the atomic-replace guarantee.
#include "optim/state_file.h"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace braid::optim {
namespace {

// ---- helpers ---------------------------------------------------------------------------------

std::string TestPath(absl::string_view name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir = ::testing::TempDir();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return absl::StrCat(dir, "/", info->name(), "_", name);
}

std::string ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

std::string DirOf(const std::string& path) { return path.substr(0, path.rfind('/')); }
std::string BaseOf(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// Names in `path`'s directory that start with "<basename>.tmp": leftover temporaries.
std::vector<std::string> TempFilesFor(const std::string& path) {
  std::vector<std::string> found;
  DIR* dir = ::opendir(DirOf(path).c_str());
  if (dir == nullptr) return found;
  const std::string prefix = BaseOf(path) + ".tmp";
  while (dirent* e = ::readdir(dir)) {
    if (absl::StartsWith(e->d_name, prefix)) found.push_back(e->d_name);
  }
  ::closedir(dir);
  return found;
}

void PutLe(std::string* bytes, size_t at, uint64_t v, int width) {
  ASSERT_LE(at + static_cast<size_t>(width), bytes->size());
  for (int i = 0; i < width; ++i) (*bytes)[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// Recomputes the trailing checksum, so a test can plant a structural fault that only the
// structural checks (not the checksum) can catch.
void FixChecksum(std::string* bytes) {
  const uint32_t crc = internal::Crc32c(0, bytes->data() + 8, bytes->size() - 12);
  PutLe(bytes, bytes->size() - 4, crc, 4);
}

// Asserts `s` failed with `code` and a message naming the path and every one of `parts`.
void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& path,
                 std::vector<std::string> parts = {}) {
  ASSERT_FALSE(s.ok()) << "expected an error naming " << path;
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), path)) << s;
  for (const std::string& p : parts) EXPECT_TRUE(absl::StrContains(s.message(), p)) << s;
}

uint32_t F32Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float BitsF32(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint64_t F64Bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}
double BitsF64(uint64_t b) {
  double d;
  std::memcpy(&d, &b, 8);
  return d;
}

StateHeader SampleHeader() {
  StateHeader h;
  h.kind = "adamw";
  h.plan_fingerprint = 0x0123456789abcdefull;
  h.world_size = 4;
  h.rank = 1;
  h.shard_group_size = 2;
  h.replica_group_size = 2;
  h.step = 1200;
  h.scalars = {{"lr", 3e-4}, {"beta1", 0.9}};
  return h;
}

// The offsets of SampleHeader's file (kind "adamw", scalars "lr" and "beta1"), from the
// layout documented in state_file.h.
constexpr size_t kHeaderLenAt = 12;
constexpr size_t kFileLenAt = 16;
constexpr size_t kBodyAt = 24;
constexpr size_t kWorldAt = kBodyAt + 4 + 5 + 8;
constexpr size_t kRankAt = kWorldAt + 4;
constexpr size_t kScalarCountAt = kWorldAt + 16 + 8;
constexpr size_t kFirstScalarNameLenAt = kScalarCountAt + 4;
constexpr size_t kSectionCountAt = kFirstScalarNameLenAt + (4 + 2 + 8) + (4 + 5 + 8);
constexpr size_t kFirstSectionAt = kSectionCountAt + 4;

// A small file: one f32 section "w" of 6 elements and one i64 section "n" of 2.
struct SmallFile {
  std::vector<float> w = {1.0f, -0.0f, 2.5f, -3.0f, 1e-40f, 7.0f};
  std::vector<int64_t> n = {-1, 42};
  std::vector<StateSection> Sections() const {
    return {{"w", static_cast<int32_t>(DType::kF32), w.size(), w.data(), w.size() * 4},
            {"n", static_cast<int32_t>(DType::kI64), n.size(), n.data(), n.size() * 8}};
  }
};
// Offsets inside SmallFile's first section record ("w").
constexpr size_t kW_NameLenAt = kFirstSectionAt;
constexpr size_t kW_DTypeAt = kW_NameLenAt + 4 + 1;
constexpr size_t kW_CountAt = kW_DTypeAt + 4;
constexpr size_t kW_BytesAt = kW_CountAt + 8;
constexpr size_t kW_PayloadAt = kW_BytesAt + 8;
constexpr size_t kN_NameAt = kW_PayloadAt + 24 + 4;  // name of the second section

std::string WriteSmall(const std::string& path) {
  SmallFile f;
  absl::Status s = WriteStateFile(path, SampleHeader(), f.Sections());
  EXPECT_TRUE(s.ok()) << s;
  return ReadBytes(path);
}

// ---- checksum --------------------------------------------------------------------------------

TEST(Crc32cTest, KnownVectorsAndIncremental) {
  EXPECT_EQ(internal::Crc32c(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(internal::Crc32c(0, "", 0), 0u);
  std::string zeros(32, '\0');
  EXPECT_EQ(internal::Crc32c(0, zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
  std::string ones(32, '\xff');
  EXPECT_EQ(internal::Crc32c(0, ones.data(), ones.size()), 0x62A8AB43u);
  // Splitting the input anywhere (odd offsets, the 8-byte fast path) gives the same CRC.
  std::string data;
  for (int i = 0; i < 1000; ++i) data.push_back(static_cast<char>(i * 131 + 7));
  const uint32_t whole = internal::Crc32c(0, data.data(), data.size());
  for (size_t cut : {0, 1, 3, 7, 8, 9, 500, 999, 1000}) {
    uint32_t c = internal::Crc32c(0, data.data(), cut);
    c = internal::Crc32c(c, data.data() + cut, data.size() - cut);
    EXPECT_EQ(c, whole) << cut;
  }
}

// ---- round trips -----------------------------------------------------------------------------

TEST(StateFileTest, RoundTripIsBitExact) {
  const std::string path = TestPath("rank1.braid");
  StateHeader h = SampleHeader();
  h.step = std::numeric_limits<int64_t>::max();
  h.plan_fingerprint = ~uint64_t{0};
  h.scalars = {{"nan_payload", BitsF64(0x7ff8000000abcdefull)},
               {"snan", BitsF64(0x7ff0000000000001ull)},
               {"neg_nan", BitsF64(0xfff8000000000123ull)},
               {"neg_zero", -0.0},
               {"inf", std::numeric_limits<double>::infinity()},
               {"denormal", std::numeric_limits<double>::denorm_min()},
               {"max", std::numeric_limits<double>::max()}};
  for (int i = 0; i < 200; ++i) h.scalars.emplace_back(absl::StrCat("s", i), i * 0.1);

  std::vector<uint32_t> f32_bits = {F32Bits(-0.0f), 0x7fc01234u, 0x7f800001u,    0xffc00000u,
                                    F32Bits(1.0f),  0x00000001u, F32Bits(-1e30f)};
  std::vector<double> f64 = {-0.0, BitsF64(0x7ff4000000000042ull), 1.0 / 3.0};
  std::vector<uint16_t> bf16 = {0x3f80, 0x8000, 0x7fc1};
  std::vector<int64_t> i64 = {std::numeric_limits<int64_t>::min(), -1, 0};
  std::vector<uint8_t> u8 = {0, 255, 7};
  // Larger than the 4 MiB I/O chunk, odd-sized: crosses several chunk boundaries both ways.
  std::vector<float> big((size_t{9} << 20) / 4 + 13);
  for (size_t i = 0; i < big.size(); ++i) big[i] = BitsF32(static_cast<uint32_t>(i * 2654435761u));

  std::vector<StateSection> sections = {
      {"bucket0/master", static_cast<int32_t>(DType::kF32), f32_bits.size(), f32_bits.data(),
       f32_bits.size() * 4},
      {"bucket0/empty", static_cast<int32_t>(DType::kF32), 0, nullptr, 0},
      {"bucket1/f64", static_cast<int32_t>(DType::kF64), f64.size(), f64.data(), f64.size() * 8},
      {"bucket1/bf16", static_cast<int32_t>(DType::kBF16), bf16.size(), bf16.data(),
       bf16.size() * 2},
      {"i64", static_cast<int32_t>(DType::kI64), i64.size(), i64.data(), i64.size() * 8},
      {"u8", static_cast<int32_t>(DType::kU8), u8.size(), u8.data(), u8.size()},
      {"bucket2/exp_avg", static_cast<int32_t>(DType::kF32), big.size(), big.data(),
       big.size() * 4},
  };
  ASSERT_TRUE(WriteStateFile(path, h, sections).ok());
  EXPECT_TRUE(TempFilesFor(path).empty());

  absl::StatusOr<LoadedState> loaded = ReadStateFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->path(), path);
  const StateHeader& got = loaded->header();
  EXPECT_EQ(got.kind, h.kind);
  EXPECT_EQ(got.plan_fingerprint, h.plan_fingerprint);
  EXPECT_EQ(got.world_size, h.world_size);
  EXPECT_EQ(got.rank, h.rank);
  EXPECT_EQ(got.shard_group_size, h.shard_group_size);
  EXPECT_EQ(got.replica_group_size, h.replica_group_size);
  EXPECT_EQ(got.step, h.step);
  ASSERT_EQ(got.scalars.size(), h.scalars.size());
  for (size_t i = 0; i < h.scalars.size(); ++i) {
    EXPECT_EQ(got.scalars[i].first, h.scalars[i].first);
    EXPECT_EQ(F64Bits(got.scalars[i].second), F64Bits(h.scalars[i].second)) << i;
  }
  absl::StatusOr<double> nz = loaded->Scalar("neg_zero");
  ASSERT_TRUE(nz.ok());
  EXPECT_EQ(F64Bits(*nz), F64Bits(-0.0));

  ASSERT_EQ(loaded->sections().size(), sections.size());
  for (size_t i = 0; i < sections.size(); ++i) {
    const StateSection& want = sections[i];
    const LoadedSection& s = loaded->sections()[i];  // file order is write order
    EXPECT_EQ(s.name, want.name);
    absl::StatusOr<const LoadedSection*> found =
        loaded->Find(want.name, static_cast<DType>(want.dtype), want.count);
    ASSERT_TRUE(found.ok()) << found.status();
    EXPECT_EQ(*found, &s);
    EXPECT_EQ(s.dtype, want.dtype);
    EXPECT_EQ(s.count, want.count);
    ASSERT_EQ(s.bytes, want.bytes);
    if (want.bytes > 0) {
      EXPECT_EQ(std::memcmp(s.data(), want.data, want.bytes), 0) << want.name;
    }
    // Aligned for any element type, so callers may read floats or doubles in place.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % alignof(std::max_align_t), 0u);
  }
}

TEST(StateFileTest, ZeroSectionsAndNoScalars) {
  const std::string path = TestPath("empty.braid");
  StateHeader h = SampleHeader();
  h.scalars.clear();
  ASSERT_TRUE(WriteStateFile(path, h, {}).ok());
  absl::StatusOr<LoadedState> loaded = ReadStateFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->sections().empty());
  EXPECT_TRUE(loaded->header().scalars.empty());
  EXPECT_EQ(loaded->header().step, h.step);
}

TEST(StateFileTest, ManySmallSections) {
  // More section records than fit in one staging buffer of the writer.
  const std::string path = TestPath("many.braid");
  std::vector<std::vector<float>> data(3000);
  std::vector<StateSection> sections;
  for (size_t i = 0; i < data.size(); ++i) {
    data[i].assign(i % 7, static_cast<float>(i));
    sections.push_back({absl::StrCat("bucket", i, "/exp_avg_sq"), static_cast<int32_t>(DType::kF32),
                        data[i].size(), data[i].data(), data[i].size() * 4});
  }
  ASSERT_TRUE(WriteStateFile(path, SampleHeader(), sections).ok());
  absl::StatusOr<LoadedState> loaded = ReadStateFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->sections().size(), data.size());
  for (size_t i = 0; i < data.size(); i += 97) {
    auto s = loaded->Find(absl::StrCat("bucket", i, "/exp_avg_sq"), DType::kF32, i % 7);
    ASSERT_TRUE(s.ok()) << s.status();
    if (i % 7 != 0) {
      EXPECT_EQ(std::memcmp((*s)->data(), data[i].data(), (i % 7) * 4), 0);
    }
  }
}

TEST(StateFileTest, OverwriteReplacesTheWholeFile) {
  const std::string path = TestPath("rank0.braid");
  std::vector<float> a(1000, 1.0f), b(10, 2.0f);
  StateHeader h = SampleHeader();
  ASSERT_TRUE(
      WriteStateFile(path, h, {{"w", static_cast<int32_t>(DType::kF32), a.size(), a.data(), 4000}})
          .ok());
  h.step = 1201;
  ASSERT_TRUE(
      WriteStateFile(path, h, {{"w", static_cast<int32_t>(DType::kF32), b.size(), b.data(), 40}})
          .ok());
  absl::StatusOr<LoadedState> loaded = ReadStateFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->header().step, 1201);
  auto w = loaded->Find("w", DType::kF32, 10);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(std::memcmp((*w)->data(), b.data(), 40), 0);
  EXPECT_TRUE(TempFilesFor(path).empty());
}

// ---- lookups -----------------------------------------------------------------------------------

TEST(StateFileTest, LookupsNameThePathAndTheShape) {
  const std::string path = TestPath("rank1.braid");
  WriteSmall(path);
  absl::StatusOr<LoadedState> loaded = ReadStateFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectError(loaded->Find("bucket9/master").status(), absl::StatusCode::kNotFound, path,
              {"bucket9/master"});
  ExpectError(loaded->Find("w", DType::kF32, 7).status(), absl::StatusCode::kFailedPrecondition,
              path, {"\"w\"", "holds 6 f32", "expects 7 f32"});
  ExpectError(loaded->Find("w", DType::kBF16, 6).status(), absl::StatusCode::kFailedPrecondition,
              path, {"6 f32", "6 bf16"});
  ExpectError(loaded->Scalar("beta2").status(), absl::StatusCode::kNotFound, path, {"beta2"});
  EXPECT_TRUE(loaded->Find("n", DType::kI64, 2).ok());
}

// ---- damaged files -----------------------------------------------------------------------------

TEST(StateFileTest, MissingFileAndDirectory) {
  const std::string path = TestPath("does_not_exist.braid");
  ExpectError(ReadStateFile(path).status(), absl::StatusCode::kNotFound, path);
  const std::string dir = DirOf(path);
  ExpectError(ReadStateFile(dir).status(), absl::StatusCode::kFailedPrecondition, dir,
              {"not a regular file"});
}

TEST(StateFileTest, WrongMagic) {
  const std::string path = TestPath("rank1.braid");
  std::string bytes = WriteSmall(path);
  bytes[3] = 'X';
  WriteBytes(path, bytes);
  ExpectError(ReadStateFile(path).status(), absl::StatusCode::kDataLoss, path,
              {"not a Braid state file"});
  // A short file that is not ours either: "not ours" beats "truncated".
  WriteBytes(path, "{\"a\"");
  ExpectError(ReadStateFile(path).status(), absl::StatusCode::kDataLoss, path,
              {"not a Braid state file"});
}

TEST(StateFileTest, FutureAndUnknownVersions) {
  const std::string path = TestPath("rank1.braid");
  std::string bytes = WriteSmall(path);
  PutLe(&bytes, 8, 7, 4);
  WriteBytes(path, bytes);
  ExpectError(ReadStateFile(path).status(), absl::StatusCode::kFailedPrecondition, path,
              {"format version 7", "reads version 1"});
  PutLe(&bytes, 8, 0, 4);
  WriteBytes(path, bytes);
  ExpectError(ReadStateFile(path).status(), absl::StatusCode::kDataLoss, path,
              {"format version 0", "version 1"});
}

TEST(StateFileTest, EveryTruncationIsReported) {
  const std::string path = TestPath("rank1.braid");
  const std::string bytes = WriteSmall(path);
  // Every length short of the whole file: empty, inside the magic, the preamble, the header,
  // a section record, a payload, and with only the checksum missing.
  for (size_t len = 0; len < bytes.size(); ++len) {
    WriteBytes(path, bytes.substr(0, len));
    absl::Status s = ReadStateFile(path).status();
    ExpectError(s, absl::StatusCode::kDataLoss, path, {absl::StrCat("truncated at byte ", len)});
  }
  // Trailing garbage is not silently ignored either.
  WriteBytes(path, bytes + "x");
  ExpectError(
      ReadStateFile(path).status(), absl::StatusCode::kDataLoss, path,
      {"records a length of ", absl::StrCat(bytes.size(), " bytes but holds ", bytes.size() + 1)});
}

TEST(StateFileTest, EveryBitFlipIsCaught) {
  const std::string path = TestPath("rank1.braid");
  const std::string bytes = WriteSmall(path);
  int checksum_errors = 0;
  for (size_t at = 0; at < bytes.size(); ++at) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = bytes;
      bad[at] = static_cast<char>(bad[at] ^ (1 << bit));
      WriteBytes(path, bad);
      absl::Status s = ReadStateFile(path).status();
      ASSERT_FALSE(s.ok()) << "flip of bit " << bit << " of byte " << at << " went unnoticed";
      EXPECT_TRUE(absl::StrContains(s.message(), path)) << s;
      if (absl::StrContains(s.message(), "checksum mismatch")) ++checksum_errors;
    }
  }
  // Flips in payloads, scalars and the checksum itself are found only by the checksum.
  EXPECT_GT(checksum_errors, 8 * 24);
}

TEST(StateFileTest, FlipsInALargePayloadAreCaught) {
  const std::string path = TestPath("big.braid");
  std::vector<float> big((size_t{5} << 20) / 4 + 3, 0.5f);
  ASSERT_TRUE(WriteStateFile(path, SampleHeader(),
                             {{"big", static_cast<int32_t>(DType::kF32), big.size(), big.data(),
                               big.size() * 4}})
                  .ok());
  const std::string bytes = ReadBytes(path);
  for (size_t at : {size_t{kFirstSectionAt + 40}, size_t{4} << 20, (size_t{4} << 20) + 1,
                    bytes.size() - 5, bytes.size() - 1}) {
    std::string bad = bytes;
    bad[at] = static_cast<char>(bad[at] ^ 0x40);
    WriteBytes(path, bad);
    ExpectError(ReadStateFile(path).status(), absl::StatusCode::kDataLoss, path,
                {"checksum mismatch: file is corrupt"});
  }
}

// Corrupt lengths and counts, with the checksum recomputed so that only the bounds checks
// stand between them and a read past the end or a giant allocation.
TEST(StateFileTest, HugeLengthFieldsAreBoundedByTheFileSize) {
  const std::string path = TestPath("rank1.braid");
  const std::string good = WriteSmall(path);
  struct Case {
    size_t at;
    uint64_t value;
    int width;
    std::string message;
  };
  const std::vector<Case> cases = {
      {kHeaderLenAt, 0xffffffffu, 4, "header length 4294967295"},
      {kBodyAt, 0xfffffff0u, 4, "kind length"},
      {kScalarCountAt, 0xffffffffu, 4, "scalar count 4294967295"},
      {kFirstScalarNameLenAt, 1u << 30, 4, "scalar 0 name length"},
      {kSectionCountAt, 0xffffffffu, 4, "section count 4294967295"},
      {kW_NameLenAt, 0xffffffffu, 4, "section 0 name length"},
      {kW_NameLenAt, 2000, 4, "section 0"},  // under the name limit, over the file
      {kW_BytesAt, uint64_t{1} << 62, 8, "section \"w\" holds"},
      {kW_CountAt, uint64_t{1} << 62, 8, "section \"w\" holds"},
      {kW_DTypeAt, 99, 4, "unknown dtype 99"},
  };
  for (const Case& c : cases) {
    std::string bad = good;
    PutLe(&bad, c.at, c.value, c.width);
    FixChecksum(&bad);
    WriteBytes(path, bad);
    ExpectError(ReadStateFile(path).status(), absl::StatusCode::kDataLoss, path, {c.message});
  }
  // Count and byte length consistent with each other but far beyond the file: refused before
  // anything is allocated.
  std::string bad = good;
  PutLe(&bad, kW_CountAt, uint64_t{1} << 58, 8);
  PutLe(&bad, kW_BytesAt, uint64_t{1} << 60, 8);
  FixChecksum(&bad);
  WriteBytes(path, bad);
  ExpectError(ReadStateFile(path).status(), absl::StatusCode::kDataLoss, path,
              {"claims 1152921504606846976 payload bytes"});
  // A recorded file length that disagrees with the real one reads as truncation.
  bad = good;
  PutLe(&bad, kFileLenAt, ~uint64_t{0}, 8);
  WriteBytes(path, bad);
  ExpectError(ReadStateFile(path).status(), absl::StatusCode::kDataLoss, path,
              {"truncated at byte"});
}

TEST(StateFileTest, StructurallyInvalidContentsAreRejected) {
  const std::string path = TestPath("rank1.braid");
  const std::string good = WriteSmall(path);
  auto expect_corrupt = [&](std::string bad, const std::string& message) {
    FixChecksum(&bad);
    WriteBytes(path, bad);
    ExpectError(ReadStateFile(path).status(), absl::StatusCode::kDataLoss, path, {message});
  };
  std::string bad = good;
  PutLe(&bad, kRankAt, 4, 4);  // rank == world size
  expect_corrupt(bad, "rank 4 is outside [0, 4)");
  bad = good;
  PutLe(&bad, kWorldAt, 0, 4);
  expect_corrupt(bad, "world size 0");
  bad = good;
  bad[kN_NameAt] = 'w';  // the second section renamed to the first's name
  expect_corrupt(bad, "section \"w\" appears twice");
  bad = good;
  PutLe(&bad, kSectionCountAt, 1, 4);  // one section fewer than the file holds
  expect_corrupt(bad, "unexpected bytes after the last section");
  bad = good;
  PutLe(&bad, kSectionCountAt, 3, 4);  // one more than the file holds
  expect_corrupt(bad, "section 2");
  bad = good;
  PutLe(&bad, kHeaderLenAt, kSectionCountAt + 4 - kBodyAt + 4, 4);  // header swallows 4 bytes
  expect_corrupt(bad, "header has 4 unexpected bytes");
}

// ---- compatibility -----------------------------------------------------------------------------

TEST(StateFileTest, CheckCompatibleNamesEachDifferingField) {
  const std::string path = "/ckpt/rank1.braid";
  const StateHeader file = SampleHeader();
  EXPECT_TRUE(CheckCompatible(file, file, path).ok());

  // Step and scalars are state, not identity: they may differ.
  StateHeader expected = file;
  expected.step = 0;
  expected.scalars = {{"lr", 1.0}};
  EXPECT_TRUE(CheckCompatible(file, expected, path).ok());

  expected = file;
  expected.world_size = 2;
  absl::Status s = CheckCompatible(file, expected, path);
  ExpectError(s, absl::StatusCode::kFailedPrecondition, path);
  EXPECT_EQ(s.message(),
            "state file /ckpt/rank1.braid was written with world size 4, this run has 2");

  expected = file;
  expected.rank = 3;
  ExpectError(CheckCompatible(file, expected, path), absl::StatusCode::kFailedPrecondition, path,
              {"by rank 1, this is rank 3"});
  expected = file;
  expected.kind = "sgd";
  ExpectError(CheckCompatible(file, expected, path), absl::StatusCode::kFailedPrecondition, path,
              {"kind \"adamw\"", "\"sgd\""});
  expected = file;
  expected.shard_group_size = 4;
  ExpectError(CheckCompatible(file, expected, path), absl::StatusCode::kFailedPrecondition, path,
              {"shard group size 2, this run has 4"});
  expected = file;
  expected.replica_group_size = 1;
  ExpectError(CheckCompatible(file, expected, path), absl::StatusCode::kFailedPrecondition, path,
              {"replica group size 2, this run has 1"});
  expected = file;
  expected.plan_fingerprint = 0x42;
  ExpectError(CheckCompatible(file, expected, path), absl::StatusCode::kFailedPrecondition, path,
              {"different bucket plan or parameters", "0123456789abcdef", "0000000000000042"});

  // Several differences are all reported, not just the first.
  expected = file;
  expected.world_size = 8;
  expected.plan_fingerprint = 1;
  ExpectError(CheckCompatible(file, expected, path), absl::StatusCode::kFailedPrecondition, path,
              {"world size 4, this run has 8", "bucket plan"});
}

// ---- writing -----------------------------------------------------------------------------------

TEST(StateFileTest, WriteIntoMissingDirectoryFailsCleanly) {
  const std::string path = TestPath("no_such_dir/rank0.braid");
  absl::Status s = WriteStateFile(path, SampleHeader(), {});
  ExpectError(s, absl::StatusCode::kNotFound, path);
  ExpectError(ReadStateFile(path).status(), absl::StatusCode::kNotFound, path);
}

TEST(StateFileTest, BadInputIsRejectedBeforeTouchingTheFile) {
  const std::string path = TestPath("rank1.braid");
  const std::string before = WriteSmall(path);
  std::vector<float> w(4, 1.0f);
  const int32_t f32 = static_cast<int32_t>(DType::kF32);
  auto expect_rejected = [&](const StateHeader& h, const std::vector<StateSection>& sections,
                             const std::string& message) {
    ExpectError(WriteStateFile(path, h, sections), absl::StatusCode::kInvalidArgument, path,
                {message});
    EXPECT_EQ(ReadBytes(path), before);
    EXPECT_TRUE(TempFilesFor(path).empty());
  };
  const StateHeader h = SampleHeader();
  expect_rejected(h, {{"w", f32, 4, w.data(), 12}}, "holds 12 bytes, but 4 f32 elements need 16");
  expect_rejected(h, {{"w", f32, 4, nullptr, 16}}, "has no data");
  expect_rejected(h, {{"w", 77, 4, w.data(), 16}}, "unknown dtype 77");
  expect_rejected(h, {{"w", f32, 4, w.data(), 16}, {"w", f32, 0, nullptr, 0}}, "appears twice");
  expect_rejected(h, {{"", f32, 0, nullptr, 0}}, "empty name");
  StateHeader bad = h;
  bad.rank = 4;
  expect_rejected(bad, {}, "rank 4");
  bad = h;
  bad.kind.clear();
  expect_rejected(bad, {}, "kind is empty");
  bad = h;
  bad.scalars.emplace_back("lr", 1.0);
  expect_rejected(bad, {}, "scalar \"lr\" appears twice");
  bad = h;
  bad.step = -1;
  expect_rejected(bad, {}, "step -1");
  ExpectError(WriteStateFile("", h, {}), absl::StatusCode::kInvalidArgument, "");
}

// Runs in a death-test child: caps the file size at 64 KiB, writes `big`, and exits 0 if the
// write failed with an error naming the path.
void WriteUnderFileSizeLimit(const std::string& path, const std::vector<float>& big) {
  ::signal(SIGXFSZ, SIG_IGN);  // make write() return EFBIG instead of killing the process
  rlimit limit{64 << 10, 64 << 10};
  ::setrlimit(RLIMIT_FSIZE, &limit);
  absl::Status s = WriteStateFile(
      path, SampleHeader(),
      {{"big", static_cast<int32_t>(DType::kF32), big.size(), big.data(), big.size() * 4}});
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  std::_Exit(!s.ok() && absl::StrContains(s.message(), path) ? 0 : 1);
}

// A write that fails half-way (here: the file size limit hit mid-payload, in a child process so
// the limit cannot touch this one) leaves the previous file as it was and no temporary behind.
TEST(StateFileDeathTest, FailedWriteLeavesTheOldFileIntact) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  const std::string path = TestPath("rank1.braid");
  const std::string before = WriteSmall(path);
  std::vector<float> big(size_t{1} << 20, 3.0f);  // 4 MiB, well over the limit below
  EXPECT_EXIT(WriteUnderFileSizeLimit(path, big), ::testing::ExitedWithCode(0), "write failed");
  EXPECT_EQ(ReadBytes(path), before);
  EXPECT_TRUE(TempFilesFor(path).empty());
  EXPECT_TRUE(ReadStateFile(path).ok());
}

}  // namespace
}  // namespace braid::optim
