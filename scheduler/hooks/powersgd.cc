#include "scheduler/hooks/powersgd.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "scheduler/hooks/hook_state.h"
#include "scheduler/hooks/low_rank.h"

namespace braid::sched {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A compressed parameter: an n x k matrix at `offset`, its factors at p / q in the P and Q
// buffers (torch's layout: matrices grouped by shape, first appearance first).
struct Matrix {
  size_t offset = 0, n = 0, k = 0;
  int r = 0;
  size_t p = 0, q = 0;
};

// One bucket's plan and state, kept across steps.
struct BucketState {
  size_t count = 0;
  std::vector<Matrix> mats;
  std::vector<std::pair<size_t, size_t>> plain;  // uncompressed (offset, count), bucket order
  std::vector<std::pair<size_t, size_t>> rest;   // outside every matrix (plain and padding)
  size_t plain_count = 0, p_count = 0, q_count = 0;
  bool have_q = false;
  std::vector<float> error;  // error feedback (empty until the first compressed step)
  std::vector<float> input;  // send + error
  std::vector<float> first;  // [uncompressed | P], all-reduced in place
  std::vector<float> q;      // Q, all-reduced in place on the hook's group
  std::vector<float> out;    // the result
  std::string label;         // the bucket's label (the Q all-reduce's options point here)
  absl::Duration timeout;    // the bucket's collective deadline
  WorkPtr first_work, q_work, done;
  int group_size = 1;
};

// Buckets whose Q all-reduce waits to be issued, in Run order (= bucket order on every rank).
struct Cursor {
  struct Entry {
    std::shared_ptr<BucketState> s;
    bool ready = false;
    absl::Status status;  // the first all-reduce's
  };
  std::mutex mu;
  std::deque<std::shared_ptr<Entry>> queue;
  bool draining = false;
  Group* group = nullptr;  // the hook's own group (owned by the hook)
  float epsilon = 0.0f;
  bool warm_start = true, error_feedback = true;
};

void Finish(BucketState& s, const Cursor& c) {  // after the Q all-reduce: P Q^T, the error
  const float d = static_cast<float>(s.group_size);
  for (float& v : s.q) v = v / d;
  float* err = c.error_feedback ? s.error.data() : nullptr;
  for (const Matrix& m : s.mats) {  // the error of a matrix in the pass that writes its result
    LowRankProduct(s.first.data() + s.plain_count + m.p, s.q.data() + m.q, s.out.data() + m.offset,
                   m.n, m.k, m.r, s.input.data() + m.offset, err ? err + m.offset : nullptr);
  }
  if (c.error_feedback) {
    for (const auto& [offset, count] : s.rest) {
      for (size_t i = offset; i < offset + count; ++i) s.error[i] = s.input[i] - s.out[i];
    }
  }
  if (!c.warm_start) s.have_q = false;
}

// Issues the Q all-reduces of the ready entries at the head of the queue, in order; one
// drainer at a time, so the hook's group sees them in Run order.
void Drain(const std::shared_ptr<Cursor>& c) {
  std::unique_lock<std::mutex> lock(c->mu);
  if (c->draining) return;
  c->draining = true;
  while (!c->queue.empty() && c->queue.front()->ready) {
    std::shared_ptr<Cursor::Entry> e = std::move(c->queue.front());
    c->queue.pop_front();
    lock.unlock();
    std::shared_ptr<BucketState> s = e->s;
    absl::Status st = e->status;
    if (st.ok()) {
      CollectiveOptions opts;
      opts.label = s->label;
      opts.timeout = s->timeout;
      absl::StatusOr<WorkPtr> w = c->group->AllReduce(s->q.data(), s->q.data(), s->q_count,
                                                      DType::kF32, ReduceOp::Sum(), opts);
      if (w.ok()) {
        s->q_work = *w;
        std::weak_ptr<Cursor> weak = c;
        s->q_work->OnComplete([s, weak](const absl::Status& qs) {
          std::shared_ptr<Cursor> cur = weak.lock();
          if (qs.ok() && cur != nullptr) Finish(*s, *cur);
          s->done->Complete(cur == nullptr ? absl::CancelledError("hook released") : qs);
        });
      } else {
        st = w.status();
      }
    }
    if (!st.ok()) s->done->Complete(st);
    lock.lock();
  }
  c->draining = false;
}

class PowerSGDHook : public CommHook {
 public:
  explicit PowerSGDHook(const PowerSGDOptions& o)
      : opts_(o), name_("powersgd"), cursor_(std::make_shared<Cursor>()) {
    cursor_->epsilon = o.orthogonalization_epsilon;
    cursor_->warm_start = o.warm_start;
    cursor_->error_feedback = o.use_error_feedback;
  }

