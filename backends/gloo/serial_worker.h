// SerialWorker: one thread that runs a group's collectives one after another, in the order they
// were posted, so Group::Launch never blocks on peers (Gloo's calls are blocking).
//
//   ASSIGN_OR_RETURN(std::unique_ptr<SerialWorker> worker, SerialWorker::Start("group 'world'"));
//   worker->Post([work, args](bool run) {
//     if (!run) { work->Complete(absl::CancelledError("group destroyed")); return; }
//     work->Complete(RunCollective(...));
//   });
//
// Contract: tasks run in Post order on the worker's thread (the rank-order contract carries
// over: collectives reach Gloo in the order the caller issued them). Destruction cancels the
// tasks not yet started (each is called once with run == false) and joins the thread after the
// running one returns; every Gloo call is bounded by its timeout, so that join is bounded too.
#ifndef BRAID_BACKENDS_GLOO_SERIAL_WORKER_H_
#define BRAID_BACKENDS_GLOO_SERIAL_WORKER_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace braid::gloo_backend {

class SerialWorker {
 public:
  using Task = std::function<void(bool run)>;

  // ResourceExhausted naming `what` when the thread cannot be started.
  static absl::StatusOr<std::unique_ptr<SerialWorker>> Start(absl::string_view what);
  ~SerialWorker();
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  void Post(Task task);

 private:
  SerialWorker() = default;
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;  // guarded by mu_
  bool stop_ = false;       // guarded by mu_
  std::thread thread_;      // last: started after the fields above exist
};

}  // namespace braid::gloo_backend

#endif  // BRAID_BACKENDS_GLOO_SERIAL_WORKER_H_
