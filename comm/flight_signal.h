// FlightSignal: the flight recorders of this process are written when it receives a signal,
// so a rank that seems hung can be asked what it did last without stopping it:
//
//   BRAID_FLIGHT_RECORDER_DIR=/shared/fr BRAID_FLIGHT_RECORDER_SIGNAL=SIGUSR1 ./trainer
//   $ kill -USR1 <pid of a rank>      # each of its ranks writes braid_flight.rank<R>.jsonl
//
// Installed only when asked (Options::flight_recorder_signal; Backend::WorldGroup subscribes
// each rank's recorder). The handler is async-signal-safe: it writes one byte to a pipe and
// returns; a thread of the dumper reads the pipe and runs the subscribers (FlightRecorder::DumpTo,
// which allocates and does file I/O) off the signal context, as c10d's and Horovod's dumps do
// from threads of their own. One dumper per process (a signal's disposition is process-wide):
// the first Subscribe installs it, the last Subscription gone restores the previous
// disposition, joins the thread and closes the pipe.
//
// Contract: only SIGUSR1 and SIGUSR2; FailedPrecondition when the host already handles that
// signal (Braid never replaces a host's handler: call braid_flight_recorder_dump from it instead)
// or when this process's dumper serves the other one. Every signal runs every subscriber once
// (signals arriving while a dump runs may coalesce into one more).
//
// Globals, because a signal handler reaches nothing else: the pipe's write end and a count of
// handlers running (both lock-free atomics, read by the handler), and the process's one dumper
// (a weak pointer under a mutex). Nothing else is global.
#ifndef BRAID_COMM_FLIGHT_SIGNAL_H_
#define BRAID_COMM_FLIGHT_SIGNAL_H_

#include <signal.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace braid {

class FlightSignal : public std::enable_shared_from_this<FlightSignal> {
 public:
  using Dump = std::function<void(absl::string_view reason)>;  // reason: "signal SIGUSR1"

  // Unsubscribes on destruction (waiting for a running call of its Dump); keeps the dumper.
  class Subscription {
   public:
    Subscription() = default;
    Subscription(Subscription&& other) noexcept = default;
    Subscription& operator=(Subscription&& other) noexcept;
    ~Subscription();
    void Reset();

   private:
    friend class FlightSignal;
    Subscription(std::shared_ptr<FlightSignal> s, uint64_t id) : signal_(std::move(s)), id_(id) {}
    std::shared_ptr<FlightSignal> signal_;
    uint64_t id_ = 0;
  };

  // Calls `dump` on every `signo` from now on. InvalidArgument for a signal other than SIGUSR1 /
  // SIGUSR2; FailedPrecondition (above); Internal / ResourceExhausted when the pipe, the thread
  // or sigaction fails (nothing installed then).
  static absl::StatusOr<Subscription> Subscribe(int signo, Dump dump);

  ~FlightSignal();  // restores the disposition, joins the thread, closes the pipe
  FlightSignal(const FlightSignal&) = delete;
  FlightSignal& operator=(const FlightSignal&) = delete;

  int signo() const { return signo_; }
  uint64_t signals_served() const;  // dumping rounds run so far

 private:
  FlightSignal(int signo, int read_fd, int write_fd, const struct sigaction& previous);
  void Loop();
  void Unsubscribe(uint64_t id);

  const int signo_;
  const int read_fd_;
  const int write_fd_;
  const struct sigaction previous_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable idle_;    // a Dump call ended
  std::map<uint64_t, Dump> dumps_;  // guarded by mu_
  uint64_t next_id_ = 1;            // guarded by mu_
  uint64_t running_ = 0;            // id of the Dump running now (0: none); guarded by mu_
  uint64_t served_ = 0;             // guarded by mu_
};

}  // namespace braid

#endif  // BRAID_COMM_FLIGHT_SIGNAL_H_
