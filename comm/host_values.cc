#include "comm/host_values.h"

#include <cstring>
#include <functional>

#include "comm/buffer_ops.h"
#include "comm/status_macros.h"

namespace braid {
namespace {

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
    ASSIGN_OR_RETURN(WorkPtr w, launch(in_host, out_host));
    return w->WaitUntil(deadline);
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
