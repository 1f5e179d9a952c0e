// Mesh: the world split into replicas x shards, as HSDP uses it.
//
//   ASSIGN_OR_RETURN(Mesh mesh, MakeMesh(*world, /*replicas=*/2, /*shards=*/4));
//   // world rank r is shard r % 4 of replica r / 4:
//   //   mesh.shard   = the 4 ranks of r's replica   (reduce-scatter / all-gather group)
//   //   mesh.replica = the 2 ranks holding r's shard (all-reduce group)
//
// Contract: collective over `world`: two Splits (shard, then replica), in this order on every
// rank (the group rank-order contract, comm/group.h).
#ifndef BRAID_COMM_MESH_H_
#define BRAID_COMM_MESH_H_

#include <memory>

#include "absl/status/statusor.h"
#include "comm/group.h"

namespace braid {

struct Mesh {
  std::unique_ptr<Group> shard;
  std::unique_ptr<Group> replica;
};

// InvalidArgument unless replicas * shards == world.size().
absl::StatusOr<Mesh> MakeMesh(Group& world, int replicas, int shards);

}  // namespace braid

#endif  // BRAID_COMM_MESH_H_
