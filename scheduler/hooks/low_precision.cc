#include "scheduler/hooks/low_precision.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/reduce_kernels.h"
#include "comm/status_macros.h"

namespace braid::sched {
namespace {

// torch's divide-first hooks: round to the wire dtype (`native`: the bucket's own), divide by
// the group size there, sum.
class LowPrecisionHook : public CommHook {
 public:
  LowPrecisionHook(const LowPrecisionOptions& o, bool native)
      : opts_(o),
        native_(native),
        name_(native                  ? "allreduce"
              : o.wire == DType::kF16 ? "fp16_compress"
                                      : "bf16_compress") {}

  const std::string& name() const override { return name_; }
  std::vector<NamedOption> Options() const override {
    return {{"wire_dtype", native_ ? -1 : static_cast<int64_t>(opts_.wire)},
            {"replica_only", opts_.replica_only ? 1 : 0},
            {"half_wire", !native_ && opts_.half_wire ? 1 : 0}};
  }
  bool Handles(CommStage stage) const override {
    return !opts_.replica_only || stage == CommStage::kReplicaAllReduce;
  }

  absl::StatusOr<CommResult> Run(const CommBucket& b) override {
    if (!native_ && b.dtype != DType::kF32 && b.dtype != DType::kF64) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the bucket is ", DTypeName(b.dtype), "; a low-precision wire compresses f32/f64 only"));
    }
    const int n = b.group->size();
    const bool scatter = b.stage == CommStage::kReduceScatter;
    const size_t sent = scatter ? b.count * n : b.count;
    // Per (bucket, stage) buffers, kept across steps (sized by the current plan).
    const size_t key = static_cast<size_t>(b.index) * 3 + static_cast<size_t>(b.stage);
    if (buffers_.size() <= key) buffers_.resize(key + 1);
    const DType t = native_ ? b.dtype : opts_.wire;
    const size_t size = DTypeSize(t);
    std::vector<char>& wire = buffers_[key];
    wire.resize((sent + (scatter ? b.count : 0)) * size);
    // As torch's hook: round to the wire dtype, then divide there (the sum cannot overflow).
    CastScale(b.send, b.dtype, wire.data(), t, sent, ScaleSpec{});
    if (n > 1) CastScale(wire.data(), t, wire.data(), t, sent, {false, 1.0, n});
    char* out = scatter ? wire.data() + sent * size : wire.data();
    CollectiveOptions options = b.options;
    options.half_wire = !native_ && opts_.half_wire;  // 2 bytes per element on mpi and gloo too
    ASSIGN_OR_RETURN(
        WorkPtr w,
        scatter ? b.group->ReduceScatter(wire.data(), out, b.count, t, ReduceOp::Sum(), options)
                : b.group->AllReduce(wire.data(), out, b.count, t, ReduceOp::Sum(), options));
    return CommResult{std::move(w), out, t, b.count};
  }

 private:
  const LowPrecisionOptions opts_;
  const bool native_;
  const std::string name_;
  std::vector<std::vector<char>> buffers_;  // per (bucket, stage): wire, then RS output
};

}  // namespace

absl::StatusOr<std::shared_ptr<CommHook>> MakeLowPrecisionHook(const LowPrecisionOptions& opts) {
  if (opts.wire != DType::kBF16 && opts.wire != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat("low-precision comm hook: wire dtype ",
                                                   DTypeName(opts.wire), "; bf16 or f16"));
  }
  return std::make_shared<LowPrecisionHook>(opts, /*native=*/false);
}

std::shared_ptr<CommHook> MakeDivideFirstHook(bool replica_only) {
  return std::make_shared<LowPrecisionHook>(LowPrecisionOptions{DType::kF32, replica_only},
                                            /*native=*/true);
}

}  // namespace braid::sched
