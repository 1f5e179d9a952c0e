// Mesh: the world split into replicas x shards, as HSDP uses it.
//
//   ASSIGN_OR_RETURN(Mesh mesh, MakeMesh(*world, /*replicas=*/2, /*shards=*/4));
//   // world rank r is shard r % 4 of replica r / 4:
//   //   mesh.shard   = the 4 ranks of r's replica   (reduce-scatter / all-gather group)
//   //   mesh.replica = the 2 ranks holding r's shard (all-reduce group)
//
// Collective over `world` (two Splits, in this order on every rank).
#ifndef BRAID_SCHEDULER_MESH_H_
#define BRAID_SCHEDULER_MESH_H_

#include <memory>

#include "absl/status/statusor.h"
#include "comm/group.h"

namespace braid::sched {

struct Mesh {
  std::unique_ptr<Group> shard;
  std::unique_ptr<Group> replica;
};

// InvalidArgument unless replicas * shards == world.size().
absl::StatusOr<Mesh> MakeMesh(Group& world, int replicas, int shards);

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_MESH_H_
