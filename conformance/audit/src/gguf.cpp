// GGUF v2/v3 (llama.cpp's ggml/docs/gguf.md): magic "GGUF", u32 version, u64 tensor count, u64
// key/value count, the key/value pairs, the tensor infos (name, n_dims <= 4, ne[], ggml type,
// offset), padding to general.alignment (default 32), then the data. All little-endian. Every
// string length, array count and tensor count is checked against the bytes that remain before
// anything is allocated for it, every ggml type against the type table (block size and bytes
// per block), and every tensor's extent against the data area and the others.
#include <fmt/core.h>

#include <algorithm>
#include <map>

#include "mapped.hpp"

namespace normcheck::audit::detail {
namespace {

struct GgmlType {
  const char* name;
  std::uint64_t block;  // elements per block
  std::uint64_t bytes;  // bytes per block
};

// ggml.h / ggml.c type_traits (ids 4, 5: removed Q4_2/Q4_3; 31-33: removed Q4_0_4_4 ...).
const std::map<std::uint32_t, GgmlType>& ggml_types() {
  static const std::map<std::uint32_t, GgmlType> m{
      {0, {"F32", 1, 4}},        {1, {"F16", 1, 2}},        {2, {"Q4_0", 32, 18}},     {3, {"Q4_1", 32, 20}},
      {6, {"Q5_0", 32, 22}},     {7, {"Q5_1", 32, 24}},     {8, {"Q8_0", 32, 34}},     {9, {"Q8_1", 32, 36}},
      {10, {"Q2_K", 256, 84}},   {11, {"Q3_K", 256, 110}},  {12, {"Q4_K", 256, 144}},  {13, {"Q5_K", 256, 176}},
      {14, {"Q6_K", 256, 210}},  {15, {"Q8_K", 256, 292}},  {16, {"IQ2_XXS", 256, 66}}, {17, {"IQ2_XS", 256, 74}},
      {18, {"IQ3_XXS", 256, 98}}, {19, {"IQ1_S", 256, 50}}, {20, {"IQ4_NL", 32, 18}},  {21, {"IQ3_S", 256, 110}},
      {22, {"IQ2_S", 256, 82}},  {23, {"IQ4_XS", 256, 136}}, {24, {"I8", 1, 1}},       {25, {"I16", 1, 2}},
      {26, {"I32", 1, 4}},       {27, {"I64", 1, 8}},       {28, {"F64", 1, 8}},       {29, {"IQ1_M", 256, 56}},
      {30, {"BF16", 1, 2}},      {34, {"TQ1_0", 256, 54}},  {35, {"TQ2_0", 256, 66}},  {39, {"MXFP4", 32, 17}}};
  return m;
}

enum : std::uint32_t { kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kString, kArray, kU64, kI64, kF64 };

class Cursor {
 public:
  Cursor(const std::uint8_t* p, std::size_t n, const std::string& path) : p_(p), n_(n), path_(path) {}
  std::size_t pos() const { return pos_; }
  std::size_t left() const { return n_ - pos_; }
  void need(std::uint64_t k, const char* what) const {
    if (k > left())
      throw CheckpointError(path_, fmt::format("truncated at byte {}: {} needs {} bytes, {} remain", pos_, what, k, left()));
  }
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v{};
    for (std::size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>(v | (static_cast<T>(p_[pos_ + i]) << (8 * i)));
    pos_ += sizeof(T);
    return v;
  }
  double get_f32(const char* what) {
    const std::uint32_t b = get<std::uint32_t>(what);
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  double get_f64(const char* what) {
    const std::uint64_t b = get<std::uint64_t>(what);
    double d;
    std::memcpy(&d, &b, 8);
    return d;
  }
  std::string str(const char* what) {
    const std::uint64_t len = get<std::uint64_t>(what);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return s;
  }
  void skip(std::uint64_t k, const char* what) {
    need(k, what);
    pos_ += k;
  }

 private:
  const std::uint8_t* p_;
  std::size_t n_, pos_ = 0;
  const std::string& path_;
};

class Gguf final : public Checkpoint {
 public:
  Gguf(const std::uint8_t* data, std::size_t size, const std::string& path, std::shared_ptr<const MappedFile> keep)
      : data_(data), size_(size), keep_(std::move(keep)) {
    path_ = path;
    parse();
  }
  const std::string& format() const override {
    static const std::string f = "gguf";
    return f;
  }
  std::vector<double> read(const TensorInfo& t) const override {
    const auto it = begin_.find(t.stored_name);
    if (it == begin_.end() || !t.readable)
      throw CheckpointError(path_, fmt::format("tensor {}: dtype {} cannot be read as numbers", t.name, t.dtype));
    return widen(t.dtype, data_ + it->second, t.elements);
  }

