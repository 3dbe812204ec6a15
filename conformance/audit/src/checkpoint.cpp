// Opening a checkpoint by its first bytes; the memory map; exact widening of stored values.
#include <fcntl.h>
#include <fmt/core.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "mapped.hpp"

namespace normcheck::audit {

const TensorInfo* Checkpoint::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

double f16_to_double(std::uint16_t bits) {
  const int sign = bits >> 15, exp = (bits >> 10) & 0x1f, mant = bits & 0x3ff;
  double v;
  if (exp == 0x1f)
    v = mant ? std::nan("") : INFINITY;
  else if (exp == 0)
    v = std::ldexp(mant, -24);
  else
    v = std::ldexp(mant + 1024, exp - 25);
  return sign ? -v : v;
}

double bf16_to_double(std::uint16_t bits) {
  const std::uint32_t w = std::uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}

namespace detail {

MappedFile::MappedFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(path, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw CheckpointError(path, "not a regular file");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ == 0) {
    ::close(fd);
    throw CheckpointError(path, "empty file");
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw CheckpointError(path, fmt::format("cannot map: {}", std::strerror(errno)));
  data_ = static_cast<const std::uint8_t*>(p);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::uint8_t*>(data_), size_);
}

unsigned readable_size(const std::string& dtype) {
  if (dtype == "F64") return 8;
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

std::vector<double> widen(const std::string& dtype, const std::uint8_t* p, std::uint64_t count) {
  std::vector<double> out(count);
  const unsigned size = readable_size(dtype);
  for (std::uint64_t i = 0; i < count; ++i, p += size) {
    if (size == 8) {
      std::memcpy(&out[i], p, 8);
    } else if (size == 4) {
      float f;
      std::memcpy(&f, p, 4);
      out[i] = f;
    } else {
      const std::uint16_t bits = static_cast<std::uint16_t>(p[0] | (p[1] << 8));
      out[i] = dtype == "F16" ? f16_to_double(bits) : bf16_to_double(bits);
    }
  }
  return out;
}

}  // namespace detail

std::unique_ptr<Checkpoint> open_checkpoint(const std::string& path) {
  std::uint8_t head[16] = {};
  std::size_t got = 0;
  {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw CheckpointError(path, fmt::format("cannot open: {}", std::strerror(errno)));
    const ssize_t n = ::read(fd, head, sizeof head);
    ::close(fd);
    if (n < 0) throw CheckpointError(path, fmt::format("cannot read: {}", std::strerror(errno)));
    got = static_cast<std::size_t>(n);
  }
  static const std::uint8_t kHdf5[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  if (got >= 8 && std::memcmp(head, kHdf5, 8) == 0) return detail::open_hdf5(path);
  auto map = std::make_shared<const detail::MappedFile>(path);
  if (got >= 4 && std::memcmp(head, "GGUF", 4) == 0) return detail::gguf_from(map->data(), map->size(), path, map);
  if (got >= 9 && head[8] == '{') return detail::safetensors_from(map->data(), map->size(), path, map);
  throw CheckpointError(path, "not a checkpoint this audit reads (no GGUF magic, no HDF5 signature, "
                              "no safetensors header: 8-byte length then '{')");
}

std::unique_ptr<Checkpoint> parse_safetensors(const std::uint8_t* data, std::size_t size, const std::string& name) {
  return detail::safetensors_from(data, size, name, nullptr);
}
std::unique_ptr<Checkpoint> parse_gguf(const std::uint8_t* data, std::size_t size, const std::string& name) {
  return detail::gguf_from(data, size, name, nullptr);
}

}  // namespace normcheck::audit
