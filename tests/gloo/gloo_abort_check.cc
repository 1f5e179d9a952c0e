// A failure reaches every rank within 2 s on the `gloo` backend (ranks are processes meeting
// at rank 0's store; the abort travels through it, gloo_abort.h). Run by run_ranks.sh with 3
// ranks and one scenario; every rank exits 0 only if what it saw is right:
//
//   abort_job  rank 2's step fails (AbortJob after 200 ms); ranks 0 and 1, blocked inside a
//              world all-reduce rank 2 never joins (deadline 60 s), must stop within 2 s of it,
//              naming rank 2 and the cause.
//   deadline   rank 0's all-reduce on the group {0, 1} has a 300 ms deadline and rank 1
//              stalls; rank 2, blocked in a world all-reduce (60 s), must stop within 2 s of
//              that deadline, naming rank 0; rank 1's next call is refused.
//   die        rank 2 exits after 200 ms without any cleanup (std::_Exit: its sockets close
//              as on kill -9) while ranks 0 and 1 wait in a world all-reduce (60 s): they
//              must fail within 2 s (Gloo's "connection closed by peer"; the group's failure
//              then aborts the job through the store for ranks not waiting on rank 2).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "comm/backend.h"
#include "comm/group.h"

namespace braid {
namespace {

constexpr absl::Duration kPrompt = absl::Seconds(2);

absl::Status Outcome(absl::StatusOr<WorkPtr> w) {
  return w.ok() ? (*w)->Wait(absl::Seconds(90)) : w.status();
}

int Verdict(int rank, bool ok, absl::Duration took, const absl::Status& s) {
  std::printf("GLOO-ABORT rank=%d ok=%d ms=%lld what=%s\n", rank, ok ? 1 : 0,
              static_cast<long long>(absl::ToInt64Milliseconds(took)), s.ToString().c_str());
  std::fflush(stdout);
  return ok ? 0 : 1;
}

int Run(const std::string& scenario) {
  Options o;
  o.backend = "gloo";
  o.timeout = absl::Seconds(60);
  auto backend = CreateBackend(o);
  if (!backend.ok()) {
    std::fprintf(stderr, "gloo backend: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  const int rank = (*backend)->local_ranks().at(0);
  auto world = (*backend)->WorldGroup(rank);
  if (!world.ok() || (*world)->size() != 3) {
    std::fprintf(stderr, "world of 3 ranks needed\n");
    return 1;
  }
  Group& g = **world;
  auto pair = g.Split(rank < 2 ? 0 : 1, rank, "pair");
  if (!pair.ok() || !Outcome(g.Barrier()).ok()) return 1;
  float buf[32] = {};
  const absl::Time start = absl::Now();
  int rc = 1;
  if (scenario == "abort_job") {
    if (rank == 2) {
      absl::SleepFor(absl::Milliseconds(200));
      const absl::Status a = g.AbortJob(absl::InternalError("step 9: loss is NaN"));
      rc = Verdict(rank, a.ok(), absl::Now() - start, a);
    } else {
      const absl::Status s = Outcome(g.AllReduce(buf, buf, 32, DType::kF32, ReduceOp::Sum()));
      const absl::Duration took = absl::Now() - start - absl::Milliseconds(200);
      rc = Verdict(rank,
                   s.code() == absl::StatusCode::kAborted &&
                       absl::StrContains(s.message(), "job aborted: rank 2 reported") &&
                       absl::StrContains(s.message(), "step 9: loss is NaN") && took < kPrompt,
                   took, s);
    }
  } else if (scenario == "deadline") {
    if (rank == 0) {
      CollectiveOptions co;
      co.timeout = absl::Milliseconds(300);
      const absl::Status s =
          Outcome((*pair)->AllReduce(buf, buf, 32, DType::kF32, ReduceOp::Sum(), co));
      rc = Verdict(rank, s.code() == absl::StatusCode::kDeadlineExceeded, absl::Now() - start, s);
    } else if (rank == 1) {
      while (!g.abort_domain()->aborted() && absl::Now() - start < absl::Seconds(30)) {
        absl::SleepFor(absl::Milliseconds(2));
      }
      const absl::Duration took = absl::Now() - start - absl::Milliseconds(300);
      const absl::Status s = g.Barrier().status();
      rc = Verdict(rank,
                   absl::StrContains(s.message(), "refuses new calls") &&
                       absl::StrContains(s.message(), "rank 0 reported") && took < kPrompt,
                   took, s);
    } else {
      const absl::Status s = Outcome(g.AllReduce(buf, buf, 32, DType::kF32, ReduceOp::Sum()));
      const absl::Duration took = absl::Now() - start - absl::Milliseconds(300);
      rc = Verdict(rank,
                   s.code() == absl::StatusCode::kAborted &&
                       absl::StrContains(s.message(), "job aborted: rank 0 reported") &&
                       took < kPrompt,
                   took, s);
    }
  } else if (scenario == "die") {
    if (rank == 2) {
      absl::SleepFor(absl::Milliseconds(200));
      std::_Exit(0);  // no cleanup at all: its sockets close as on a crash (kill -9)
    }
    const absl::Status s = Outcome(g.AllReduce(buf, buf, 32, DType::kF32, ReduceOp::Sum()));
    const absl::Duration took = absl::Now() - start - absl::Milliseconds(200);
    rc = Verdict(rank, !s.ok() && took < kPrompt, took, s);
  } else {
    std::fprintf(stderr, "unknown scenario '%s'\n", scenario.c_str());
    return 2;
  }
  // Rank 0 holds the store the others' watchers poll: it leaves last.
  if (rank == 0) absl::SleepFor(absl::Milliseconds(300));
  return rc;
}

}  // namespace
}  // namespace braid

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s abort_job|deadline|die\n", argv[0]);
    return 2;
  }
  return braid::Run(argv[1]);
}