  const std::string& name() const override { return name_; }
  std::vector<NamedOption> Options() const override {
    uint64_t rows = 0x5eed;
    for (int64_t v : opts_.rows) rows = SplitMix64(rows ^ static_cast<uint64_t>(v));
    int64_t eps_bits = 0, rate_bits = 0;
    static_assert(sizeof(double) == sizeof(int64_t));
    std::memcpy(&rate_bits, &opts_.min_compression_rate, sizeof(double));
    std::memcpy(&eps_bits, &opts_.orthogonalization_epsilon, sizeof(float));
    return {{"matrix_approximation_rank", opts_.rank},
            {"start_powerSGD_iter", opts_.start_iter},
            {"min_compression_rate (bits)", rate_bits},
            {"use_error_feedback", opts_.use_error_feedback ? 1 : 0},
            {"warm_start", opts_.warm_start ? 1 : 0},
            {"orthogonalization_epsilon (bits)", eps_bits},
            {"random_seed", static_cast<int64_t>(opts_.random_seed)},
            {"parameter rows (hash)", static_cast<int64_t>(rows)}};
  }
  bool Handles(CommStage stage) const override { return stage == CommStage::kAllReduce; }
  // The buckets moved: their error feedback and warm-start Q (bucket-shaped) go; the step
  // count and the draws' position (hook-wide, as torch's state.iter and state.rng) stay.
  // Records pending for the layout `plan_fingerprint` are installed, others dropped
  // (comm_hook.h).
  void OnReplan(uint64_t plan_fingerprint) override {
    states_.clear();
    records_.Replan(plan_fingerprint);
  }

  // iter, draws; then per bucket: count, have_q, error, Q (hooks/hook_state.h), under the
  // layout they follow: the pending records' while there are (comm_hook.h), else the current.
  absl::StatusOr<std::string> SaveState() const override {
    const bool pending = records_.pending();
    HookStateWriter w(name_, group_size_, rank_, records_.saved_layout());
    w.Int(iter_);
    w.Int(draws_);
    std::map<int, const Saved*> all;
    for (const auto& [b, saved] : records_.to_save()) all[b] = &saved;
    std::map<int, Saved> live;
    for (const auto& [b, s] : states_) {
      if (pending) break;  // another layout's buckets
      live[b] = Saved{s->count, s->have_q, s->error, s->q};
      all[b] = &live[b];
    }
    for (const auto& [b, v] : all) {
      w.Int(b);
      w.Int(static_cast<int64_t>(v->count));
      w.Int(v->have_q ? 1 : 0);
      w.Floats(v->error);
      w.Floats(v->q);
    }
    return w.Finish();
  }

