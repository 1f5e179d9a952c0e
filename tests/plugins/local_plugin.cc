#include "tests/plugins/local_plugin.h"

#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "backends/local/local_backend.h"
#include "backends/plugin/abi_convert.h"
#include "comm/backend.h"

namespace braid::test_plugin {
namespace {

using plugin::FromAbiDType;
using plugin::FromAbiReduceKind;
using plugin::ReportAbiError;
using plugin::ToAbiStatus;

// The plugin context: the host's logger and the wrapped local world.
struct Context {
  braid_backend_log_fn_v1 log = nullptr;
  void* log_arg = nullptr;
  std::unique_ptr<local::LocalBackend> backend;
};

// A comm: one rank's handle of one local group.
struct Comm {
  std::unique_ptr<Group> group;
};

Context& AsContext(void* ctx) { return *static_cast<Context*>(ctx); }
Group& AsGroup(void* comm) { return *static_cast<Comm*>(comm)->group; }

// Runs an entry body; no exception crosses the C boundary.
template <typename Body>
int Guarded(braid_backend_error_v1* error, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return ReportAbiError(absl::InternalError(absl::StrCat("exception: ", e.what())), error);
  } catch (...) {
    return ReportAbiError(absl::InternalError("unknown exception"), error);
  }
}

// Hands a launched Work's completion to the host callback (possibly right now, on this
// thread, if it is already complete).
int Forward(absl::StatusOr<WorkPtr> work, braid_backend_done_fn_v1 done, void* done_arg,
            braid_backend_error_v1* error) {
  if (!work.ok()) return ReportAbiError(work.status(), error);
  (*work)->OnComplete([done, done_arg](const absl::Status& s) {
    const std::string message(s.message());
    done(done_arg, ToAbiStatus(s), message.c_str());
  });
  return BRAID_BACKEND_OK;
}

}  // namespace

void HostLog(void* ctx, int level, const char* message) {
  const Context& c = AsContext(ctx);
  if (c.log != nullptr) c.log(c.log_arg, level, message);
}

void FailWorldRankAt(void* ctx, int world_rank, uint64_t seq) {
  AsContext(ctx).backend->faults().FailRank(world_rank, seq, "world",
                                            "injected by the test plugin");
}

int Init(braid_backend_log_fn_v1 log, void* log_arg, int world_size, int64_t timeout_ms, void** ctx,
         braid_backend_error_v1* error) {
  return Guarded(error, [&]() -> int {
    Options o;
    o.backend = "local";
    o.local_ranks = world_size;
    o.timeout = absl::Milliseconds(timeout_ms);
    absl::StatusOr<std::unique_ptr<Backend>> b = local::LocalBackend::Create(o);
    if (!b.ok()) return ReportAbiError(b.status(), error);
    auto c = std::make_unique<Context>();
    c->log = log;
    c->log_arg = log_arg;
    c->backend.reset(static_cast<local::LocalBackend*>(b->release()));
    const std::string line = absl::StrCat("wrapping the local backend: world of ", world_size,
                                          " ranks, timeout ", timeout_ms, " ms");
    HostLog(c.get(), BRAID_BACKEND_LOG_INFO, line.c_str());
    *ctx = c.release();
    return BRAID_BACKEND_OK;
  });
}

int Finalize(void* ctx, braid_backend_error_v1* error) {
  return Guarded(error, [&]() -> int {
    std::unique_ptr<Context> c(static_cast<Context*>(ctx));
    HostLog(c.get(), BRAID_BACKEND_LOG_DEBUG, "finalized");
    return BRAID_BACKEND_OK;
  });
}

int WorldSize(void* ctx, int* world_size, braid_backend_error_v1* error) {
  *world_size = AsContext(ctx).backend->world_size();
  return BRAID_BACKEND_OK;
}

int LocalRanks(void* ctx, int* ranks, int capacity, int* count, braid_backend_error_v1* error) {
  return Guarded(error, [&]() -> int {
    const std::vector<int> local = AsContext(ctx).backend->local_ranks();
    *count = static_cast<int>(local.size());
    for (int i = 0; i < *count && i < capacity; ++i) ranks[i] = local[i];
    return BRAID_BACKEND_OK;
  });
}

