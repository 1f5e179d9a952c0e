#include "scheduler/partition.h"

#include <algorithm>

namespace braid::sched {

std::vector<PartRange> SplitReduction(size_t count, size_t esize, int ranks, size_t credit_bytes) {
  const size_t n = static_cast<size_t>(std::max(1, ranks));
  const size_t total = count * esize * n;
  if (credit_bytes == 0 || total <= credit_bytes || count == 0 || esize == 0)
    return {PartRange{0, count}};
  const size_t align = std::max<size_t>(1, kPartitionAlignBytes / esize);
  // The largest aligned length within the credit (at least one aligned unit)...
  size_t max_len = credit_bytes / (esize * n) / align * align;
  max_len = std::max(max_len, align);
  const size_t parts = (count + max_len - 1) / max_len;
  // ...then as equal as the alignment allows (never longer than max_len).
  size_t len = (count + parts - 1) / parts;
  len = (len + align - 1) / align * align;
  std::vector<PartRange> out;
  out.reserve(parts);
  for (size_t lo = 0; lo < count; lo += len)
    out.push_back(PartRange{lo, std::min(count, lo + len)});
  return out;
}

}  // namespace braid::sched
