// Internal: a read-only memory map of a whole file, and the exact widening of stored values.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "normcheck/audit/checkpoint.hpp"

namespace normcheck::audit::detail {

// mmap(PROT_READ): pages are touched only where tensors are read, so a 10 GB checkpoint whose
// norm tensors take a few kilobytes costs a few kilobytes of I/O.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

// Widens `count` stored values of dtype F64/F32/F16/BF16 at `p` (little-endian) to binary64.
std::vector<double> widen(const std::string& dtype, const std::uint8_t* p, std::uint64_t count);
// Bytes per element of the four readable dtypes, 0 for any other.
unsigned readable_size(const std::string& dtype);

// a * b, or false when it overflows 64 bits.
inline bool mul_ok(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}

// Concrete readers over bytes that `keep` owns (a MappedFile) or that the caller owns (nullptr).
std::unique_ptr<Checkpoint> safetensors_from(const std::uint8_t* data, std::size_t size, const std::string& path,
                                             std::shared_ptr<const MappedFile> keep);
std::unique_ptr<Checkpoint> gguf_from(const std::uint8_t* data, std::size_t size, const std::string& path,
                                      std::shared_ptr<const MappedFile> keep);
std::unique_ptr<Checkpoint> open_hdf5(const std::string& path);

}  // namespace normcheck::audit::detail
