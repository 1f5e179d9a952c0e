#include "scheduler/hooks/int8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "scheduler/hooks/hook_state.h"

namespace braid::sched {
namespace {

// One (bucket, stage)'s state, kept across steps.
struct Int8State {
  std::vector<float> residual;     // error feedback, one per element sent
  std::vector<uint8_t> mine, all;  // this rank's record; every rank's, gathered
  std::vector<float> out;          // the result (count)
  WorkPtr gather;                  // the all-gather in flight
};

class Int8Hook : public CommHook {
 public:
  explicit Int8Hook(const Int8Options& o) : opts_(o), name_("int8") {}

  const std::string& name() const override { return name_; }
  std::vector<NamedOption> Options() const override {
    return {{"block", opts_.block}, {"replica_only", opts_.replica_only ? 1 : 0}};
  }
  bool Handles(CommStage stage) const override {
    return !opts_.replica_only || stage == CommStage::kReplicaAllReduce;
  }

  // Residuals follow elements: start afresh, but install records pending for the layout
  // `plan_fingerprint` (comm_hook.h).
  void OnReplan(uint64_t plan_fingerprint) override {
    states_.clear();
    records_.Replan(plan_fingerprint);
  }

  absl::Status Attach(const CommAttach& at) override {
    group_size_ = at.group->size();
    rank_ = at.group->rank();
    records_.Attach(at.plan_fingerprint);
    return absl::OkStatus();
  }

  // Per (bucket, stage): its key and residual (hooks/hook_state.h), under the layout they
  // follow: the pending records' while there are (comm_hook.h), else the current.
  absl::StatusOr<std::string> SaveState() const override {
    const bool pending = records_.pending();
    HookStateWriter w(name_, group_size_, rank_, records_.saved_layout());
    std::map<size_t, const std::vector<float>*> all;
    for (const auto& [key, residual] : records_.to_save()) all[key] = &residual;
    for (size_t key = 0; key < states_.size() && !pending; ++key) {
      if (states_[key] != nullptr) all[key] = &states_[key]->residual;
    }
    for (const auto& [key, residual] : all) {
      w.Int(static_cast<int64_t>(key));
      w.Floats(*residual);
    }
    return w.Finish();
  }

  absl::Status LoadState(absl::string_view bytes) override {
    std::map<size_t, std::vector<float>> loaded;
    uint64_t layout = records_.layout();
    if (!bytes.empty()) {
      ASSIGN_OR_RETURN(HookStateReader r, HookStateReader::Open(bytes, name_, group_size_, rank_));
      layout = r.layout();
      while (!r.AtEnd()) {
        ASSIGN_OR_RETURN(int64_t key, r.Int());
        ASSIGN_OR_RETURN(std::vector<float> residual, r.Floats());
        if (key < 0) return absl::InvalidArgumentError("int8 comm hook state: negative key");
        loaded[static_cast<size_t>(key)] = std::move(residual);
      }
    }
    states_.clear();
    records_.Load(std::move(loaded), layout);
    return absl::OkStatus();
  }

