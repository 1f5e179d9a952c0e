// BRAID_CHECK: for broken internal invariants only (bad input returns a Status instead).
#ifndef BRAID_COMM_CHECK_H_
#define BRAID_COMM_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define BRAID_CHECK(cond)                                                                 \
  do {                                                                                    \
    if (__builtin_expect(!(cond), 0)) {                                                   \
      std::fprintf(stderr, "%s:%d: BRAID_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

#endif  // BRAID_COMM_CHECK_H_
