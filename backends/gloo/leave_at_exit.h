// The leave notice of a gloo world that is still alive when its process ends (a C program
// returning from main, or calling exit(), without braid_world_destroy): peers learn that this
// rank left, naming it, as they do when the world is destroyed (gloo_abort.h), instead of
// failing on a closed connection that names no rank. The mpi backend does the same for its
// runtime (backends/mpi/mpi_runtime.cc, LeaveAtExit).
//
//   ASSIGN_OR_RETURN(auto link, GlooAbortLink::Start(store, rank, size, report));
//   NoticeLeaveAtExit(link);  // GlooAbortLink::Start does this for every link
//
// Contract: one std::atexit handler per process, registered by the first call; at exit it calls
// GlooAbortLink::LeaveAtExit on every registered link still alive (a destroyed world already
// sent its notice). A forked child never sends its parent's notices (each link is kept with the
// id of the process that made it: a child shares its parent's store connection). No host
// handler is replaced; nothing runs for a process that ends by a signal or _exit.
#ifndef BRAID_BACKENDS_GLOO_LEAVE_AT_EXIT_H_
#define BRAID_BACKENDS_GLOO_LEAVE_AT_EXIT_H_

#include <memory>

namespace braid::gloo_backend {

class GlooAbortLink;

// Registers `link` for the exit handler (see the header). Thread-safe; never fails (the
// registration of the handler itself failing is logged: the peers then see the closed
// connection, as before).
void NoticeLeaveAtExit(const std::shared_ptr<GlooAbortLink>& link);

}  // namespace braid::gloo_backend

#endif  // BRAID_BACKENDS_GLOO_LEAVE_AT_EXIT_H_
