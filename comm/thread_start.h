// StartThread: the one way library code starts a thread, with failure as a Status.
//
//   std::thread worker_;
//   RETURN_IF_ERROR(StartThread(&worker_, "group 'world' worker", [this] { Loop(); }));
//
// std::thread's constructor throws std::system_error when the system cannot create a thread
// (EAGAIN: RLIMIT_NPROC, the kernel's thread limit, no memory for the stack). Thrown inside a
// constructor whose members already own threads, a destructor, a noexcept function or one of
// Braid's own threads, that terminates the host process. StartThread catches it and returns
// ResourceExhausted "could not start a thread for <what>: <system message>", leaving `*thread`
// as it was (not joinable), so the caller can unwind what it started and report the status.
#ifndef BRAID_COMM_THREAD_START_H_
#define BRAID_COMM_THREAD_START_H_

#include <system_error>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace braid {

template <typename F>
absl::Status StartThread(std::thread* thread, absl::string_view what, F&& fn) {
  try {
    *thread = std::thread(std::forward<F>(fn));
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("could not start a thread for ", what, ": ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace braid

#endif  // BRAID_COMM_THREAD_START_H_
