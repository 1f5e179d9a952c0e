// CRC-32C (Castagnoli), the checksum of the optimizer's state files (optim/state_file.h).
//
//   uint32_t crc = internal::Crc32c(0, header, header_bytes);
//   crc = internal::Crc32c(crc, payload, payload_bytes);   // continues the same checksum
//
// Computed in software (slicing-by-8, tables built at compile time) so a state file needs no
// library and no CPU feature to be written or verified. It catches every burst error up to 32
// bits and random corruption with probability 1 - 2^-32: what a torn or bit-rotted checkpoint
// needs. Not a cryptographic hash.
#ifndef BRAID_OPTIM_CRC32C_H_
#define BRAID_OPTIM_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace braid::optim::internal {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `n` bytes, continuing from `crc`
// (start with 0). Exposed for tests: Crc32c(0, "123456789", 9) == 0xE3069283.
uint32_t Crc32c(uint32_t crc, const void* data, size_t n);

}  // namespace braid::optim::internal

#endif  // BRAID_OPTIM_CRC32C_H_
