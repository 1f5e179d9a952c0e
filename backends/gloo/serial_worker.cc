#include "backends/gloo/serial_worker.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "comm/thread_start.h"

namespace braid::gloo_backend {

absl::StatusOr<std::unique_ptr<SerialWorker>> SerialWorker::Start(absl::string_view what) {
  std::unique_ptr<SerialWorker> w(new SerialWorker());
  SerialWorker* p = w.get();
  RETURN_IF_ERROR(
      StartThread(&p->thread_, absl::StrCat("the gloo worker of ", what), [p] { p->Loop(); }));
  return w;
}

SerialWorker::~SerialWorker() {
  std::deque<Task> cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cancelled.swap(queue_);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();  // not when Start could not start it
  for (Task& t : cancelled) t(false);
}

void SerialWorker::Post(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      queue_.push_back(std::move(task));
      task = nullptr;
    }
  }
  if (task) {
    task(false);  // posted during destruction: cancelled at once
    return;
  }
  cv_.notify_one();
}

void SerialWorker::Loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task(true);
  }
}

}  // namespace braid::gloo_backend
