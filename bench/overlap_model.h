// The simulated model of bench/overlap: GPT-2-small parameter shapes, scaled down.
//
//   OverlapModel m = Gpt2LikeModel(/*blocks=*/12, /*scale=*/0.25);
//   // m.params: ParamSpecs in registration (= forward) order, ids 0..n-1, f32, CPU
//   // m.layers: forward order; a backward runs them last to first
//
// Layers and their parameters (d = 768, GPT-2 small at scale 1):
//   "embeddings"  wte 50257 x d, wpe 1024 x d
//   "block k"     ln_1 (d + d), attn.c_attn d x 3d + 3d, attn.c_proj d x d + d,
//                 ln_2 (d + d), mlp.c_fc d x 4d + 4d, mlp.c_proj 4d x d + d
//   the last block also holds ln_f (d + d), the final layernorm.
// 12 blocks give 124,439,808 parameters (GPT-2 small with its LM head tied to wte). Every
// parameter's element count is multiplied by `scale` (at least 1 element), so the layer
// structure and the relative sizes stay those of the real model.
//
// Backward order matters for overlap: the embeddings are the first layer of the forward, so
// their gradients (a third of all bytes, wte alone) are complete only at the very end of the
// backward (with a tied LM head, wte's gradient is finished by the embedding lookup's backward
// too). Their reduction can never overlap compute.
#ifndef BRAID_BENCH_OVERLAP_MODEL_H_
#define BRAID_BENCH_OVERLAP_MODEL_H_

#include <cstddef>
#include <string>
#include <vector>

#include "scheduler/bucket_plan.h"

namespace braid::bench {

struct OverlapLayer {
  std::string name;
  std::vector<int> params;  // indices into OverlapModel::params, registration order
  size_t elems = 0;         // total gradient elements of the layer
};

struct OverlapModel {
  std::vector<sched::ParamSpec> params;  // id == index
  std::vector<OverlapLayer> layers;      // forward order

  size_t elems() const;
};

// `blocks` >= 1, `scale` > 0.
OverlapModel Gpt2LikeModel(int blocks, double scale);

}  // namespace braid::bench

#endif  // BRAID_BENCH_OVERLAP_MODEL_H_
