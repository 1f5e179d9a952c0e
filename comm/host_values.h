// Small collectives on *host* values over any group: a few counters, an order, a fingerprint
// that every rank must agree on (the bucket-order rebuild's broadcast, the autotuner's round
// results and config check). Host groups run the collective on the caller's memory; device
// groups (nccl: collectives read device memory only) stage the values through a buffer of the
// group's own memory: copy in, collective, copy out, then Synchronize, so the values are in the
// caller's memory when the call returns.
//
//   std::vector<int64_t> order = ...;              // rank 0's is adopted everywhere
//   RETURN_IF_ERROR(BroadcastHostValues(g, order.data(), order.size(), DType::kI64, 0,
//                                       "bucket order rebuild", deadline));
//   double ms[4] = ...;
//   RETURN_IF_ERROR(AllReduceHostValues(g, ms, 4, DType::kF64, ReduceOp::Max(), "round",
//   deadline));
//
// Contract: collective over `g` (every rank calls it with the same count, dtype, op / root);
// blocking, bounded by `deadline`; the label names the caller's purpose in errors. On failure
// the caller's values are unspecified, and a staging buffer the device may still write into is
// deliberately leaked rather than freed under it. Meant for a few bytes off the hot path: each
// call on a device group allocates, copies twice and waits for the stream.
#ifndef BRAID_COMM_HOST_VALUES_H_
#define BRAID_COMM_HOST_VALUES_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/dtype.h"
#include "comm/group.h"
#include "comm/reduce_op.h"

namespace braid {

// values[0..count) reduced with `op` over `g`, in place, identical on every rank.
absl::Status AllReduceHostValues(Group& g, void* values, size_t count, DType dtype, ReduceOp op,
                                 const char* label, absl::Time deadline);
// Rank r's mine[0..count) into all[r * count ..), for every r (`all` holds g.size() * count).
absl::Status AllGatherHostValues(Group& g, const void* mine, void* all, size_t count, DType dtype,
                                 const char* label, absl::Time deadline);
// values[0..count) of rank `root` into values on every rank.
absl::Status BroadcastHostValues(Group& g, void* values, size_t count, DType dtype, int root,
                                 const char* label, absl::Time deadline);

}  // namespace braid

#endif  // BRAID_COMM_HOST_VALUES_H_
