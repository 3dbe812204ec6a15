// keep_freed_memory(): glibc serves a case-sized array from the heap and keeps it for reuse,
// instead of mapping fresh pages from the kernel for every output and dialect (heap.hpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "normcheck/reference/heap.hpp"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace normcheck::ref {
namespace {

#if defined(__GLIBC__)
// 16 MiB: far above glibc's default mmap threshold (128 KiB) and its dynamic ceiling (32 MiB
// is the most it rises to, and only after such a block was freed), so without the policy the
// first allocation of this size is always a fresh mapping.
constexpr std::size_t kCaseSized = std::size_t{16} << 20;

TEST(HeapPolicy, CaseSizedArraysComeFromTheHeapAndAreKept) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer replaces glibc's allocator: mallopt and mallinfo2 do not describe it";
#endif
  ASSERT_TRUE(keep_freed_memory());
  const std::size_t mapped_before = mallinfo2().hblkhd;
  void* a = std::malloc(kCaseSized);
  ASSERT_NE(a, nullptr);
  std::memset(a, 1, kCaseSized);
  // Not a mapping of its own: the mapped bytes did not grow by the array.
  EXPECT_LT(mallinfo2().hblkhd, mapped_before + kCaseSized);
  std::free(a);
  // Freed, it stays in the heap for the next case instead of going back to the kernel.
  EXPECT_GE(mallinfo2().fordblks, kCaseSized);
}
#else
TEST(HeapPolicy, DoesNothingWithoutGlibc) { EXPECT_FALSE(keep_freed_memory()); }
#endif

}  // namespace
}  // namespace normcheck::ref
