#include "backends/gloo/leave_at_exit.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "backends/gloo/gloo_abort.h"
#include "comm/logging.h"

namespace braid::gloo_backend {
namespace {

// The process's live links. Leaked, so it is still there when the exit handler runs (static
// destructors of objects made after the handler was registered run before it).
struct ExitRegistry {
  struct Entry {
    std::weak_ptr<GlooAbortLink> link;
    pid_t pid = 0;  // the process that registered it (a forked child has another)
  };
  std::mutex mu;
  std::vector<Entry> links;  // guarded by mu
};

ExitRegistry& Registry() {
  static ExitRegistry* registry = new ExitRegistry;
  return *registry;
}

void LeaveAtExit() {
  ExitRegistry& r = Registry();
  const pid_t self = ::getpid();
  std::vector<std::shared_ptr<GlooAbortLink>> live;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    for (const ExitRegistry::Entry& e : r.links) {
      // A forked child skips its parent's links: their threads did not survive the fork, and
      // their store connection is the parent's.
      if (e.pid != self) continue;
      if (auto link = e.link.lock()) live.push_back(std::move(link));
    }
  }
  for (const auto& link : live) link->LeaveAtExit();
  // Dropping `live` cannot destroy a link here unless its world went meanwhile, which joins
  // the link's watcher as a destroy would.
}

}  // namespace

void NoticeLeaveAtExit(const std::shared_ptr<GlooAbortLink>& link) {
  ExitRegistry& r = Registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.links.erase(std::remove_if(r.links.begin(), r.links.end(),
                                 [](const ExitRegistry::Entry& e) { return e.link.expired(); }),
                  r.links.end());
    r.links.push_back(ExitRegistry::Entry{link, ::getpid()});
  }
  static const bool registered = std::atexit(&LeaveAtExit) == 0;
  if (!registered) {
    Log().warn("gloo backend: could not register the leave notice at process exit (atexit)");
  }
}

}  // namespace braid::gloo_backend