  absl::Status LoadState(absl::string_view bytes) override {
    std::map<int, Saved> loaded;
    int64_t iter = 0, draws = 0;
    uint64_t layout = records_.layout();
    if (!bytes.empty()) {
      ASSIGN_OR_RETURN(HookStateReader r, HookStateReader::Open(bytes, name_, group_size_, rank_));
      layout = r.layout();
      ASSIGN_OR_RETURN(iter, r.Int());
      ASSIGN_OR_RETURN(draws, r.Int());
      if (iter < 0 || draws < 0) {
        return absl::InvalidArgumentError("powersgd comm hook state: a negative step count");
      }
      while (!r.AtEnd()) {
        Saved v;
        ASSIGN_OR_RETURN(int64_t b, r.Int());
        ASSIGN_OR_RETURN(int64_t count, r.Int());
        ASSIGN_OR_RETURN(int64_t have_q, r.Int());
        ASSIGN_OR_RETURN(v.error, r.Floats());
        ASSIGN_OR_RETURN(v.q, r.Floats());
        if (b < 0 || count < 0) {
          return absl::InvalidArgumentError("powersgd comm hook state: a negative field");
        }
        v.count = static_cast<size_t>(count);
        v.have_q = have_q != 0;
        loaded[static_cast<int>(b)] = std::move(v);
      }
    }
    states_.clear();
    records_.Load(std::move(loaded), layout);  // another layout's: never applied to these buckets
    iter_ = iter;
    draws_ = draws;
    return absl::OkStatus();
  }

  absl::Status Attach(const CommAttach& at) override {
    const std::vector<ParamSpec>& params = *at.params;
    if (!opts_.rows.empty() && opts_.rows.size() != params.size()) {
      return absl::InvalidArgumentError(absl::StrCat("powersgd: rows has ", opts_.rows.size(),
                                                     " entries for ", params.size(),
                                                     " parameters (one per parameter)"));
    }
    for (size_t i = 0; i < opts_.rows.size(); ++i) {
      const int64_t n = opts_.rows[i];
      if (n < 1 || (params[i].count > 0 && params[i].count % static_cast<size_t>(n) != 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("powersgd: parameter ", params[i].Label(), " has ", params[i].count,
                         " elements, not a whole number of rows of ", n, " (rows[", i, "])"));
      }
    }
    group_size_ = at.group->size();
    rank_ = at.group->rank();
    ASSIGN_OR_RETURN(q_group_, at.group->Split(0, at.group->rank(),
                                               absl::StrCat(at.group->name(), ".powersgd")));
    cursor_->group = q_group_.get();
    states_.clear();
    records_.Attach(at.plan_fingerprint);
    return absl::OkStatus();
  }

  absl::StatusOr<CommResult> Run(const CommBucket& b) override {
    if (b.dtype != DType::kF32) {
      return absl::InvalidArgumentError(
          absl::StrCat("the bucket is ", DTypeName(b.dtype), "; powersgd compresses f32 only"));
    }
    if (q_group_ == nullptr) return absl::FailedPreconditionError("not attached to a reducer");
    records_.NoteRun(b.last);
    std::shared_ptr<BucketState>& slot = states_[b.index];
    if (slot == nullptr || slot->count != b.count) {
      slot = Plan(b);
      auto& loaded = records_.loaded();
      if (auto it = loaded.find(b.index); it != loaded.end()) {  // from a checkpoint
        Saved& v = it->second;
        if (v.count != slot->count || (v.have_q && v.q.size() != slot->q.size()) ||
            (!v.error.empty() && v.error.size() != slot->count)) {
          slot = nullptr;
          return absl::FailedPreconditionError(absl::StrCat(
              "the loaded powersgd state of this bucket is for ", v.count, " elements and ",
              v.q.size(), " Q values; the bucket has ", b.count, " (another bucket plan)"));
        }
        slot->have_q = v.have_q;
        slot->error = std::move(v.error);
        if (v.have_q) slot->q = std::move(v.q);
        loaded.erase(it);
      }
    }
    std::shared_ptr<BucketState> s = slot;
    s->group_size = b.group->size();
    s->label = std::string(b.options.label);
    s->timeout = b.options.timeout;
    const float* send = static_cast<const float*>(b.send);
    const float d = static_cast<float>(s->group_size);
    s->out.resize(s->count);
    const bool warm_up = iter_ < opts_.start_iter;
    if (b.last) ++iter_;  // torch's maybe_increase_iter: at the step's last bucket
    if (warm_up) {        // torch's allreduce_hook: divide, then sum
      for (size_t i = 0; i < s->count; ++i) s->out[i] = send[i] / d;
      ASSIGN_OR_RETURN(WorkPtr w, b.group->AllReduce(s->out.data(), s->out.data(), s->count,
                                                     DType::kF32, ReduceOp::Sum(), b.options));
      return CommResult{w, s->out.data(), DType::kF32, s->count};
    }
    Compress(*s, send, b.index);
    s->done = Work::Create(WorkInfo{q_group_->name(), "powersgd", 0, s->label});
    auto entry = std::make_shared<Cursor::Entry>();
    entry->s = s;
    {
      std::lock_guard<std::mutex> lock(cursor_->mu);
      cursor_->queue.push_back(entry);
    }
    absl::StatusOr<WorkPtr> w = b.group->AllReduce(
        s->first.data(), s->first.data(), s->first.size(), DType::kF32, ReduceOp::Sum(), b.options);
    std::shared_ptr<Cursor> c = cursor_;
    if (!w.ok()) {
      entry->status = w.status();
      entry->ready = true;  // the cursor moves past it (the peers' Q all-reduce then fails)
      Drain(c);
      return w.status();
    }
    s->first_work = *w;
    s->first_work->OnComplete([c, entry](const absl::Status& st) {
      if (st.ok()) Between(*entry->s, *c);
      {
        std::lock_guard<std::mutex> lock(c->mu);
        entry->status = st;
        entry->ready = true;
      }
      Drain(c);
    });
    return CommResult{s->done, s->out.data(), DType::kF32, s->count};
  }

