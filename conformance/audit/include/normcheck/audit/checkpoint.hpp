// Checkpoint readers for the audit: safetensors, GGUF (v2, v3) and HDF5 (Keras layouts and flat
// h5py state dicts). Opening a checkpoint reads and validates its header only (every length,
// offset, count and dtype checked before use); tensor data is read on demand, one tensor at a
// time, from a read-only memory map, so a checkpoint of any size costs what its norm tensors cost.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace normcheck::audit {

// A checkpoint that cannot be read as what it claims to be (truncated, lengths beyond the file,
// overlapping data, unknown dtype ...): the message names the file and the problem. The CLI
// exits 2 on it.
class CheckpointError : public std::runtime_error {
 public:
  CheckpointError(const std::string& where, const std::string& message)
      : std::runtime_error(where.empty() ? message : where + ": " + message) {}
};

struct TensorInfo {
  std::string name;         // normalized name: '/' and ':0' of HDF5/Keras turned into HF-style dots
  std::string stored_name;  // the name as stored in the file
  std::string dtype;        // "F64", "F32", "F16", "BF16", or the format's own name ("Q4_K", "I64" ...)
  std::vector<std::uint64_t> shape;  // row-major (GGUF's ne[] reversed)
  std::uint64_t elements = 0;
  bool readable = false;    // values can be read as numbers (F64/F32/F16/BF16)
  std::uint64_t offset = 0; // GGUF: the file offset of the tensor's first byte (0 in the other formats)
};

class Checkpoint {
 public:
  virtual ~Checkpoint() = default;
  virtual const std::string& format() const = 0;  // "safetensors", "gguf", "hdf5"
  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // safetensors: "__metadata__"; GGUF: the key/value pairs (long arrays as {"array": type, "count": n});
  // HDF5: root attributes that are strings or numbers.
  const nlohmann::json& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;
  // The values of one tensor, widened exactly to binary64 (all supported dtypes are subsets).
  // Throws CheckpointError for an unreadable dtype.
  virtual std::vector<double> read(const TensorInfo& t) const = 0;

 protected:
  std::string path_;
  std::vector<TensorInfo> tensors_;
  nlohmann::json metadata_ = nlohmann::json::object();
};

// Opens by content (the first bytes), not by extension: GGUF magic, HDF5 signature, or a
// safetensors header length followed by '{'.
std::unique_ptr<Checkpoint> open_checkpoint(const std::string& path);

// Readers over bytes already in memory (the fuzz targets; `name` is used in messages). The
// bytes must outlive the returned checkpoint.
std::unique_ptr<Checkpoint> parse_safetensors(const std::uint8_t* data, std::size_t size, const std::string& name);
std::unique_ptr<Checkpoint> parse_gguf(const std::uint8_t* data, std::size_t size, const std::string& name);
std::unique_ptr<Checkpoint> parse_hdf5_image(const std::uint8_t* data, std::size_t size, const std::string& name);

// Exact widening of the storage encodings (little-endian bytes).
double f16_to_double(std::uint16_t bits);
double bf16_to_double(std::uint16_t bits);

}  // namespace normcheck::audit
