#include "bench/overlap_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace braid::bench {
namespace {

constexpr size_t kVocab = 50257;
constexpr size_t kContext = 1024;
constexpr size_t kWidth = 768;

class Builder {
 public:
  explicit Builder(double scale, OverlapModel* m) : scale_(scale), m_(m) {}

  void BeginLayer(std::string name) { m_->layers.push_back(OverlapLayer{std::move(name), {}, 0}); }

  void Add(std::string name, size_t full_count) {
    const size_t count =
        std::max<size_t>(1, static_cast<size_t>(std::llround(full_count * scale_)));
    const int index = static_cast<int>(m_->params.size());
    m_->params.push_back(
        sched::ParamSpec{index, count, DType::kF32, Device::Cpu(), std::move(name)});
    m_->layers.back().params.push_back(index);
    m_->layers.back().elems += count;
  }

 private:
  double scale_;
  OverlapModel* m_;
};

}  // namespace

size_t OverlapModel::elems() const {
  size_t n = 0;
  for (const sched::ParamSpec& p : params) n += p.count;
  return n;
}

OverlapModel Gpt2LikeModel(int blocks, double scale) {
  OverlapModel m;
  Builder b(scale, &m);
  const size_t d = kWidth;
  b.BeginLayer("embeddings");
  b.Add("wte", kVocab * d);
  b.Add("wpe", kContext * d);
  for (int k = 0; k < blocks; ++k) {
    b.BeginLayer(absl::StrCat("block ", k));
    const std::string h = absl::StrCat("h.", k, ".");
    b.Add(h + "ln_1.weight", d);
    b.Add(h + "ln_1.bias", d);
    b.Add(h + "attn.c_attn.weight", d * 3 * d);
    b.Add(h + "attn.c_attn.bias", 3 * d);
    b.Add(h + "attn.c_proj.weight", d * d);
    b.Add(h + "attn.c_proj.bias", d);
    b.Add(h + "ln_2.weight", d);
    b.Add(h + "ln_2.bias", d);
    b.Add(h + "mlp.c_fc.weight", d * 4 * d);
    b.Add(h + "mlp.c_fc.bias", 4 * d);
    b.Add(h + "mlp.c_proj.weight", 4 * d * d);
    b.Add(h + "mlp.c_proj.bias", d);
  }
  b.Add("ln_f.weight", d);
  b.Add("ln_f.bias", d);
  return m;
}

}  // namespace braid::bench
