#include "comm/flight_signal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/thread_start.h"

namespace braid {
namespace {

// What the handler reads (see the header's "Globals"): lock-free atomics only.
std::atomic<int> g_write_fd{-1};
std::atomic<int> g_in_handler{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs lock-free atomics");

constexpr char kSignalled = 1;
constexpr char kStop = 0;

extern "C" void BraidFlightSignalHandler(int) {
  const int saved = errno;
  g_in_handler.fetch_add(1);
  const int fd = g_write_fd.load();
  if (fd >= 0) {
    const char b = kSignalled;
    const ssize_t n = write(fd, &b, 1);  // EAGAIN (pipe full): the pending byte serves it
    (void)n;
  }
  g_in_handler.fetch_sub(1);
  errno = saved;
}

// The process's one dumper; its teardown holds the mutex, so a new one never sees the
// previous one's handler still installed.
std::mutex& RegistryMu() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::weak_ptr<FlightSignal>& Registry() {
  static std::weak_ptr<FlightSignal>* current = new std::weak_ptr<FlightSignal>;
  return *current;
}

const char* SignalName(int signo) { return signo == SIGUSR1 ? "SIGUSR1" : "SIGUSR2"; }

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat("flight recorder signal: ", what, ": ", strerror(errno)));
}

}  // namespace

absl::StatusOr<FlightSignal::Subscription> FlightSignal::Subscribe(int signo, Dump dump) {
  if (signo != SIGUSR1 && signo != SIGUSR2) {
    return absl::InvalidArgumentError(absl::StrCat("flight recorder signal ", signo,
                                                   ": only SIGUSR1 and SIGUSR2 can trigger dumps"));
  }
  std::unique_lock<std::mutex> lock(RegistryMu());
  std::shared_ptr<FlightSignal> s = Registry().lock();
  if (s != nullptr && s->signo_ != signo) {
    return absl::FailedPreconditionError(absl::StrCat("flight recorder signal ", SignalName(signo),
                                                      ": this process dumps on ",
                                                      SignalName(s->signo_), " already"));
  }
  if (s == nullptr) {
    struct sigaction previous;
    if (sigaction(signo, nullptr, &previous) != 0) return Errno("sigaction (query)");
    const bool has_handler = (previous.sa_flags & SA_SIGINFO) != 0 ||
                             (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN);
    if (has_handler) {
      return absl::FailedPreconditionError(absl::StrCat(
          "flight recorder signal ", SignalName(signo),
          ": the process already handles it; Braid does not replace a host's handler (call "
          "braid_flight_recorder_dump from it, or choose the other signal)"));
    }
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return Errno("pipe2");
    if (fcntl(fds[1], F_SETFL, O_NONBLOCK) != 0) {
      const absl::Status st = Errno("fcntl");
      close(fds[0]);
      close(fds[1]);
      return st;
    }
    s.reset(new FlightSignal(signo, fds[0], fds[1], previous));
    FlightSignal* raw = s.get();
    absl::Status st =
        StartThread(&s->thread_, "the flight recorder's signal dumps", [raw] { raw->Loop(); });
    if (st.ok()) {
      g_write_fd.store(fds[1]);
      struct sigaction sa;
      memset(&sa, 0, sizeof(sa));
      sa.sa_handler = &BraidFlightSignalHandler;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;
      if (sigaction(signo, &sa, nullptr) != 0) st = Errno("sigaction (install)");
    }
    if (!st.ok()) {
      // ~FlightSignal restores `previous` (a no-op here), stops the thread, closes the pipe;
      // it takes the registry's mutex.
      lock.unlock();
      s.reset();
      return st;
    }
    Registry() = s;
  }
  std::lock_guard<std::mutex> l(s->mu_);
  const uint64_t id = s->next_id_++;
  s->dumps_.emplace(id, std::move(dump));
  return Subscription(s, id);
}

FlightSignal::FlightSignal(int signo, int read_fd, int write_fd, const struct sigaction& previous)
    : signo_(signo), read_fd_(read_fd), write_fd_(write_fd), previous_(previous) {}

FlightSignal::~FlightSignal() {
  std::lock_guard<std::mutex> lock(RegistryMu());
  sigaction(signo_, &previous_, nullptr);  // no new handler calls from here on
  if (g_write_fd.load() == write_fd_) g_write_fd.store(-1);
  while (g_in_handler.load() > 0) absl::SleepFor(absl::Microseconds(10));
  if (thread_.joinable()) {
    const char b = kStop;
    while (write(write_fd_, &b, 1) != 1) {  // full (EAGAIN): the thread drains it
      if (errno != EAGAIN && errno != EINTR) break;
      absl::SleepFor(absl::Microseconds(100));
    }
    thread_.join();
  }
  close(read_fd_);
  close(write_fd_);
}

uint64_t FlightSignal::signals_served() const {
  std::lock_guard<std::mutex> lock(mu_);
  return served_;
}

void FlightSignal::Loop() {
  const std::string reason = absl::StrCat("signal ", SignalName(signo_));
  char buf[64];
  for (;;) {
    const ssize_t n = read(read_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the pipe failed: no more dumps (the destructor still joins)
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] == kStop) return;
    }
    std::unique_lock<std::mutex> lock(mu_);
    std::vector<uint64_t> ids;
    for (const auto& [id, dump] : dumps_) ids.push_back(id);
    for (uint64_t id : ids) {
      auto it = dumps_.find(id);
      if (it == dumps_.end()) continue;  // unsubscribed meanwhile
      Dump dump = it->second;
      running_ = id;
      lock.unlock();
      dump(reason);
      lock.lock();
      running_ = 0;
      idle_.notify_all();
    }
    ++served_;
  }
}

void FlightSignal::Unsubscribe(uint64_t id) {
  std::unique_lock<std::mutex> lock(mu_);
  dumps_.erase(id);
  idle_.wait(lock, [&] { return running_ != id; });
}

FlightSignal::Subscription& FlightSignal::Subscription::operator=(Subscription&& other) noexcept {
  if (this != &other) {
    Reset();
    signal_ = std::move(other.signal_);
    id_ = other.id_;
  }
  return *this;
}

FlightSignal::Subscription::~Subscription() { Reset(); }

void FlightSignal::Subscription::Reset() {
  if (signal_ == nullptr) return;
  signal_->Unsubscribe(id_);
  signal_.reset();  // the last one restores the disposition (~FlightSignal)
}

}  // namespace braid