 private:
  // One value of type `type`; scalars and strings into JSON, arrays kept when short (a
  // tokenizer's 150k strings are walked over, not kept).
  nlohmann::json value(Cursor& c, std::uint32_t type, int depth) {
    switch (type) {
      case kU8: return c.get<std::uint8_t>("u8 value");
      case kI8: return static_cast<std::int8_t>(c.get<std::uint8_t>("i8 value"));
      case kU16: return c.get<std::uint16_t>("u16 value");
      case kI16: return static_cast<std::int16_t>(c.get<std::uint16_t>("i16 value"));
      case kU32: return c.get<std::uint32_t>("u32 value");
      case kI32: return static_cast<std::int32_t>(c.get<std::uint32_t>("i32 value"));
      case kF32: return c.get_f32("f32 value");
      case kBool: return c.get<std::uint8_t>("bool value") != 0;
      case kString: return c.str("string value");
      case kU64: return c.get<std::uint64_t>("u64 value");
      case kI64: return static_cast<std::int64_t>(c.get<std::uint64_t>("i64 value"));
      case kF64: return c.get_f64("f64 value");
      case kArray: {
        if (depth > 4) throw CheckpointError(path_, fmt::format("byte {}: arrays nested deeper than 4", c.pos()));
        const std::uint32_t et = c.get<std::uint32_t>("array element type");
        const std::uint64_t count = c.get<std::uint64_t>("array count");
        if (et > kF64) throw CheckpointError(path_, fmt::format("byte {}: unknown array element type {}", c.pos(), et));
        // Each element takes at least one byte: a count beyond the remaining bytes is absurd.
        if (count > c.left())
          throw CheckpointError(path_, fmt::format("byte {}: array count {} exceeds the {} bytes that remain", c.pos(), count, c.left()));
        constexpr std::uint64_t kKeep = 64;
        nlohmann::json arr = nlohmann::json::array();
        for (std::uint64_t i = 0; i < count; ++i) {
          if (et == kString) {
            c.skip(c.get<std::uint64_t>("string length"), "string value");
            continue;
          }
          nlohmann::json v = value(c, et, depth + 1);
          if (i < kKeep) arr.push_back(std::move(v));
        }
        if (count <= kKeep && et != kString) return arr;
        return nlohmann::json{{"array_type", et}, {"count", count}};
      }
      default: throw CheckpointError(path_, fmt::format("byte {}: unknown metadata value type {}", c.pos(), type));
    }
  }

