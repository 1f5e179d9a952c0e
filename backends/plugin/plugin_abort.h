// The `plugin` backend's abort domain (comm/abort_domain.h): a plugin's ranks fail together, as
// the built-in backends' do, although ABI v1 has no abort entry.
//
//   auto aborter = PluginAborter::Create(lib_name);        // one per PluginBackend
//   ASSIGN_OR_RETURN(PluginComm world, PluginComm::CreateWorld(ctx, rank));
//   if (!(*aborter)->Register(world.gate())) { ...the job aborted: refuse... }
//
// How. The only way ABI v1 gives a host to end a plugin's operations in flight is
// comm_destroy: it calls every pending launch's callback (with an error) before it returns,
// and peers still using the comm "should get an error rather than a hang". So when the domain
// aborts (a plugin operation failed on any rank of this process, or Group::AbortJob), the
// aborter's thread closes every registered comm's gate and destroys the comm, as torch's
// ProcessGroupNCCL ends its communicators with ncclCommAbort. Ranks hosted in this process share
// the domain, so they fail within milliseconds; ranks in other processes learn it from their
// plugin (their operations on the destroyed comms fail, which aborts their own domain).
//
// Contract. A closed gate refuses new entries (Enter is false); a comm is destroyed exactly
// once, by the aborter (after the last call inside it left: a comm_split waiting for peers
// delays only its own comm) or by its owner (~PluginComm, which waits for an abort's destroy
// in progress). Operations failed once the job aborted report the domain's cause
// (plugin_group.cc). The domain's listener only wakes the thread: it
// runs under the domain's lock on whichever thread aborted, possibly one the plugin is
// about to wait for in comm_destroy.
#ifndef BRAID_BACKENDS_PLUGIN_PLUGIN_ABORT_H_
#define BRAID_BACKENDS_PLUGIN_PLUGIN_ABORT_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/abort_domain.h"

namespace braid::plugin {

// The calls in flight on one comm, and its single destruction.
class CommGate {
 public:
  // `destroy` calls comm_destroy (once, by whoever ends the comm).
  explicit CommGate(std::function<void()> destroy) : destroy_(std::move(destroy)) {}
  CommGate(const CommGate&) = delete;
  CommGate& operator=(const CommGate&) = delete;

  // Before a table entry on the comm: false once the gate is closed (do not call it).
  bool Enter();
  // After it; the last call out of a gate the aborter closed destroys the comm.
  void Leave();
  // The aborter: closes the gate, destroys the comm now when no call is inside.
  void Abort();
  // The owner: closes the gate and destroys the comm unless someone did (waits for calls
  // inside and for a destroy in progress).
  void Close();

 private:
  void DestroyOnce(std::unique_lock<std::mutex>& lock);

  const std::function<void()> destroy_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int inside_ = 0;
  bool closed_ = false;
  bool aborted_ = false;
  bool destroying_ = false;
  bool destroyed_ = false;
};

class PluginAborter {
 public:
  // Starts the thread that ends the comms (ResourceExhausted when it cannot).
  static absl::StatusOr<std::shared_ptr<PluginAborter>> Create(std::string plugin_name);
  ~PluginAborter();  // joins the thread
  PluginAborter(const PluginAborter&) = delete;
  PluginAborter& operator=(const PluginAborter&) = delete;

  const std::shared_ptr<AbortDomain>& domain() const { return domain_; }
  // A live comm joins the domain; false (nothing registered) when the job has aborted.
  bool Register(const std::shared_ptr<CommGate>& gate);

 private:
  explicit PluginAborter(std::string plugin_name);
  void Loop();

  const std::string plugin_name_;
  const std::shared_ptr<AbortDomain> domain_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::weak_ptr<CommGate>> gates_;  // guarded by mu_
  bool aborting_ = false;                       // guarded by mu_
  bool stop_ = false;                           // guarded by mu_
  std::thread thread_;
  AbortDomain::Subscription sub_;  // reset first in the destructor
};

}  // namespace braid::plugin

#endif  // BRAID_BACKENDS_PLUGIN_PLUGIN_ABORT_H_
