// Fuzz target: the C API (capi/braid.h) as a sequence of calls decoded from the input, on
// `local` worlds of one rank (made by the sequence) and, when the first byte is 7 mod 8, also
// on a `local` world of TWO ranks made up front: two threads, one per rank, each decode the
// same bytes (so they issue the same calls in the same order) and start with their rank's
// world group in the pool. Where a result differs across the ranks (an in-place check that
// depends on the rank, a call that fails on one of them) the sequences part ways; a rank then
// waits for a collective its peer never issues, for at most the 2-rank world's 50 ms deadline,
// and that deadline aborts the job (comm/abort_domain.h), so every later call of both ranks
// fails at once: never a hang, and the invariants below still hold.
//
// Input: a stream of (opcode, arguments). Handles are picked from a pool that holds every
// handle made so far, destroyed ones included, plus NULL and non-handles (a stack address,
// small integers), and are passed to functions of any handle type. Sizes, counts, dtypes,
// modes, ids and option struct sizes are fuzzed; buffers come from arenas large enough for
// the largest count, so the caller's side of every contract is kept and anything that breaks
// is Braid's. Arenas outlive every group of their session: a work destroyed unfinished leaves
// its group's destruction as the point its operation has ended (local: the worker is joined,
// and a failed op ends only once no peer can touch its buffers; finding 9).
// Checks: no crash, leak or hang; every failing call leaves a non-empty braid_last_error();
// a call with a handle of the wrong type or a destroyed handle fails with INVALID_ARGUMENT;
// at the end every live handle can be destroyed (children first) and nothing stays alive.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "capi/braid.h"
#include "tests/fuzz/fuzz_util.h"

namespace braid::fuzz {
namespace {

enum Kind { kWorld, kGroup, kWork, kReducer, kOptimizer, kKinds };

struct Handle {
  Kind kind;
  void* ptr;
  bool live;
};

constexpr size_t kMaxCount = 256;  // elements of any collective or parameter
// An all-gather's output (a reduce-scatter's input) is ranks x count elements of up to 8 bytes:
// four arena slices, each that large.
constexpr size_t kMaxRanks = 2;
constexpr size_t kArenaBytes = 4 * kMaxRanks * kMaxCount * 8;
constexpr int kMaxIds = 6;

// An options struct with zeroed room behind it, so that a struct_size larger than the struct
// (a caller built against a newer braid.h) is still the caller keeping its side of the
// contract: the library reads struct_size bytes.
template <typename T>
struct Padded {
  T o;
  unsigned char tail[256] = {};
};

class Session {
 public:
  // `timeout_ms`: the deadline of what the sequence makes (shorter on 2-rank runs).
  explicit Session(FuzzInput& in, int64_t timeout_ms = 2000)
      : in_(in),
        timeout_ms_(timeout_ms),
        arena_(kArenaBytes, 0),
        grads_(kMaxIds * kMaxCount * 8, 0) {}

  // A handle made outside the sequence (the 2-rank world's group of this rank), which the
  // session uses and destroys like its own.
  void Seed(void* group) { Add(kGroup, group); }

  void Run() {
    for (int ops = 0; !in_.empty() && ops < 64; ++ops) Step(in_.Byte() % 24);
    Cleanup();
  }

 private:
  // Any handle-like value: a handle of the wanted kind most of the time, else anything.
  void* Pick(Kind want) {
    const uint8_t b = in_.Byte();
    if (b < 200) {
      for (size_t k = 0, n = handles_.size(); k < n; ++k) {
        const Handle& h = handles_[(b + k) % n];
        if (h.kind == want && h.live) return h.ptr;
      }
    }
    switch (b % 5) {
      case 0:
        return nullptr;
      case 1:
        return &arena_;  // an address that is no handle
      case 2:
        return reinterpret_cast<void*>(uintptr_t{b});
      default:
        return handles_.empty() ? nullptr : handles_[in_.Byte() % handles_.size()].ptr;
    }
  }
  void Add(Kind kind, void* p) { handles_.push_back(Handle{kind, p, true}); }
  void Destroyed(void* p) {
    for (Handle& h : handles_)
      if (h.ptr == p) h.live = false;
  }
  // What a call must do with a handle that is not a live one of the expected kind.
  void Check(braid_status_t st, void* h, Kind want) {
    if (st != BRAID_OK && st != BRAID_IN_PROGRESS) {
      FUZZ_CHECK(braid_last_error()[0] != '\0', "status %s without a message",
                 braid_status_name(st));
    }
    bool valid = false;
    for (const Handle& x : handles_) valid = valid || (x.ptr == h && x.live && x.kind == want);
    if (!valid)
      FUZZ_CHECK(st == BRAID_INVALID_ARGUMENT, "bad handle accepted: %s", braid_status_name(st));
  }
  size_t Count() { return in_.Byte() % 8 == 0 ? 0 : 1 + in_.Le(2) % kMaxCount; }
  // Enum arguments stay inside the range of their C++ enum type (0..7 here), invalid ones
  // included: forming a value outside it is undefined behaviour in this C++ target itself. The
  // shim reads every enum argument as an int (capi/convert.h: RawEnum), and the C tests pass
  // values outside the range (tests/capi: capi_test.c, capi_errors_test.c).
  braid_dtype_t DType() { return static_cast<braid_dtype_t>(in_.Byte() % 8); }
  void* Buf() { return arena_.data() + (in_.Byte() % 4) * (kArenaBytes / 4); }
  int64_t Id() {
    const int64_t id = in_.Byte() % (kMaxIds + 1);
    return in_.Byte() % 16 == 0 ? -1 : id;
  }
  void* Grad(int64_t id) {
    return grads_.data() + static_cast<size_t>(id < 0 ? 0 : id % kMaxIds) * kMaxCount * 8;
  }

