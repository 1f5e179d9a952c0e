// A C++ program on Braid's installed SDK, built outside the tree by tests/sdk/sdk_test.sh (with
// pkg-config and with CMake's find_package(Braid)): a local world of 2 ranks as 2 std::threads
// runs a reduce-scatter then an all-gather of 8 floats and compares every element with the sum
// computed here. Prints "sdk_example: ok" and exits 0 only when all match.
#include <cstdio>
#include <thread>
#include <vector>

#include "braid.h"

namespace {

constexpr int kRanks = 2;
constexpr int kCount = 8;  // per rank after the reduce-scatter: kCount / kRanks

float Input(int rank, int i) { return static_cast<float>(rank * 100 + i) * 0.5f; }

// Waits for `work` (when `status`, the launch's, is BRAID_OK) and destroys it.
bool Finish(braid_status_t status, braid_work_t* work, const char* what, int rank) {
  if (status == BRAID_OK) status = braid_work_wait(work, 10000);
  braid_work_destroy(work);
  if (status != BRAID_OK) std::fprintf(stderr, "rank %d: %s: %s\n", rank, what, braid_last_error());
  return status == BRAID_OK;
}

bool RunRank(braid_group_t* group, int rank) {
  std::vector<float> send(kCount), shard(kCount / kRanks), full(kCount, -1.0f);
  for (int i = 0; i < kCount; ++i) send[i] = Input(rank, i);
  braid_work_t* work = nullptr;
  braid_status_t status = braid_reduce_scatter(group, send.data(), shard.data(), shard.size(),
                                               BRAID_DTYPE_F32, BRAID_OP_SUM, nullptr, &work);
  if (!Finish(status, work, "reduce_scatter", rank)) return false;
  work = nullptr;
  status = braid_allgather(group, shard.data(), full.data(), shard.size(), BRAID_DTYPE_F32, nullptr,
                           &work);
  if (!Finish(status, work, "allgather", rank)) return false;
  bool ok = true;
  for (int i = 0; i < kCount; ++i) {
    float want = 0.0f;
    for (int r = 0; r < kRanks; ++r) want += Input(r, i);
    if (full[i] != want) {
      std::fprintf(stderr, "rank %d: element %d is %g, want %g\n", rank, i, full[i], want);
      ok = false;
    }
  }
  return ok;
}

}  // namespace

int main() {
  if (braid_abi_version() != BRAID_ABI_VERSION) {
    std::fprintf(stderr, "libbraid has ABI %d, braid.h %d\n", braid_abi_version(),
                 BRAID_ABI_VERSION);
    return 1;
  }
  braid_world_options_t opts;
  braid_world_options_init(&opts);
  opts.backend = "local";
  opts.local_ranks = kRanks;
  braid_world_t* world = nullptr;
  if (braid_world_create(&opts, &world) != BRAID_OK) {
    std::fprintf(stderr, "%s\n", braid_last_error());
    return 1;
  }
  braid_group_t* groups[kRanks] = {};
  for (int r = 0; r < kRanks; ++r) braid_world_group(world, r, &groups[r]);
  bool ok[kRanks] = {};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) threads.emplace_back([&, r] { ok[r] = RunRank(groups[r], r); });
  for (std::thread& t : threads) t.join();
  for (braid_group_t* g : groups) braid_group_destroy(g);
  braid_world_destroy(world);
  const bool all = ok[0] && ok[1];
  std::printf("sdk_example: braid %s (header %d.%d.%d): %s\n", braid_version(), BRAID_VERSION_MAJOR,
              BRAID_VERSION_MINOR, BRAID_VERSION_PATCH, all ? "ok" : "FAILED");
  return all ? 0 : 1;
}
