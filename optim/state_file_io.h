// The byte streams under the state file (optim/state_file.h): how its bytes reach the disk
// atomically and come back bounded and checksummed. Knows nothing of the format's fields; the
// format (state_file.cc) decides what to put and what each read means. Private to
// //optim:state_file.
//
//   ASSIGN_OR_RETURN(auto created, CreateTemp(path));      // "<path>.tmp.<unique>", O_EXCL
//   TempFileGuard guard(created.first);                     // unlinked on every early return
//   ScopedFd fd(created.second);
//   StreamWriter out(fd.get(), path);
//   RETURN_IF_ERROR(out.PutUnchecksummed(magic, 8));        // then Put(...) what is checksummed
//   RETURN_IF_ERROR(out.Flush());
//   fsync, fd.Close(path), rename(tmp, path), guard.Keep(), SyncDirectory(DirectoryOf(path), path)
//
//   StreamReader in(fd.get(), file_size, path);
//   in.set_limit(file_size - 4);                            // reads stop before the trailer
//   ASSIGN_OR_RETURN(uint64_t n, in.ReadLe(8, "the file length"));
//
// Contract: every error names the path ("state file <path>: ..."): a failed system call keeps
// its errno's code; a read past the file's end is DataLoss "truncated"; a read past the limit
// that the format set (a length field claiming more than the file holds) is DataLoss
// "corrupt", so nothing is allocated or read on the strength of a corrupt length. Large
// payloads move in kChunkBytes pieces, each checksummed while in cache, straight between the
// caller's memory and the kernel (never copied here); small fields are staged so a file of
// many small sections is not one write() per field.
#ifndef BRAID_OPTIM_STATE_FILE_IO_H_
#define BRAID_OPTIM_STATE_FILE_IO_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace braid::optim::internal {

// Large payloads move in chunks this size: the checksum of a chunk is computed while it is
// still in cache, and one syscall never has to move a whole multi-GB section.
inline constexpr size_t kChunkBytes = size_t{4} << 20;
// Small fields are gathered into a buffer this size, so a file of many small sections is not
// one write() per field.
inline constexpr size_t kStagingBytes = size_t{64} << 10;

// ---- errors, each naming the path ----------------------------------------------------------

absl::Status SysError(int err, const std::string& path, absl::string_view what);
absl::Status Corrupt(const std::string& path, absl::string_view what);
absl::Status Truncated(const std::string& path, uint64_t at, absl::string_view where);
absl::Status BadInput(const std::string& path, absl::string_view what);

// The `bytes`-byte little-endian unsigned integer at `p`.
uint64_t GetLe(const unsigned char* p, int bytes);

// ---- file handles --------------------------------------------------------------------------

// Owns a file descriptor; closes it on destruction unless Close() already did (and reported).
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd();
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

  int get() const { return fd_; }
  // Closing can report a deferred write error (NFS, quota), so the writer checks it.
  absl::Status Close(const std::string& path);

 private:
  int fd_;
};

// Removes a temporary file on destruction unless Keep() was called: every early return of the
// writer cleans up after itself.
class TempFileGuard {
 public:
  explicit TempFileGuard(std::string path) : path_(std::move(path)) {}
  ~TempFileGuard();
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
  void Keep() { kept_ = true; }

 private:
  std::string path_;
  bool kept_ = false;
};

// Opens a fresh temporary file beside `path`: its name and an fd open for writing. O_EXCL plus
// a name unique to this process, thread and instant means two writers (even of the same path)
// never share a temporary.
absl::StatusOr<std::pair<std::string, int>> CreateTemp(const std::string& path);

// The directory holding `path` ("." for a bare name).
std::string DirectoryOf(const std::string& path);

// Makes a rename into `dir` durable: without this a power loss can forget the new directory
// entry. Errors name `path`.
absl::Status SyncDirectory(const std::string& dir, const std::string& path);

// ---- streams -------------------------------------------------------------------------------

// Appends to the temporary file, checksumming everything after the magic. Small fields are
// staged; payloads go from the caller's memory to the kernel in chunks, never copied here.
// `path` (for messages) must outlive the writer.
class StreamWriter {
 public:
  StreamWriter(int fd, const std::string& path);

  // Checksummed.
  absl::Status Put(const void* data, size_t n);
  absl::Status Put(const std::string& s) { return Put(s.data(), s.size()); }
  // Small fields only (n <= kStagingBytes / 2): the magic, the trailer, and Put's small case.
  absl::Status PutUnchecksummed(const void* data, size_t n);
  absl::Status Flush();

  uint32_t crc() const { return crc_; }
  uint64_t written() const { return written_; }

 private:
  int fd_;
  const std::string& path_;
  std::string staging_;
  uint32_t crc_ = 0;
  uint64_t written_ = 0;
};

// Reads the file front to back, checksumming everything after the magic. Every read is bounded
// by `limit` (the file's real size, less the trailer while reading the body), so a corrupt
// length can neither run past the end nor make us allocate more than the file holds. `path`
// (for messages) must outlive the reader.
class StreamReader {
 public:
  StreamReader(int fd, uint64_t size, const std::string& path)
      : fd_(fd), size_(size), limit_(size), path_(path) {}

  uint64_t offset() const { return offset_; }
  uint64_t remaining() const { return limit_ - offset_; }
  uint32_t crc() const { return crc_; }
  void set_limit(uint64_t limit) { limit_ = limit; }

  // `what` names the field for the error message.
  absl::Status Read(void* dst, uint64_t n, absl::string_view what, bool checksummed = true);
  absl::StatusOr<uint64_t> ReadLe(int bytes, absl::string_view what, bool checksummed = true);

 private:
  int fd_;
  uint64_t size_;
  uint64_t limit_;
  const std::string& path_;
  uint64_t offset_ = 0;
  uint32_t crc_ = 0;
};

}  // namespace braid::optim::internal

#endif  // BRAID_OPTIM_STATE_FILE_IO_H_
