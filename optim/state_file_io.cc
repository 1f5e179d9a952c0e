// The state file's byte streams; see state_file_io.h.
#include "optim/state_file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "comm/check.h"
#include "comm/status_macros.h"
#include "optim/crc32c.h"

namespace braid::optim::internal {
namespace {

absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min(n, kChunkBytes));
    if (w < 0) {
      if (errno == EINTR) continue;
      return SysError(errno, path, "write failed");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

// ---- errors --------------------------------------------------------------------------------

absl::Status SysError(int err, const std::string& path, absl::string_view what) {
  return absl::ErrnoToStatus(err, absl::StrCat("state file ", path, ": ", what));
}
absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("state file ", path, " is corrupt: ", what));
}
absl::Status Truncated(const std::string& path, uint64_t at, absl::string_view where) {
  return absl::DataLossError(
      absl::StrCat("state file ", path, " is truncated at byte ", at, " (", where, ")"));
}
absl::Status BadInput(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("cannot write state file ", path, ": ", what));
}

uint64_t GetLe(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// ---- file handles --------------------------------------------------------------------------

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status ScopedFd::Close(const std::string& path) {
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return SysError(errno, path, "close failed");
  return absl::OkStatus();
}

TempFileGuard::~TempFileGuard() {
  if (!kept_) ::unlink(path_.c_str());
}

absl::StatusOr<std::pair<std::string, int>> CreateTemp(const std::string& path) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    const auto nanos = std::chrono::steady_clock::now().time_since_epoch().count();
    std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".",
                                   static_cast<long>(::syscall(SYS_gettid)), ".", nanos);
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) return std::make_pair(std::move(tmp), fd);
    if (errno != EEXIST) {
      return SysError(errno, path, absl::StrCat("cannot create temporary file ", tmp));
    }
  }
  return absl::AlreadyExistsError(
      absl::StrCat("state file ", path, ": could not find an unused temporary file name"));
}

std::string DirectoryOf(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status SyncDirectory(const std::string& dir, const std::string& path) {
  ScopedFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return SysError(errno, path, absl::StrCat("cannot open directory ", dir));
  // Some filesystems cannot fsync a directory (EINVAL); the rename is as durable as they allow.
  if (::fsync(fd.get()) != 0 && errno != EINVAL) {
    return SysError(errno, path, absl::StrCat("fsync of directory ", dir, " failed"));
  }
  return fd.Close(path);
}

// ---- StreamWriter --------------------------------------------------------------------------

StreamWriter::StreamWriter(int fd, const std::string& path) : fd_(fd), path_(path) {
  staging_.reserve(kStagingBytes);
}

absl::Status StreamWriter::Put(const void* data, size_t n) {
  if (n <= kStagingBytes / 2) {
    crc_ = Crc32c(crc_, data, n);
    return PutUnchecksummed(data, n);
  }
  // A payload: checksum each chunk just before the kernel copies it, while it is in cache.
  RETURN_IF_ERROR(Flush());
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < n;) {
    const size_t len = std::min(n - done, kChunkBytes);
    crc_ = Crc32c(crc_, p + done, len);
    RETURN_IF_ERROR(WriteAll(fd_, p + done, len, path_));
    done += len;
    written_ += len;
  }
  return absl::OkStatus();
}

absl::Status StreamWriter::PutUnchecksummed(const void* data, size_t n) {
  BRAID_CHECK(n <= kStagingBytes / 2);
  if (staging_.size() + n > kStagingBytes) RETURN_IF_ERROR(Flush());
  staging_.append(static_cast<const char*>(data), n);
  written_ += n;
  return absl::OkStatus();
}

absl::Status StreamWriter::Flush() {
  RETURN_IF_ERROR(WriteAll(fd_, staging_.data(), staging_.size(), path_));
  staging_.clear();
  return absl::OkStatus();
}

// ---- StreamReader --------------------------------------------------------------------------

absl::Status StreamReader::Read(void* dst, uint64_t n, absl::string_view what, bool checksummed) {
  if (n > remaining()) {
    if (limit_ == size_) {
      return Truncated(path_, size_,
                       absl::StrCat("reading ", what, ", ", n, " bytes at byte ", offset_));
    }
    return Corrupt(path_,
                   absl::StrCat(what, " at byte ", offset_, " claims ", n, " bytes, but only ",
                                remaining(), " remain before the checksum"));
  }
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(n, kChunkBytes));
    ssize_t r = ::read(fd_, p, want);
    if (r < 0) {
      if (errno == EINTR) continue;
      return SysError(errno, path_, absl::StrCat("read failed at byte ", offset_));
    }
    if (r == 0) {  // the file shrank while we read it
      return Truncated(path_, offset_, absl::StrCat("file ended while reading ", what));
    }
    if (checksummed) crc_ = Crc32c(crc_, p, static_cast<size_t>(r));
    p += r;
    n -= static_cast<uint64_t>(r);
    offset_ += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> StreamReader::ReadLe(int bytes, absl::string_view what, bool checksummed) {
  unsigned char buf[8];
  RETURN_IF_ERROR(Read(buf, static_cast<uint64_t>(bytes), what, checksummed));
  return GetLe(buf, bytes);
}

}  // namespace braid::optim::internal
