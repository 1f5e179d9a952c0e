// Blockwise quantization of a parameter shard for quantized all-gathers (DeepSpeed ZeRO++'s
// qwZ): a ParamGatherer with GathererConfig::quant sends each rank's f32 shard as one byte per
// element plus one f32 scale per `block` elements, and every rank dequantizes every rank's
// record (its own included, so all ranks compute with identical weights) into the full buffer.
// The shard itself (the optimizer's exact f32 master weights) is only read.
//
//   GatherQuant q{GatherDType::kInt8, /*block=*/4096};
//   std::vector<uint8_t> rec(QuantRecordBytes(q, n));
//   QuantizeBlocks(q, shard, n, rec.data());         // sender
//   DequantizeBlocks(q, rec.data(), n, full + off);  // every receiver, every rank's record
//
// Record layout: ceil(n / block) f32 scales (native byte order, unaligned), then n codes.
// int8: scale = max|x| / 127 over the block, code = round-half-even(x / scale) in [-127, 127],
// value = code * scale (DeepSpeed's symmetric int8). fp8: scale = max|x| / 448, code = x / scale
// rounded half-even to OCP FP8 E4M3 (saturating at 448, no NaN produced), value = e4m3 * scale.
// A block of zeroes has scale 0 and decodes to zeroes. A block holding an inf or NaN gets a NaN
// scale: all its values decode to NaN (never to a finite value).
// bf16 / f16 (cast gathers: MixedPrecisionPolicy.param_dtype's wire, as FSDP2 gathers): the
// record is the n elements rounded to nearest even (comm/half.h), no scales, `block` unused;
// decoding widens exactly, so a param_dtype cast after the gather gives the values a cast
// before a float32 gather gives, at half its bytes. The cast gathers also run on device groups,
// where the gatherer narrows and widens with its group's BufferOps::CastScale (the device cast
// kernel follows comm/half.h's rounding bit for bit: backends/nccl/kernels/bucket_convert.h);
// int8 / fp8 records are encoded on the host only.
#ifndef BRAID_SCHEDULER_GATHER_QUANT_H_
#define BRAID_SCHEDULER_GATHER_QUANT_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace braid::sched {

enum class GatherDType { kExact = 0, kInt8 = 1, kFp8E4M3 = 2, kBF16 = 3, kF16 = 4 };
absl::string_view GatherDTypeName(GatherDType t);  // "exact", "int8", "fp8_e4m3", "bf16", "f16"
bool IsCastGather(GatherDType t);                  // bf16 or f16: no scales

struct GatherQuant {
  GatherDType dtype = GatherDType::kExact;
  // Elements per scale (>= 1). DeepSpeed's qwZ quantizer aims at groups of 4k-8k elements
  // ("the optimal size is 4k"); 4096 costs 0.1 % in scales.
  int block = 4096;
};

// Bytes of one record of n elements (scales, then codes; cast gathers: 2 n).
size_t QuantRecordBytes(const GatherQuant& q, size_t n);
void QuantizeBlocks(const GatherQuant& q, const float* x, size_t n, uint8_t* record);
void DequantizeBlocks(const GatherQuant& q, const uint8_t* record, size_t n, float* out);

// E4M3 (bias 7, no infinities, 0x7f / 0xff NaN): the code nearest to x (ties to even),
// saturating to +-448; and a code's value.
uint8_t Fp8E4M3FromFloat(float x);
float Fp8E4M3ToFloat(uint8_t code);

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_GATHER_QUANT_H_