 private:
  // The bucket's layout: which parameters are compressed, where their factors go.
  std::shared_ptr<BucketState> Plan(const CommBucket& b) const {
    auto s = std::make_shared<BucketState>();
    s->count = b.count;
    if (b.params.empty()) {  // no layout: the whole bucket as it is
      s->plain.emplace_back(0, b.count);
      s->plain_count = b.count;
    }
    std::vector<std::pair<std::pair<size_t, size_t>, std::vector<Matrix>>> by_shape;
    for (const CommParam& p : b.params) {
      const size_t n = opts_.rows.empty() ? p.count : static_cast<size_t>(opts_.rows[p.index]);
      const size_t k = n == 0 ? 0 : p.count / n;
      const int r = static_cast<int>(std::min<size_t>({n, k, static_cast<size_t>(opts_.rank)}));
      const bool compress =
          p.count > 0 && static_cast<double>((n + k) * r) * opts_.min_compression_rate <
                             static_cast<double>(n * k);
      if (!compress) {
        s->plain.emplace_back(p.offset, p.count);
        s->plain_count += p.count;
        continue;
      }
      Matrix m{p.offset, n, k, r, 0, 0};
      auto it = std::find_if(by_shape.begin(), by_shape.end(),
                             [&](const auto& e) { return e.first == std::make_pair(n, k); });
      if (it == by_shape.end()) it = by_shape.insert(by_shape.end(), {{n, k}, {}});
      it->second.push_back(m);
    }
    std::vector<std::pair<size_t, size_t>> spans;  // the matrices' [offset, end)
    for (auto& [shape, mats] : by_shape) {
      for (Matrix& m : mats) {
        m.p = s->p_count;
        m.q = s->q_count;
        s->p_count += m.n * m.r;
        s->q_count += m.k * m.r;
        s->mats.push_back(m);
        spans.emplace_back(m.offset, m.offset + m.n * m.k);
      }
    }
    std::sort(spans.begin(), spans.end());
    size_t at = 0;
    for (const auto& [begin, end] : spans) {
      if (begin > at) s->rest.emplace_back(at, begin - at);
      at = end;
    }
    if (s->count > at) s->rest.emplace_back(at, s->count - at);
    s->first.resize(s->plain_count + s->p_count);
    s->q.resize(s->q_count);
    return s;
  }