  // 0, too small, an older size, this size, or larger with a zero or non-zero tail.
  template <typename T>
  void FuzzSize(Padded<T>& p) {
    const uint8_t b = in_.Byte();
    switch (b % 5) {
      case 0:
        p.o.struct_size = 0;
        break;
      case 1:
        p.o.struct_size = b % 40;
        break;
      case 2:
        p.o.struct_size = sizeof(T) - 8 * (1 + b % 3);
        break;
      case 3:
        p.o.struct_size = sizeof(T);
        break;
      default:
        p.o.struct_size = sizeof(T) + 1 + b % sizeof(p.tail);
        if (b & 0x80) p.tail[b % (p.o.struct_size - sizeof(T))] = 1;
        break;
    }
  }

  braid_collective_options_t* CollOpts(Padded<braid_collective_options_t>* p) {
    braid_collective_options_t* o = &p->o;
    const uint8_t b = in_.Byte();
    if (b % 4 == 0) return nullptr;
    braid_collective_options_init(o);
    if (b & 4) FuzzSize(*p);
    if (b & 8) {  // at most the session's deadline: a 2-rank run never waits long for a peer
      o->timeout_ms = std::min<int64_t>(static_cast<int64_t>(in_.Le(2)) - 100, timeout_ms_);
    }
    if (b & 16) o->premul_scalar = static_cast<double>(static_cast<int8_t>(in_.Byte())) / 3.0;
    if (b & 32) o->label = "fuzz unit";
    return o;
  }

