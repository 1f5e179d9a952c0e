// Counting replacement of the global operator new / delete, for benchmarks and tests that
// assert "no heap allocation in steady state". Linking this library (alwayslink) replaces
// every replaceable form in the binary, so nothing bypasses the count; the counters are plain
// atomics and a trivially-initialized thread_local: neither allocates. malloc() called directly
// (e.g. std::aligned_alloc) is not counted.
#ifndef BRAID_BENCH_ALLOC_COUNTER_H_
#define BRAID_BENCH_ALLOC_COUNTER_H_

#include <cstdint>

namespace braid::alloc_counter {

uint64_t Allocs();        // operator new calls so far, every thread
uint64_t AllocBytes();    // bytes requested by them
uint64_t ThreadAllocs();  // operator new calls so far on the calling thread

}  // namespace braid::alloc_counter

#endif  // BRAID_BENCH_ALLOC_COUNTER_H_