  void parse() {
    Cursor c(data_, size_, path_);
    c.need(4, "magic");
    if (std::memcmp(data_, "GGUF", 4) != 0) throw CheckpointError(path_, "no GGUF magic");
    c.skip(4, "magic");
    const std::uint32_t version = c.get<std::uint32_t>("version");
    if (version != 2 && version != 3)
      throw CheckpointError(path_, fmt::format("GGUF version {} (this reader knows 2 and 3)", version));
    const std::uint64_t n_tensors = c.get<std::uint64_t>("tensor count");
    const std::uint64_t n_kv = c.get<std::uint64_t>("key/value count");
    // A key/value pair takes at least 8 + 4 + 1 bytes, a tensor info 8 + 4 + 8 + 4 + 8.
    if (n_kv > c.left() / 13)
      throw CheckpointError(path_, fmt::format("key/value count {} cannot fit in the {} bytes that remain", n_kv, c.left()));
    if (n_tensors > c.left() / 32)
      throw CheckpointError(path_, fmt::format("tensor count {} cannot fit in the {} bytes that remain", n_tensors, c.left()));
    std::uint64_t alignment = 32;
    for (std::uint64_t i = 0; i < n_kv; ++i) {
      const std::string key = c.str("metadata key");
      // The format (ggml/docs/gguf.md) and ggml's own parser: a key is a non-empty name.
      if (key.empty()) throw CheckpointError(path_, fmt::format("metadata key {} is empty", i));
      const std::uint32_t type = c.get<std::uint32_t>("metadata value type");
      nlohmann::json v = value(c, type, 0);
      if (key == "general.alignment") {
        if (type != kU32 || v.get<std::uint64_t>() == 0 || (v.get<std::uint64_t>() & (v.get<std::uint64_t>() - 1)) != 0)
          throw CheckpointError(path_, fmt::format("general.alignment {} is not a power of two (u32)", v.dump()));
        alignment = v.get<std::uint64_t>();
      }
      metadata_[key] = std::move(v);
    }
    struct Extent {
      std::uint64_t begin, end;
      std::string name;
    };
    std::vector<Extent> extents;
    std::vector<std::uint64_t> offsets;
    for (std::uint64_t i = 0; i < n_tensors; ++i) {
      TensorInfo t;
      t.stored_name = c.str("tensor name");
      // ggml keeps a tensor's name as a C string: a NUL byte would cut it, and llama.cpp would
      // know the tensor by another name than the one stored.
      if (t.stored_name.find('\0') != std::string::npos)
        throw CheckpointError(path_, fmt::format("tensor {}: its name contains a NUL byte", i));
      t.name = t.stored_name;
      const std::string where = "tensor " + t.name;
      const std::uint32_t n_dims = c.get<std::uint32_t>("tensor rank");
      if (n_dims > 4) throw CheckpointError(path_, fmt::format("{}: rank {} (GGUF allows at most 4)", where, n_dims));
      std::vector<std::uint64_t> ne(n_dims);
      t.elements = 1;
      for (auto& d : ne) {
        d = c.get<std::uint64_t>("tensor dimension");
        if (!mul_ok(t.elements, d, t.elements)) throw CheckpointError(path_, where + ": element count overflows");
      }
      t.shape.assign(ne.rbegin(), ne.rend());
      const std::uint32_t type = c.get<std::uint32_t>("tensor type");
      const auto gt = ggml_types().find(type);
      if (gt == ggml_types().end()) throw CheckpointError(path_, fmt::format("{}: unknown ggml type {}", where, type));
      t.dtype = gt->second.name;
      t.readable = readable_size(t.dtype) != 0;
      const std::uint64_t row = n_dims ? ne[0] : 1;
      if (row % gt->second.block != 0)
        throw CheckpointError(path_, fmt::format("{}: row of {} elements is not a whole number of {} blocks of {}", where, row,
                                                 t.dtype, gt->second.block));
      std::uint64_t bytes = 0;
      if (!mul_ok(t.elements / gt->second.block, gt->second.bytes, bytes))
        throw CheckpointError(path_, where + ": byte size overflows");
      const std::uint64_t off = c.get<std::uint64_t>("tensor offset");
      if (off % alignment != 0)
        throw CheckpointError(path_, fmt::format("{}: offset {} is not a multiple of the alignment {}", where, off, alignment));
      offsets.push_back(off);
      extents.push_back({off, bytes, t.name});  // end filled in below, once the data start is known
      tensors_.push_back(std::move(t));
    }
    const std::uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
    if (data_start > size_ && n_tensors > 0)
      throw CheckpointError(path_, fmt::format("data area starts at byte {}, beyond the file ({} bytes)", data_start, size_));
    const std::uint64_t data_size = data_start <= size_ ? size_ - data_start : 0;
    for (std::size_t i = 0; i < extents.size(); ++i) {  // extents[i] is tensors_[i] until sorted below
      Extent& e = extents[i];
      const std::uint64_t bytes = e.end;
      if (e.begin > data_size || bytes > data_size - e.begin)
        throw CheckpointError(path_, fmt::format("tensor {}: bytes [{}, {}+{}) run beyond the data area ({} bytes)", e.name, e.begin,
                                                 e.begin, bytes, data_size));
      e.end = e.begin + bytes;
      begin_[e.name] = data_start + e.begin;
      tensors_[i].offset = data_start + e.begin;
    }
    if (begin_.size() != tensors_.size()) throw CheckpointError(path_, "two tensors share a name");
    std::sort(extents.begin(), extents.end(), [](const Extent& x, const Extent& y) { return x.begin < y.begin; });
    for (std::size_t i = 1; i < extents.size(); ++i)
      if (extents[i].begin < extents[i - 1].end && extents[i].end > extents[i].begin)
        throw CheckpointError(path_, fmt::format("tensors {} and {} overlap (bytes [{}, {}) and [{}, {}) of the data area)",
                                                 extents[i - 1].name, extents[i].name, extents[i - 1].begin, extents[i - 1].end,
                                                 extents[i].begin, extents[i].end));
  }

  const std::uint8_t* data_;
  std::size_t size_;
  std::shared_ptr<const MappedFile> keep_;
  std::map<std::string, std::uint64_t> begin_;
};

}  // namespace

std::unique_ptr<Checkpoint> gguf_from(const std::uint8_t* data, std::size_t size, const std::string& path,
                                      std::shared_ptr<const MappedFile> keep) {
  return std::make_unique<Gguf>(data, size, path, std::move(keep));
}

}  // namespace normcheck::audit::detail