  absl::StatusOr<CommResult> Run(const CommBucket& b) override {
    if (b.dtype != DType::kF32) {
      return absl::InvalidArgumentError(
          absl::StrCat("the bucket is ", DTypeName(b.dtype), "; int8 compresses f32 only"));
    }
    const int n = b.group->size();
    const bool scatter = b.stage == CommStage::kReduceScatter;
    const size_t sent = scatter ? b.count * n : b.count;
    const size_t blocks = (sent + opts_.block - 1) / opts_.block;
    const size_t record = blocks * sizeof(float) + sent;  // scales, then the int8 values
    const size_t key = static_cast<size_t>(b.index) * 3 + static_cast<size_t>(b.stage);
    const unsigned stage_bit = 1u << static_cast<unsigned>(b.stage);
    records_.NoteRun(b.last, stage_bit);
    if (states_.size() <= key) states_.resize(key + 1);
    if (states_[key] == nullptr) states_[key] = std::make_shared<Int8State>();
    std::shared_ptr<Int8State> s = states_[key];
    if (auto it = records_.loaded().find(key); it != records_.loaded().end()) {  // checkpoint
      if (it->second.size() != sent) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the loaded int8 state of this bucket's ", CommStageName(b.stage), " holds ",
            it->second.size(), " residuals; the bucket sends ", sent, " (another bucket plan)"));
      }
      s->residual = std::move(it->second);
      records_.loaded().erase(it);
    }
    if (s->residual.size() != sent) s->residual.assign(sent, 0.0f);  // a new plan: no residual
    s->mine.resize(record);
    s->all.resize(record * n);
    s->out.resize(b.count);
    Quantize(static_cast<const float*>(b.send), sent, *s);
    CollectiveOptions opts = b.options;
    ASSIGN_OR_RETURN(s->gather,
                     b.group->AllGather(s->mine.data(), s->all.data(), record, DType::kU8, opts));
    WorkPtr done = Work::Create(WorkInfo{b.group->name(), "int8 allgather", 0, ""});
    const size_t first = scatter ? b.count * b.group->rank() : 0;
    const int block = opts_.block;
    s->gather->OnComplete([s, done, n, first, blocks, record, block](const absl::Status& st) {
      if (st.ok()) Sum(*s, n, first, blocks, record, block);
      done->Complete(st);
    });
    return CommResult{done, s->out.data(), DType::kF32, b.count};
  }

 private:
  // v = x + residual per block -> scales and int8 values into s.mine; residual = v - q * scale.
  void Quantize(const float* x, size_t sent, Int8State& s) const {
    float* scales = reinterpret_cast<float*>(s.mine.data());  // vector storage: aligned
    int8_t* q = reinterpret_cast<int8_t*>(s.mine.data() + (s.mine.size() - sent));
    for (size_t k = 0, lo = 0; lo < sent; ++k, lo += opts_.block) {
      const size_t hi = std::min(sent, lo + static_cast<size_t>(opts_.block));
      float amax = 0.0f;
      for (size_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i] + s.residual[i]));
      const float scale = amax / 127.0f;
      for (size_t i = lo; i < hi; ++i) {
        const float v = x[i] + s.residual[i];
        const float r = scale > 0.0f ? std::nearbyint(v / scale) : 0.0f;
        const float c = std::min(127.0f, std::max(-127.0f, r));
        q[i] = static_cast<int8_t>(c);
        s.residual[i] = v - c * scale;
      }
      std::memcpy(&scales[k], &scale, sizeof(float));
    }
  }

  // out[j] = (sum over ranks, in order, of q_r[first + j] * scale_r) / n.
  static void Sum(Int8State& s, int n, size_t first, size_t blocks, size_t record, int block) {
    const size_t count = s.out.size();
    for (int r = 0; r < n; ++r) {
      const uint8_t* rec = s.all.data() + record * r;
      const int8_t* q = reinterpret_cast<const int8_t*>(rec + blocks * sizeof(float));
      for (size_t j = 0; j < count; ++j) {
        const size_t i = first + j;
        float scale;
        std::memcpy(&scale, rec + (i / block) * sizeof(float), sizeof(float));
        const float v = static_cast<float>(q[i]) * scale;
        s.out[j] = r == 0 ? v : s.out[j] + v;
      }
    }
    const float d = static_cast<float>(n);
    for (float& v : s.out) v = v / d;
  }

  const Int8Options opts_;
  const std::string name_;
  std::vector<std::shared_ptr<Int8State>> states_;  // per (bucket, stage)
  // LoadState's residuals per key, by bucket layout (hooks/hook_state.h).
  LayoutRecords<size_t, std::vector<float>> records_;
  int group_size_ = 1, rank_ = 0;  // the attached group's
};

}  // namespace

absl::StatusOr<std::shared_ptr<CommHook>> MakeInt8Hook(const Int8Options& opts) {
  if (opts.block < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("int8 comm hook: block is ", opts.block, "; at least 1 element"));
  }
  return std::make_shared<Int8Hook>(opts);
}

}  // namespace braid::sched
