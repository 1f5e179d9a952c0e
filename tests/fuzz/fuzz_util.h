// Helpers shared by the fuzz targets of tests/fuzz/: a byte reader that never fails (missing
// bytes read as zero) and an in-memory file for code that reads from a path.
//
//   FuzzInput in(data, size);
//   const int op = in.Byte() % 7;
//   MemFile f(in.Rest());               // f.path() is "/proc/self/fd/<n>", a regular file
//   absl::StatusOr<LoadedState> s = ReadStateFile(f.path());
//
// Why: every target decodes its input the same way, so a seed written for one shape keeps its
// meaning, and nothing in a target touches the real file system.
#ifndef BRAID_TESTS_FUZZ_FUZZ_UTIL_H_
#define BRAID_TESTS_FUZZ_FUZZ_UTIL_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace braid::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  size_t left() const { return size_ - pos_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint64_t Le(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{Byte()} << (8 * i);
    return v;
  }
  // A string of up to `max` bytes, its length taken from the next byte.
  std::string Str(size_t max = 64) {
    size_t n = Byte() % (max + 1);
    n = n < left() ? n : left();
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  std::string Rest() {
    std::string s(reinterpret_cast<const char*>(data_ + pos_), left());
    pos_ = size_;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// An anonymous in-memory file (memfd) holding `bytes`, reachable by path while it lives.
class MemFile {
 public:
  explicit MemFile(const std::string& bytes) : fd_(::memfd_create("braid-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) Die("memfd_create");
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t w = ::write(fd_, bytes.data() + done, bytes.size() - done);
      if (w <= 0) Die("write");
      done += static_cast<size_t>(w);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  static void Die(const char* what) {
    std::perror(what);
    std::abort();
  }
  int fd_;
  std::string path_;
};

// A failed expectation inside a target: print and abort, which libFuzzer reports as a crash.
#define FUZZ_CHECK(cond, ...)                                 \
  do {                                                        \
    if (!(cond)) {                                            \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s: ", #cond); \
      std::fprintf(stderr, __VA_ARGS__);                      \
      std::fprintf(stderr, "\n");                             \
      std::abort();                                           \
    }                                                         \
  } while (0)

}  // namespace braid::fuzz

#endif  // BRAID_TESTS_FUZZ_FUZZ_UTIL_H_
