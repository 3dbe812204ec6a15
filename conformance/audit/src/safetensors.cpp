// safetensors: an 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
// data; offsets are relative to the byte after the header. Everything is checked before use:
// N against the file and against the format's 100 MB limit, each shape's element count for
// overflow, each dtype against the known names, byte extents against dtype x elements and the
// data area, and extents against each other (no overlap).
#include <fmt/core.h>

#include <algorithm>
#include <map>

#include "mapped.hpp"

namespace normcheck::audit::detail {
namespace {

// Element sizes of every dtype the safetensors format defines; any other name is an error.
const std::map<std::string, unsigned>& dtype_sizes() {
  static const std::map<std::string, unsigned> m{
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
      {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  return m;
}

class Safetensors final : public Checkpoint {
 public:
  Safetensors(const std::uint8_t* data, std::size_t size, const std::string& path,
              std::shared_ptr<const MappedFile> keep)
      : data_(data), size_(size), keep_(std::move(keep)) {
    path_ = path;
    parse();
  }
  const std::string& format() const override {
    static const std::string f = "safetensors";
    return f;
  }
  std::vector<double> read(const TensorInfo& t) const override {
    const auto it = begin_.find(t.stored_name);
    if (it == begin_.end() || !t.readable)
      throw CheckpointError(path_, fmt::format("tensor {}: dtype {} cannot be read as numbers", t.name, t.dtype));
    return widen(t.dtype, data_ + data_start_ + it->second, t.elements);
  }

 private:
  void parse() {
    if (size_ < 8) throw CheckpointError(path_, fmt::format("truncated: {} bytes, less than the 8-byte header length", size_));
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | data_[i];
    constexpr std::uint64_t kMaxHeader = 100'000'000;  // the limit of the reference implementation
    if (n > size_ - 8)
      throw CheckpointError(path_, fmt::format("header length {} runs beyond the file ({} bytes)", n, size_));
    if (n > kMaxHeader) throw CheckpointError(path_, fmt::format("header length {} exceeds the format's limit of 100 MB", n));
    if (n < 2) throw CheckpointError(path_, fmt::format("header length {} cannot hold a JSON object", n));
    data_start_ = 8 + n;
    const std::uint64_t data_size = size_ - data_start_;
    nlohmann::json h;
    try {
      h = nlohmann::json::parse(data_ + 8, data_ + 8 + n);
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError(path_, fmt::format("header is not valid JSON: {}", e.what()));
    }
    if (!h.is_object()) throw CheckpointError(path_, "header is not a JSON object");
    struct Extent {
      std::uint64_t begin, end;
      std::string name;
    };
    std::vector<Extent> extents;
    for (const auto& [name, v] : h.items()) {
      if (name == "__metadata__") {
        if (!v.is_object()) throw CheckpointError(path_, "__metadata__ is not an object");
        metadata_ = v;
        continue;
      }
      const std::string where = "tensor " + name;
      if (!v.is_object()) throw CheckpointError(path_, where + ": entry is not an object");
      if (!v.contains("dtype") || !v["dtype"].is_string()) throw CheckpointError(path_, where + ": no dtype string");
      const std::string dtype = v["dtype"].get<std::string>();
      const auto ds = dtype_sizes().find(dtype);
      if (ds == dtype_sizes().end()) throw CheckpointError(path_, fmt::format("{}: unknown dtype '{}'", where, dtype));
      if (!v.contains("shape") || !v["shape"].is_array()) throw CheckpointError(path_, where + ": no shape array");
      if (v["shape"].size() > 32) throw CheckpointError(path_, fmt::format("{}: rank {} is absurd", where, v["shape"].size()));
      TensorInfo t;
      t.name = t.stored_name = name;
      t.dtype = dtype;
      t.elements = 1;
      for (const auto& d : v["shape"]) {
        if (!d.is_number_unsigned())
          throw CheckpointError(path_, fmt::format("{}: shape entry {} is not a non-negative integer", where, d.dump()));
        const std::uint64_t dim = d.get<std::uint64_t>();
        t.shape.push_back(dim);
        if (!mul_ok(t.elements, dim, t.elements))
          throw CheckpointError(path_, fmt::format("{}: element count of shape {} overflows", where, v["shape"].dump()));
      }
      std::uint64_t bytes = 0;
      if (!mul_ok(t.elements, ds->second, bytes))
        throw CheckpointError(path_, fmt::format("{}: byte size of shape {} overflows", where, v["shape"].dump()));
      const auto& off = v.contains("data_offsets") ? v["data_offsets"] : nlohmann::json();
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        throw CheckpointError(path_, where + ": data_offsets is not [begin, end] of non-negative integers");
      const std::uint64_t b = off[0].get<std::uint64_t>(), e = off[1].get<std::uint64_t>();
      if (b > e) throw CheckpointError(path_, fmt::format("{}: data_offsets [{}, {}] end before they begin", where, b, e));
      if (e > data_size)
        throw CheckpointError(path_, fmt::format("{}: data_offsets [{}, {}] run beyond the data area ({} bytes)", where, b, e, data_size));
      if (e - b != bytes)
        throw CheckpointError(path_, fmt::format("{}: data_offsets [{}, {}] hold {} bytes, but {} x {} needs {}", where, b, e,
                                                 e - b, dtype, v["shape"].dump(), bytes));
      t.readable = readable_size(dtype) != 0;
      begin_[name] = b;
      if (e > b) extents.push_back({b, e, name});
      tensors_.push_back(std::move(t));
    }
    std::sort(extents.begin(), extents.end(), [](const Extent& x, const Extent& y) { return x.begin < y.begin; });
    for (std::size_t i = 1; i < extents.size(); ++i)
      if (extents[i].begin < extents[i - 1].end)
        throw CheckpointError(path_, fmt::format("tensors {} and {} overlap (bytes [{}, {}) and [{}, {}))", extents[i - 1].name,
                                                 extents[i].name, extents[i - 1].begin, extents[i - 1].end, extents[i].begin,
                                                 extents[i].end));
  }

  const std::uint8_t* data_;
  std::size_t size_;
  std::shared_ptr<const MappedFile> keep_;
  std::uint64_t data_start_ = 0;
  std::map<std::string, std::uint64_t> begin_;
};

}  // namespace

std::unique_ptr<Checkpoint> safetensors_from(const std::uint8_t* data, std::size_t size, const std::string& path,
                                             std::shared_ptr<const MappedFile> keep) {
  return std::make_unique<Safetensors>(data, size, path, std::move(keep));
}

}  // namespace normcheck::audit::detail