int CommCreateWorld(void* ctx, int rank, void** comm, braid_backend_error_v1* error) {
  return Guarded(error, [&]() -> int {
    absl::StatusOr<std::unique_ptr<Group>> g = AsContext(ctx).backend->WorldGroup(rank);
    if (!g.ok()) return ReportAbiError(g.status(), error);
    *comm = new Comm{std::move(*g)};
    return BRAID_BACKEND_OK;
  });
}

int CommInfo(void* comm, int* rank, int* size, braid_backend_error_v1* error) {
  *rank = AsGroup(comm).rank();
  *size = AsGroup(comm).size();
  return BRAID_BACKEND_OK;
}

int CommSplit(void* comm, int color, int key, void** child, braid_backend_error_v1* error) {
  return Guarded(error, [&]() -> int {
    absl::StatusOr<std::unique_ptr<Group>> g = AsGroup(comm).Split(color, key);
    if (!g.ok()) return ReportAbiError(g.status(), error);
    *child = *g == nullptr ? nullptr : new Comm{std::move(*g)};
    return BRAID_BACKEND_OK;
  });
}

int CommDestroy(void* comm, braid_backend_error_v1* error) {
  return Guarded(error, [&]() -> int {
    // ~LocalGroup drains the rank's queue, completing (and so calling back) every Work.
    delete static_cast<Comm*>(comm);
    return BRAID_BACKEND_OK;
  });
}

uint64_t Capabilities(void* ctx) {
  return plugin::ToAbiCapabilities(AsContext(ctx).backend->capabilities());
}

int AllReduce(void* comm, const void* send, void* recv, size_t count, int dtype, int op,
              double scalar, braid_backend_done_fn_v1 done, void* done_arg,
              braid_backend_error_v1* error) {
  return Guarded(error, [&]() -> int {
    absl::StatusOr<DType> t = FromAbiDType(dtype);
    if (!t.ok()) return ReportAbiError(t.status(), error);
    absl::StatusOr<ReduceKind> k = FromAbiReduceKind(op);
    if (!k.ok()) return ReportAbiError(k.status(), error);
    return Forward(AsGroup(comm).AllReduce(send, recv, count, *t, ReduceOp{*k, scalar}), done,
                   done_arg, error);
  });
}

int ReduceScatter(void* comm, const void* send, void* recv, size_t recvcount, int dtype, int op,
                  double scalar, braid_backend_done_fn_v1 done, void* done_arg,
                  braid_backend_error_v1* error) {
  return Guarded(error, [&]() -> int {
    absl::StatusOr<DType> t = FromAbiDType(dtype);
    if (!t.ok()) return ReportAbiError(t.status(), error);
    absl::StatusOr<ReduceKind> k = FromAbiReduceKind(op);
    if (!k.ok()) return ReportAbiError(k.status(), error);
    return Forward(AsGroup(comm).ReduceScatter(send, recv, recvcount, *t, ReduceOp{*k, scalar}),
                   done, done_arg, error);
  });
}

int AllGather(void* comm, const void* send, void* recv, size_t sendcount, int dtype,
              braid_backend_done_fn_v1 done, void* done_arg, braid_backend_error_v1* error) {
  return Guarded(error, [&]() -> int {
    absl::StatusOr<DType> t = FromAbiDType(dtype);
    if (!t.ok()) return ReportAbiError(t.status(), error);
    return Forward(AsGroup(comm).AllGather(send, recv, sendcount, *t), done, done_arg, error);
  });
}

int Broadcast(void* comm, const void* send, void* recv, size_t count, int dtype, int root,
              braid_backend_done_fn_v1 done, void* done_arg, braid_backend_error_v1* error) {
  return Guarded(error, [&]() -> int {
    absl::StatusOr<DType> t = FromAbiDType(dtype);
    if (!t.ok()) return ReportAbiError(t.status(), error);
    Group& g = AsGroup(comm);
    // Braid's broadcast is in place: the root first moves its data into `recv`.
    if (g.rank() == root && send != recv && count > 0) {
      std::memmove(recv, send, count * DTypeSize(*t));
    }
    return Forward(g.Broadcast(recv, count, *t, root), done, done_arg, error);
  });
}

int Barrier(void* comm, braid_backend_done_fn_v1 done, void* done_arg,
            braid_backend_error_v1* error) {
  return Guarded(error,
                 [&]() -> int { return Forward(AsGroup(comm).Barrier(), done, done_arg, error); });
}

}  // namespace braid::test_plugin