  void Step(int op) {
    braid_status_t st = BRAID_OK;
    void* out = nullptr;
    switch (op) {
      case 0: {  // world_create
        Padded<braid_world_options_t> padded;
        braid_world_options_t& o = padded.o;
        braid_world_options_init(&o);
        o.backend = "local";
        o.read_env = 0;
        o.local_ranks = in_.Byte() % 8 == 0 ? -1 : 1;
        o.timeout_ms = timeout_ms_;
        const uint8_t b = in_.Byte();
        if (b % 8 == 0) FuzzSize(padded);
        if (b % 8 == 1) o.backend = "no such backend";
        if (b % 8 == 2) o.world_size = 2;
        st =
            braid_world_create(b % 16 == 3 ? nullptr : &o, reinterpret_cast<braid_world_t**>(&out));
        if (st == BRAID_OK) Add(kWorld, out);
        FUZZ_CHECK(st == BRAID_OK || braid_last_error()[0] != '\0', "world_create");
        return;
      }
      case 1: {
        void* w = Pick(kWorld);
        int n = 0;
        st = braid_world_size(static_cast<braid_world_t*>(w), &n);
        Check(st, w, kWorld);
        if (st == BRAID_OK) FUZZ_CHECK(n == 1, "world size %d", n);
        return;
      }
      case 2: {
        void* w = Pick(kWorld);
        int ranks[4] = {-1, -1, -1, -1}, count = -1;
        int* dst = in_.Byte() & 1 ? ranks : nullptr;
        const int capacity = in_.Byte() % 3;
        st = braid_world_local_ranks(static_cast<braid_world_t*>(w), dst, capacity, &count);
        Check(st, w, kWorld);
        return;
      }
      case 3: {
        void* w = Pick(kWorld);
        const int rank = static_cast<int>(in_.Byte() % 3) - 1;
        st = braid_world_group(static_cast<braid_world_t*>(w), rank,
                               reinterpret_cast<braid_group_t**>(&out));
        Check(st, w, kWorld);
        if (st == BRAID_OK) Add(kGroup, out);
        return;
      }
      case 4: {
        void* g = Pick(kGroup);
        int rank = -1, size = 0;
        const char* name = nullptr;
        st = braid_group_rank(static_cast<braid_group_t*>(g), &rank);
        Check(st, g, kGroup);
        st = braid_group_size(static_cast<braid_group_t*>(g), &size);
        Check(st, g, kGroup);
        st = braid_group_name(static_cast<braid_group_t*>(g), &name);
        Check(st, g, kGroup);
        if (st == BRAID_OK) {
          FUZZ_CHECK(name != nullptr && rank >= 0 && rank < size && size <= 2, "group info");
        }
        return;
      }
      case 5: {
        void* g = Pick(kGroup);
        const int color = static_cast<int>(in_.Byte() % 3) - 1;
        const int key = in_.Byte();
        const char* name = key % 2 ? "fuzz" : nullptr;
        st = braid_group_split(static_cast<braid_group_t*>(g), color, key, name,
                               reinterpret_cast<braid_group_t**>(&out));
        if (st == BRAID_OK && out != nullptr) Add(kGroup, out);
        return;
      }
      case 6: {
        void* g = Pick(kGroup);
        const int r = in_.Byte() % 3, s = in_.Byte() % 3;
        braid_group_t* rep = nullptr;
        st = braid_mesh_create(static_cast<braid_group_t*>(g), r, s, &rep,
                               reinterpret_cast<braid_group_t**>(&out));
        if (st == BRAID_OK) {
          Add(kGroup, rep);
          Add(kGroup, out);
        }
        return;
      }
      case 7:
      case 8:
      case 9:
      case 10:
      case 11: {  // collectives
        void* g = Pick(kGroup);
        Padded<braid_collective_options_t> co;
        braid_collective_options_t* opts = CollOpts(&co);
        const size_t n = Count();
        const braid_dtype_t t = DType();
        const auto rop = static_cast<braid_reduce_op_t>(in_.Byte() % 8);
        void* a = in_.Byte() % 16 == 0 ? nullptr : Buf();
        void* b = in_.Byte() % 2 == 0 ? a : Buf();
        auto** w = reinterpret_cast<braid_work_t**>(&out);
        auto* grp = static_cast<braid_group_t*>(g);
        if (op == 7) st = braid_allreduce(grp, a, b, n, t, rop, opts, w);
        if (op == 8) st = braid_reduce_scatter(grp, a, b, n, t, rop, opts, w);
        if (op == 9) st = braid_allgather(grp, a, b, n, t, opts, w);
        const int root = static_cast<int>(in_.Byte() % 3) - 1;
        if (op == 10) st = braid_broadcast(grp, b, n, t, root, opts, w);
        if (op == 11) st = braid_barrier(grp, opts, w);
        Check(st, g, kGroup);
        if (st == BRAID_OK) Add(kWork, out);
        return;
      }
      case 12: {
        void* w = Pick(kWork);
        int done = 0;
        const uint8_t how = in_.Byte();
        st = how & 1 ? braid_work_wait(static_cast<braid_work_t*>(w), how % 3 == 0 ? -1 : 100)
                     : braid_work_test(static_cast<braid_work_t*>(w), &done);
        return;
      }
      case 13: {  // reducer_create
        void* shard = Pick(kGroup);
        void* replica = in_.Byte() % 3 == 0 ? Pick(kGroup) : nullptr;
        braid_param_t params[5];
        const size_t n = in_.Byte() % 6;
        for (size_t i = 0; i < n; ++i) {
          params[i].id = Id();
          params[i].count = Count();
          params[i].dtype = DType();
          params[i].name = in_.Byte() & 1 ? "p" : nullptr;
        }
        Padded<braid_reducer_options_t> padded;
        braid_reducer_options_t& o = padded.o;
        braid_reducer_options_init(&o);
        const uint8_t b = in_.Byte();
        o.mode = static_cast<braid_reduce_mode_t>(b % 4);
        o.bucket_cap_bytes = 64u << (in_.Byte() % 6);
        o.first_bucket_cap_bytes = 64u << (in_.Byte() % 6);
        o.allow_unused = (b >> 2) & 1;
        o.gradient_as_bucket_view = ((b >> 3) & 1) == 0;
        o.timeout_ms = timeout_ms_;
        if ((b >> 4) % 8 == 0) o.reduce_dtype = in_.Byte() % 6 - 1;
        if ((b >> 4) % 8 == 1) FuzzSize(padded);
        if ((b >> 4) % 8 == 2) o.device = in_.Byte() % 3 - 1;
        if ((b >> 4) % 8 == 3) o.shard_gradients = 1;  // pooled storage: grad_slot, marks
        const braid_reducer_options_t* opts = in_.Byte() % 8 == 0 ? nullptr : &o;
        st = braid_reducer_create(
            static_cast<braid_group_t*>(shard), static_cast<braid_group_t*>(replica),
            b % 32 == 31 ? nullptr : params, n, opts, reinterpret_cast<braid_reducer_t**>(&out));
        if (st == BRAID_OK) Add(kReducer, out);
        return;
      }
      case 14:
      case 15:
      case 16:
      case 17: {  // reducer calls
        void* r = Pick(kReducer);
        auto* red = static_cast<braid_reducer_t*>(r);
        const int64_t id = Id();
        switch ((op - 14) * 4 + in_.Byte() % 4) {
          case 0: {
            const auto mode = static_cast<braid_sync_mode_t>(in_.Byte() % 4);
            st = braid_reducer_begin_backward(red, mode);
            break;
          }
          case 1:
          case 2:
          case 3:
          case 4:
            st = braid_reducer_mark_ready(red, id, nullptr);
            break;
          case 5: {  // written in place (shard_gradients), then marked
            void* data = nullptr;
            size_t count = 0;
            st = braid_reducer_grad_slot(red, id, &data, &count);
            if (st == BRAID_OK && data != nullptr && count > 0)
              std::memset(data, in_.Byte(), count);  // >= 1 byte/elem
            if (st == BRAID_OK) st = braid_reducer_mark_ready(red, id, nullptr);
            break;
          }
          case 6:
            st = braid_reducer_finish_backward(red);
            break;
          case 7:
            st = braid_reducer_zero_grads(red);
            break;
          case 8: {
            void* data = nullptr;
            size_t count = 0;
            st = braid_reducer_grad(red, id, &data, &count);
            if (st == BRAID_OK && data != nullptr && count > 0)
              std::memset(data, in_.Byte(), count);  // >= 1 byte/elem
            break;
          }
          case 9:
            st = braid_reducer_set_grad_buffer(red, id, Grad(id));
            break;
          case 10: {
            int n = 0, bucket = 0;
            st = braid_reducer_num_buckets(red, &n);
            if (st == BRAID_OK) st = braid_reducer_param_bucket(red, id, &bucket);
            break;
          }
          case 11: {
            void* data = nullptr;
            size_t count = 0;
            const int bucket = static_cast<int>(in_.Byte() % 6) - 1;
            st = braid_reducer_shard(red, bucket, &data, &count);
            break;
          }
          default: {
            int n = 0;
            st = braid_reducer_num_buckets(red, &n);
            Check(st, r, kReducer);
            return;
          }
        }
        if (st != BRAID_OK)
          FUZZ_CHECK(braid_last_error()[0] != '\0', "reducer call without a message");
        return;
      }
      case 18: {  // optimizer_create
        void* r = Pick(kReducer);
        Padded<braid_optimizer_options_t> padded;
        braid_optimizer_options_t& o = padded.o;
        braid_optimizer_options_init(&o);
        const uint8_t b = in_.Byte();
        o.kind = static_cast<braid_optimizer_kind_t>(b % 2);
        o.threads = 1 + (b >> 2) % 2;
        o.overlap = (b >> 3) & 1;
        o.skip_nonfinite = (b >> 4) & 1;
        o.max_grad_norm = (b >> 5) & 1 ? 1.0 : 0.0;
        o.timeout_ms = timeout_ms_;
        static const double kLr[] = {1e-3, 0.0, -1.0, 1e300, __builtin_nan("")};
        o.lr = kLr[in_.Byte() % 5];
        if (b >> 6 == 3) FuzzSize(padded);
        st = braid_optimizer_create(static_cast<braid_reducer_t*>(r), &o,
                                    reinterpret_cast<braid_optimizer_t**>(&out));
        if (st == BRAID_OK) Add(kOptimizer, out);
        return;
      }
      case 19:
      case 20: {  // optimizer calls
        void* p = Pick(kOptimizer);
        auto* opt = static_cast<braid_optimizer_t*>(p);
        const int64_t id = Id();
        switch ((op - 19) * 8 + in_.Byte() % 8) {
          case 0: {
            const auto mode = static_cast<braid_sync_mode_t>(in_.Byte() % 4);
            st = braid_optimizer_begin_backward(opt, mode);
            break;
          }
          case 1:
            st = braid_optimizer_finish_backward(opt);
            break;
          case 2:
            st = braid_optimizer_step(opt);
            break;
          case 3: {
            const int bucket = static_cast<int>(in_.Byte() % 6) - 1;
            st = braid_optimizer_wait_params(opt, bucket);
            break;
          }
          case 4:
            st = braid_optimizer_wait_all_params(opt);
            break;
          case 5:
            st = braid_optimizer_set_param(opt, id, Grad(id));
            break;
          case 6: {
            void* data = nullptr;
            size_t count = 0;
            st = braid_optimizer_param(opt, id, &data, &count);
            break;
          }
          case 7: {
            const double lr = in_.Byte() % 2 ? 0.5 : -1.0;
            st = braid_optimizer_set_lr(opt, lr);
            break;
          }
          default: {
            int64_t rounds = 0;
            int skipped = 0;
            double norm = 0;
            st = braid_optimizer_last_step(opt, &rounds, &skipped, &norm);
            Check(st, p, kOptimizer);
            return;
          }
        }
        if (st != BRAID_OK)
          FUZZ_CHECK(braid_last_error()[0] != '\0', "optimizer call without a message");
        return;
      }
      default: {  // destroy anything, in any order
        const Kind k = static_cast<Kind>(in_.Byte() % kKinds);
        void* h = Pick(k);
        st = DestroyAs(k, h);
        if (st == BRAID_OK && h != nullptr) Destroyed(h);
        if (st != BRAID_OK && st != BRAID_FAILED_PRECONDITION) Check(st, h, k);
        return;
      }
    }
  }

