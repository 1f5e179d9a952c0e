#include "backends/plugin/plugin_abort.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/thread_start.h"

namespace braid::plugin {

bool CommGate::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  ++inside_;
  return true;
}

void CommGate::Leave() {
  std::unique_lock<std::mutex> lock(mu_);
  if (--inside_ > 0) return;
  cv_.notify_all();
  if (aborted_) DestroyOnce(lock);
}

void CommGate::Abort() {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  aborted_ = true;
  if (inside_ == 0) DestroyOnce(lock);
}

void CommGate::Close() {
  std::unique_lock<std::mutex> lock(mu_);
  closed_ = true;
  cv_.wait(lock, [this] { return inside_ == 0; });
  DestroyOnce(lock);
  cv_.wait(lock, [this] { return destroyed_; });
}

void CommGate::DestroyOnce(std::unique_lock<std::mutex>& lock) {
  if (destroying_) return;
  destroying_ = true;
  lock.unlock();
  destroy_();  // runs every pending callback (not under mu_: they may launch again)
  lock.lock();
  destroyed_ = true;
  cv_.notify_all();
}

absl::StatusOr<std::shared_ptr<PluginAborter>> PluginAborter::Create(std::string plugin_name) {
  std::shared_ptr<PluginAborter> a(new PluginAborter(std::move(plugin_name)));
  PluginAborter* self = a.get();
  const absl::Status started =
      StartThread(&a->thread_, absl::StrCat("plugin '", a->plugin_name_, "' abort domain"),
                  [self] { self->Loop(); });
  if (!started.ok()) return started;
  a->sub_ = a->domain_->Subscribe([self](const absl::Status&) {
    std::lock_guard<std::mutex> lock(self->mu_);
    self->aborting_ = true;
    self->cv_.notify_all();
  });
  return a;
}

PluginAborter::PluginAborter(std::string plugin_name)
    : plugin_name_(std::move(plugin_name)), domain_(AbortDomain::Create()) {}

PluginAborter::~PluginAborter() {
  sub_.Reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

bool PluginAborter::Register(const std::shared_ptr<CommGate>& gate) {
  std::lock_guard<std::mutex> lock(mu_);
  if (domain_->aborted()) return false;
  std::vector<std::weak_ptr<CommGate>> live;
  for (std::weak_ptr<CommGate>& g : gates_) {
    if (!g.expired()) live.push_back(std::move(g));
  }
  live.push_back(gate);
  gates_ = std::move(live);
  return true;
}

void PluginAborter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || aborting_; });
    if (stop_) return;
    aborting_ = false;
    std::vector<std::shared_ptr<CommGate>> gates;
    for (const std::weak_ptr<CommGate>& g : gates_) {
      if (std::shared_ptr<CommGate> s = g.lock()) gates.push_back(std::move(s));
    }
    gates_.clear();  // Register refuses from now on: the domain has aborted
    lock.unlock();
    for (const std::shared_ptr<CommGate>& g : gates) g->Abort();
    gates.clear();
    lock.lock();
  }
}

}  // namespace braid::plugin
