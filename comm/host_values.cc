#include "comm/host_values.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "comm/buffer_ops.h"
#include "comm/status_macros.h"

namespace braid {
namespace {

// Bytes of one buffer holding the result (at its start) and, out of place, the input after it.
size_t in_place_bytes(const void* in, size_t in_bytes, const void* out, size_t out_bytes) {
  return std::max<size_t>(1, in == out ? std::max(in_bytes, out_bytes) : out_bytes + in_bytes);
}

// Runs `launch(in, out)` on the caller's memory (host groups) or through a staging buffer of
// the group's (device groups): `in_bytes` of `in_host` copied to the buffer's end, the result
// (`out_bytes` at its start) copied back into `out_host`. In place (in_host == out_host, e.g.
// all-reduce, broadcast) the input and the result share the buffer's start.
absl::Status Staged(
    Group& g, const void* in_host, size_t in_bytes, void* out_host, size_t out_bytes,
    const char* label, absl::Time deadline,
    const std::function<absl::StatusOr<WorkPtr>(const void* in, void* out)>& launch) {
  BufferOps& ops = g.buffer_ops();
  if (ops.synchronous()) {
    // Through heap copies, not the caller's memory: a wait that fails (a peer that never
    // arrives) returns while the operation may still run, and the work keeps the copies until
    // it completes (forever where a backend never completes a failed call).
    auto buf =
        std::make_shared<std::vector<char>>(in_place_bytes(in_host, in_bytes, out_host, out_bytes));
    char* out = buf->data();
    char* in = in_host == out_host ? out : out + out_bytes;
    if (in_bytes > 0) std::memcpy(in, in_host, in_bytes);
    ASSIGN_OR_RETURN(WorkPtr w, launch(in, out));
    const absl::Status st = w->WaitUntil(deadline);
    if (!st.ok()) {
      w->OnComplete([buf](const absl::Status&) {});
      return st;
    }
    if (out_bytes > 0) std::memcpy(out_host, out, out_bytes);
    return st;
  }
  const bool in_place = in_host == out_host;
  ASSIGN_OR_RETURN(OwnedBuffer staged,
                   ops.Allocate(in_place ? out_bytes : out_bytes + in_bytes, label));
  char* out = staged.get();
  char* in = in_place ? out : out + out_bytes;
  absl::Status st = ops.Copy(in, in_host, in_bytes);
  if (st.ok()) {
    absl::StatusOr<WorkPtr> w = launch(in, out);
    st = w.ok() ? (*w)->WaitUntil(deadline) : w.status();
  }
  if (st.ok()) st = ops.Copy(out_host, out, out_bytes);
  if (st.ok()) st = ops.Synchronize(deadline);
  if (!st.ok()) (void)staged.release();  // the device may still write into it
  return st;
}

CollectiveOptions Labeled(const char* label) {
  CollectiveOptions opts;
  opts.label = label;
  return opts;
}

}  // namespace

absl::Status AllReduceHostValues(Group& g, void* values, size_t count, DType dtype, ReduceOp op,
                                 const char* label, absl::Time deadline) {
  const size_t bytes = count * DTypeSize(dtype);
  return Staged(g, values, bytes, values, bytes, label, deadline, [&](const void* in, void* out) {
    return g.AllReduce(in, out, count, dtype, op, Labeled(label));
  });
}

absl::Status AllGatherHostValues(Group& g, const void* mine, void* all, size_t count, DType dtype,
                                 const char* label, absl::Time deadline) {
  const size_t bytes = count * DTypeSize(dtype);
  return Staged(g, mine, bytes, all, bytes * static_cast<size_t>(g.size()), label, deadline,
                [&](const void* in, void* out) {
                  return g.AllGather(in, out, count, dtype, Labeled(label));
                });
}

absl::Status BroadcastHostValues(Group& g, void* values, size_t count, DType dtype, int root,
                                 const char* label, absl::Time deadline) {
  const size_t bytes = count * DTypeSize(dtype);
  return Staged(g, values, bytes, values, bytes, label, deadline, [&](const void*, void* out) {
    return g.Broadcast(out, count, dtype, root, Labeled(label));
  });
}

}  // namespace braid
