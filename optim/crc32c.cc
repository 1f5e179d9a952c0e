// CRC-32C, slicing-by-8; see crc32c.h.
#include "optim/crc32c.h"

#include <cstring>

namespace braid::optim::internal {

// The 8-byte loads below are read as little-endian words.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "Crc32c assumes a little-endian host");

namespace {

struct CrcTables {
  uint32_t t[8][256];
};

constexpr CrcTables MakeCrcTables() {
  CrcTables tables{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    tables.t[0][i] = c;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t prev = tables.t[k - 1][i];
      tables.t[k][i] = (prev >> 8) ^ tables.t[0][prev & 0xff];
    }
  }
  return tables;
}

// Computed at compile time: immutable, so no initialization order or thread-safety questions.
constexpr CrcTables kCrc = MakeCrcTables();

}  // namespace

uint32_t Crc32c(uint32_t crc, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian host (asserted above)
    w ^= crc;
    crc = kCrc.t[7][w & 0xff] ^ kCrc.t[6][(w >> 8) & 0xff] ^ kCrc.t[5][(w >> 16) & 0xff] ^
          kCrc.t[4][(w >> 24) & 0xff] ^ kCrc.t[3][(w >> 32) & 0xff] ^ kCrc.t[2][(w >> 40) & 0xff] ^
          kCrc.t[1][(w >> 48) & 0xff] ^ kCrc.t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    crc = kCrc.t[0][(crc ^ *p) & 0xff] ^ (crc >> 8);
    ++p;
    --n;
  }
  return ~crc;
}

}  // namespace braid::optim::internal