  braid_status_t DestroyAs(Kind k, void* h) {
    switch (k) {
      case kWorld:
        return braid_world_destroy(static_cast<braid_world_t*>(h));
      case kGroup:
        return braid_group_destroy(static_cast<braid_group_t*>(h));
      case kWork:
        return braid_work_destroy(static_cast<braid_work_t*>(h));
      case kReducer:
        return braid_reducer_destroy(static_cast<braid_reducer_t*>(h));
      default:
        return braid_optimizer_destroy(static_cast<braid_optimizer_t*>(h));
    }
  }

  // Children first: optimizers, reducers, works, groups (newest first), worlds.
  void Cleanup() {
    for (Kind k : {kOptimizer, kReducer, kWork, kGroup, kWorld}) {
      for (int pass = 0; pass < 4; ++pass) {
        for (auto it = handles_.rbegin(); it != handles_.rend(); ++it) {
          if (it->kind != k || !it->live) continue;
          if (DestroyAs(k, it->ptr) == BRAID_OK) it->live = false;
        }
      }
      for (const Handle& h : handles_) {
        FUZZ_CHECK(h.kind != k || !h.live, "a live handle of kind %d cannot be destroyed: %s", k,
                   braid_last_error());
      }
    }
  }

  FuzzInput& in_;
  const int64_t timeout_ms_;
  std::vector<unsigned char> arena_;
  std::vector<unsigned char> grads_;
  std::vector<Handle> handles_;
};

}  // namespace
}  // namespace braid::fuzz

