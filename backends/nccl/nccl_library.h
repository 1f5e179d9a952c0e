// NcclLibrary: libnccl opened with dlopen at run time and resolved symbol by symbol.
//
// Nothing in Braid links -lnccl, so libbraid.so and every binary load on machines without
// NCCL or a GPU; the library is opened only when something first needs it (RealNcclApi's
// first call, see nccl_api.h). The handle is owned by the NcclLibrary object (dlclose in the
// destructor; NCCL's code stays mapped, RTLD_NODELETE, for the threads NCCL leaves running);
// the resolved functions are immutable after Open.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<NcclLibrary> lib, NcclLibrary::Open("libnccl.so.2"));
//   int version = lib->version();                 // 22809 for NCCL 2.28.9
//   lib->fn().GetUniqueId(&id);
//
// A missing library or symbol is FailedPrecondition naming the path, the symbol and dlerror().
// `path` is what dlopen gets: a bare name ("libnccl.so.2", the default) is searched for the
// usual way (LD_LIBRARY_PATH, the ld.so cache); BRAID_NCCL_LIBRARY (comm/options.h) overrides it.
#ifndef BRAID_BACKENDS_NCCL_NCCL_LIBRARY_H_
#define BRAID_BACKENDS_NCCL_NCCL_LIBRARY_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace braid::nccl {

inline constexpr char kDefaultNcclLibrary[] = "libnccl.so.2";

// The NCCL 2.28 functions Braid calls: each is the function of the same name with an `nccl`
// prefix, typed from nccl.h's own declaration (decltype), so a signature cannot drift.
struct NcclFunctions {
  decltype(&::ncclGetVersion) GetVersion = nullptr;
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRankConfig) CommInitRankConfig = nullptr;
  decltype(&::ncclCommInitAll) CommInitAll = nullptr;
  decltype(&::ncclCommSplit) CommSplit = nullptr;
  decltype(&::ncclCommFinalize) CommFinalize = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&::ncclCommCount) CommCount = nullptr;
  decltype(&::ncclCommUserRank) CommUserRank = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclGetLastError) GetLastError = nullptr;
  decltype(&::ncclGroupStart) GroupStart = nullptr;
  decltype(&::ncclGroupEnd) GroupEnd = nullptr;
  decltype(&::ncclAllReduce) AllReduce = nullptr;
  decltype(&::ncclReduceScatter) ReduceScatter = nullptr;
  decltype(&::ncclAllGather) AllGather = nullptr;
  decltype(&::ncclBroadcast) Broadcast = nullptr;
  decltype(&::ncclRedOpCreatePreMulSum) RedOpCreatePreMulSum = nullptr;
  decltype(&::ncclRedOpDestroy) RedOpDestroy = nullptr;
};

// The oldest NCCL Open accepts (ncclGetVersion's code of 2.28.0): Braid is built against 2.28's
// headers.
inline constexpr int kMinNcclVersion = 22800;

class NcclLibrary {
 public:
  // dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE), then every symbol of NcclFunctions and
  // ncclGetVersion. FailedPrecondition naming the path (and symbol) with dlerror()'s text.
  static absl::StatusOr<std::unique_ptr<NcclLibrary>> Open(const std::string& path);
  ~NcclLibrary();  // dlclose
  NcclLibrary(const NcclLibrary&) = delete;
  NcclLibrary& operator=(const NcclLibrary&) = delete;

  const NcclFunctions& fn() const { return fn_; }
  const std::string& path() const { return path_; }
  int version() const { return version_; }  // ncclGetVersion: major*10000 + minor*100 + patch

  // The names of every symbol Open resolves ("ncclGetVersion", ...), in NcclFunctions order.
  static std::vector<std::string> SymbolNames();

 private:
  NcclLibrary(std::string path, void* handle) : path_(std::move(path)), handle_(handle) {}

  const std::string path_;
  void* const handle_;
  NcclFunctions fn_;
  int version_ = 0;
};

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_NCCL_LIBRARY_H_
