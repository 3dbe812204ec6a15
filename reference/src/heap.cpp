#include "normcheck/reference/heap.hpp"

#include <cstdlib>  // defines __GLIBC__ (via <features.h>) where the C library is glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace normcheck::ref {

bool keep_freed_memory() noexcept {
#if defined(__GLIBC__)
  constexpr int kOneGiB = 1 << 30;
  // Both calls also turn off glibc's dynamic thresholds (mallopt(3)).
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, kOneGiB) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, kOneGiB) == 1;
  return mmap_set && trim_set;
#else
  return false;
#endif
}

}  // namespace normcheck::ref