  // Before the first all-reduce: input = send + error; [uncompressed | P = M orth(Q)].
  // A fresh Q takes the hook's next draw (torch: the next seed from state.rng).
  void Compress(BucketState& s, const float* send, int bucket) {
    s.input.resize(s.count);
    if (opts_.use_error_feedback && s.error.size() == s.count) {
      for (size_t i = 0; i < s.count; ++i) s.input[i] = send[i] + s.error[i];
    } else {
      std::copy(send, send + s.count, s.input.begin());
      if (opts_.use_error_feedback) s.error.assign(s.count, 0.0f);
    }
    size_t at = 0;
    for (const auto& [offset, count] : s.plain) {
      std::copy(s.input.begin() + offset, s.input.begin() + offset + count, s.first.begin() + at);
      at += count;
    }
    const bool fill = !opts_.warm_start || !s.have_q;
    const int init = fill ? static_cast<int>(draws_++) : 0;
    for (const Matrix& m : s.mats) {
      float* q = s.q.data() + m.q;
      if (fill) {
        for (size_t i = 0; i < m.k * m.r; ++i) {
          q[i] = PowerSGDInitValue(opts_.random_seed, bucket, init, m.q + i);
        }
      }
      OrthogonalizeColumns(q, m.k, m.r, opts_.orthogonalization_epsilon);
      MatMul(s.input.data() + m.offset, q, s.first.data() + s.plain_count + m.p, m.n, m.k, m.r);
    }
    s.have_q = true;
    for (const auto& [offset, count] : s.rest) {  // padding between parameters stays 0
      std::fill(s.out.begin() + offset, s.out.begin() + offset + count, 0.0f);
    }
  }

  // After the first all-reduce: the uncompressed average; orth(P); Q = M^T P.
  static void Between(BucketState& s, const Cursor& c) {
    const float d = static_cast<float>(s.group_size);
    size_t at = 0;
    for (const auto& [offset, count] : s.plain) {
      for (size_t i = 0; i < count; ++i) s.out[offset + i] = s.first[at + i] / d;
      at += count;
    }
    for (const Matrix& m : s.mats) {
      float* p = s.first.data() + s.plain_count + m.p;
      OrthogonalizeColumns(p, m.n, m.r, c.epsilon);
      MatTMul(s.input.data() + m.offset, p, s.q.data() + m.q, m.n, m.k, m.r);
    }
  }

  const PowerSGDOptions opts_;
  const std::string name_;
  std::shared_ptr<Cursor> cursor_;
  std::unique_ptr<Group> q_group_;
  std::map<int, std::shared_ptr<BucketState>> states_;  // per bucket
  // Hook-wide, kept across re-plans: steps run (torch's state.iter: every bucket of step t sees
  // t) and random Q fills so far (torch's state.rng position).
  int64_t iter_ = 0, draws_ = 0;
  // A bucket's state in a checkpoint; LoadState's wait here until their bucket runs again.
  struct Saved {
    size_t count = 0;
    bool have_q = false;
    std::vector<float> error, q;
  };
  LayoutRecords<int, Saved> records_;  // LoadState's per bucket, by layout (hook_state.h)
  int group_size_ = 1, rank_ = 0;      // the attached group's
};

}  // namespace

float PowerSGDInitValue(uint64_t seed, int bucket, int init, uint64_t k) {
  const uint64_t key =
      SplitMix64(seed ^ SplitMix64((static_cast<uint64_t>(static_cast<uint32_t>(bucket)) << 32) |
                                   static_cast<uint32_t>(init)));
  const uint64_t x = SplitMix64(key + k * 0x9E3779B97F4A7C15ull);
  const float u = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
  return 2.0f * u - 1.0f;
}

absl::StatusOr<std::shared_ptr<CommHook>> MakePowerSGDHook(const PowerSGDOptions& o) {
  if (o.rank < 1 || o.start_iter < 0 || !(o.min_compression_rate > 0) ||
      !(o.orthogonalization_epsilon >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "powersgd comm hook: matrix_approximation_rank ", o.rank, " (>= 1), start_powerSGD_iter ",
        o.start_iter, " (>= 0), min_compression_rate ", o.min_compression_rate,
        " (> 0), orthogonalization_epsilon ", o.orthogonalization_epsilon, " (>= 0)"));
  }
  return std::make_shared<PowerSGDHook>(o);
}

}  // namespace braid::sched