namespace braid::fuzz {
namespace {

// Both ranks of a 2-rank local world, each on a thread of its own, run the sequence in `data`.
void RunTwoRanks(const uint8_t* data, size_t size) {
  braid_world_options_t o;
  braid_world_options_init(&o);
  o.backend = "local";
  o.read_env = 0;
  o.local_ranks = 2;
  o.timeout_ms = 50;
  braid_world_t* world = nullptr;
  braid_group_t* groups[2] = {nullptr, nullptr};
  FUZZ_CHECK(braid_world_create(&o, &world) == BRAID_OK, "2-rank world: %s", braid_last_error());
  for (int r = 0; r < 2; ++r) {
    FUZZ_CHECK(braid_world_group(world, r, &groups[r]) == BRAID_OK, "2-rank group: %s",
               braid_last_error());
  }
  auto rank = [&](int r) {
    FuzzInput in(data, size);
    Session s(in, /*timeout_ms=*/50);
    s.Seed(groups[r]);
    s.Run();  // destroys groups[r] with the rest
  };
  std::thread peer(rank, 1);
  rank(0);
  peer.join();
  FUZZ_CHECK(braid_world_destroy(world) == BRAID_OK, "2-rank world destroy: %s",
             braid_last_error());
}

}  // namespace
}  // namespace braid::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 0 && data[0] % 8 == 7) {
    braid::fuzz::RunTwoRanks(data + 1, size - 1);
    return 0;
  }
  braid::fuzz::FuzzInput in(data, size);
  braid::fuzz::Session(in).Run();
  return 0;
}
