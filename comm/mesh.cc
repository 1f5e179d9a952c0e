#include "comm/mesh.h"

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

namespace braid {

absl::StatusOr<Mesh> MakeMesh(Group& world, int replicas, int shards) {
  if (replicas < 1 || shards < 1 || replicas * shards != world.size()) {
    return absl::InvalidArgumentError(absl::StrCat("mesh of ", replicas, " replicas x ", shards,
                                                   " shards does not match group '", world.name(),
                                                   "' of size ", world.size()));
  }
  const int r = world.rank();
  Mesh mesh;
  ASSIGN_OR_RETURN(mesh.shard,
                   world.Split(r / shards, r, absl::StrCat(world.name(), "/shard", r / shards)));
  ASSIGN_OR_RETURN(mesh.replica,
                   world.Split(r % shards, r, absl::StrCat(world.name(), "/replica", r % shards)));
  return mesh;
}

}  // namespace braid
