// TempDir: a scratch directory under /tmp for one test, removed with its files at scope exit.
//
//   TempDir dir("braid_flight_hang");            // /tmp/braid_flight_hang.XXXXXX
//   WriteSomething(dir.path() + "/rank0.jsonl");
//
// Contract: the directory holds plain files only (not removed recursively); path() is empty
// when mkdtemp failed (the test's own writes then fail and say so).
#ifndef BRAID_TESTS_TEMP_DIR_H_
#define BRAID_TESTS_TEMP_DIR_H_

#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace braid {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string t = "/tmp/" + prefix + ".XXXXXX";
    std::vector<char> buf(t.begin(), t.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) != nullptr) path_ = buf.data();
  }
  ~TempDir() {
    if (path_.empty()) return;
    if (DIR* d = opendir(path_.c_str())) {
      while (dirent* e = readdir(d)) {
        if (e->d_name[0] != '.') unlink((path_ + "/" + e->d_name).c_str());
      }
      closedir(d);
    }
    rmdir(path_.c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace braid

#endif  // BRAID_TESTS_TEMP_DIR_H_
