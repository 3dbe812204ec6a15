// The in-process plugin transport: a shared library exporting the candidate.h descriptor (ABI
// v1), called with host tensors in their dtype's native bytes. A plugin that crashes takes
// normcheck with it; --isolate runs it in a `normcheck worker` child instead.
#include <dlfcn.h>
#include <fmt/core.h>

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "plugin_loader.hpp"
#include "quant_wire.hpp"
#include "transports.hpp"

namespace normcheck::conf {
namespace plugin {
namespace {

// candidate.h's numbers are those of the reference's enums, so a case converts by casting.
static_assert(static_cast<int>(ref::DType::float64) == NC_FLOAT64 &&
              static_cast<int>(ref::DType::float32) == NC_FLOAT32 &&
              static_cast<int>(ref::DType::float16) == NC_FLOAT16 &&
              static_cast<int>(ref::DType::bfloat16) == NC_BFLOAT16);
static_assert(static_cast<int>(ref::Op::layernorm) == NC_LAYERNORM &&
              static_cast<int>(ref::Op::rmsnorm) == NC_RMSNORM);
static_assert(static_cast<int>(ref::Direction::forward) == NC_FORWARD &&
              static_cast<int>(ref::Direction::backward) == NC_BACKWARD);
static_assert(static_cast<int>(ref::Affine::none) == NC_AFFINE_NONE &&
              static_cast<int>(ref::Affine::weight) == NC_AFFINE_WEIGHT &&
              static_cast<int>(ref::Affine::weight_bias) == NC_AFFINE_WEIGHT_BIAS);
static_assert(static_cast<int>(ref::Residual::none) == NC_RESIDUAL_NONE &&
              static_cast<int>(ref::Residual::add) == NC_RESIDUAL_ADD &&
              static_cast<int>(ref::Residual::add_bias) == NC_RESIDUAL_ADD_BIAS);
static_assert(static_cast<int>(ref::Block::none) == NC_BLOCK_NONE &&
              static_cast<int>(ref::Block::post) == NC_BLOCK_POST &&
              static_cast<int>(ref::Block::pre) == NC_BLOCK_PRE &&
              static_cast<int>(ref::Block::sandwich) == NC_BLOCK_SANDWICH &&
              static_cast<int>(ref::Block::deepnorm) == NC_BLOCK_DEEPNORM);
static_assert(static_cast<int>(ref::Activation::gelu) == NC_GELU &&
              static_cast<int>(ref::Activation::relu) == NC_RELU);
static_assert(static_cast<int>(ref::QFormat::float8_e4m3fn) == NC_Q_FLOAT8_E4M3FN &&
              static_cast<int>(ref::QFormat::float8_e5m2) == NC_Q_FLOAT8_E5M2 &&
              static_cast<int>(ref::QFormat::int8) == NC_Q_INT8 &&
              static_cast<int>(ref::QFormat::mxfp8_e4m3) == NC_Q_MXFP8_E4M3 &&
              static_cast<int>(ref::QFormat::mxfp8_e5m2) == NC_Q_MXFP8_E5M2 &&
              static_cast<int>(ref::QFormat::nvfp4_e2m1) == NC_Q_NVFP4_E2M1);
static_assert(static_cast<int>(ref::ScaleKind::static_tensor) == NC_QS_STATIC_TENSOR &&
              static_cast<int>(ref::ScaleKind::dynamic_token) == NC_QS_DYNAMIC_TOKEN &&
              static_cast<int>(ref::ScaleKind::mx_block) == NC_QS_MX_BLOCK &&
              static_cast<int>(ref::ScaleKind::nvfp4_block) == NC_QS_NVFP4_BLOCK);
static_assert(static_cast<int>(ref::ResidualSum::rounded) == NC_QR_ROUNDED &&
              static_cast<int>(ref::ResidualSum::unrounded) == NC_QR_UNROUNDED);
static_assert(static_cast<int>(ref::QuantValue::activation) == NC_QV_ACTIVATION &&
              static_cast<int>(ref::QuantValue::float32) == NC_QV_FLOAT32);
static_assert(static_cast<int>(ref::ScaleApply::reciprocal) == NC_QA_RECIPROCAL &&
              static_cast<int>(ref::ScaleApply::divide) == NC_QA_DIVIDE &&
              static_cast<int>(ref::ScaleApply::multiply) == NC_QA_MULTIPLY);
static_assert(static_cast<int>(ref::MxRule::floor) == NC_QMX_FLOOR &&
              static_cast<int>(ref::MxRule::round_up) == NC_QMX_ROUND_UP);
static_assert(static_cast<int>(ref::NanPolicy::nan_code) == NC_QN_NAN_CODE &&
              static_cast<int>(ref::NanPolicy::unspecified) == NC_QN_UNSPECIFIED);

// v1's descriptor ends with `run`; a later header may append fields, so this is not sizeof.
constexpr std::size_t kV1DescriptorSize = offsetof(nc_candidate, run) + sizeof(nc_candidate::run);
// The descriptor of a plugin that can declare quantization (quant_formats, quant_scales).
constexpr std::size_t kQuantDescriptorSize = offsetof(nc_candidate, quant_scales) + sizeof(nc_candidate::quant_scales);
// Bytes after each code buffer, filled with kGuardByte and checked after `run`: at least the
// buffer's own size, so that NVFP4 codes written one a byte instead of packed land here.
constexpr std::uint8_t kGuardByte = 0xA5;
// Message buffers handed to the plugin (candidate.h promises at least 256 bytes).
constexpr std::size_t kMessageLen = 4096;
// Host buffers start on a cache line, so that aligned vector loads of a dense row start work
// (candidate.h promises 64 bytes).
constexpr std::size_t kAlignment = 64;

// Saves the floating-point environment (rounding mode, and on x86-64 the MXCSR with its
// flush-to-zero and denormals-are-zero bits) and restores it on scope exit. A plugin built with
// -ffast-math sets FTZ/DAZ when it is loaded (crtfastmath.o), and libraries such as oneDNN may
// switch them on; the reference running in this process needs round-to-nearest with gradual
// underflow.
class FenvGuard {
 public:
  FenvGuard() { std::fegetenv(&env_); }
  ~FenvGuard() { std::fesetenv(&env_); }
  FenvGuard(const FenvGuard&) = delete;
  FenvGuard& operator=(const FenvGuard&) = delete;

 private:
  std::fenv_t env_;
};

// dlerror's text, without the "FILE: " it starts with when the caller's message names the file.
std::string dlerror_text(const std::string& file) {
  const char* e = dlerror();
  std::string text = e ? e : "unknown dlopen error";
  if (text.starts_with(file + ": ")) text.erase(0, file.size() + 2);
  return text;
}

// The message a plugin wrote into `buf`, which may lack its terminator.
std::string message_of(char* buf, std::size_t len) {
  buf[len - 1] = '\0';
  return buf;
}

std::uint32_t bit(int value) { return std::uint32_t{1} << value; }

template <class E, std::size_t N>
std::vector<E> from_bits(std::uint32_t bits, const E (&all)[N]) {
  std::vector<E> v;
  for (E e : all)
    if (bits & bit(static_cast<int>(e))) v.push_back(e);
  return v;
}

std::vector<std::string> split_contracts(const char* list) {
  // NULL and "" declare "exact" only (candidate.h): a plugin that says nothing about precision
  // contracts is not run on the llama/gemma/... cases, where it would fail for a claim it never
  // made.
  std::vector<std::string> out;
  if (list) {
    std::string_view s(list);
    while (!s.empty()) {
      const auto comma = s.find(',');
      std::string_view part = s.substr(0, comma);
      while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
      while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
      if (!part.empty()) out.emplace_back(part);
      if (comma == std::string_view::npos) break;
      s.remove_prefix(comma + 1);
    }
  }
  if (out.empty()) out.emplace_back("exact");
  return out;
}

// Elements cross as their dtype's storage (ref::store_native / load_native): every value of a
// case's tensor belongs to its dtype, so both ways are exact.

// A host tensor in its dtype's bytes, and the nc_tensor that views it: dense row-major, or laid
// out as an InputLayout says (padding NaN-filled, an offset into the buffer, column-major).
class HostTensor {
 public:
  HostTensor(ref::DType dtype, std::vector<std::int64_t> shape, const InputLayout& layout = {})
      : dtype_(dtype), shape_(std::move(shape)), dense_(layout.dense()) {
    numel_ = 1;
    for (const auto e : shape_) numel_ *= e;
    const std::size_t rank = shape_.size();
    strides_.assign(rank, 1);
    std::int64_t span = numel_;
    if (dense_) {
      for (std::size_t d = rank; d-- > 1;) strides_[d - 1] = strides_[d] * shape_[d];
    } else {
      // Dims from the fastest: the last one (row-major) or the first (column-major); the fastest
      // run is followed by `pad` unused elements.
      span = 1;
      for (std::size_t k = 0; k < rank; ++k) {
        const std::size_t d = layout.column_major ? k : rank - 1 - k;
        strides_[d] = span;
        span *= shape_[d] + (k == 0 ? layout.pad : 0);
      }
      offset_ = layout.offset_bytes / static_cast<std::int64_t>(ref::storage_bytes(dtype_));
      span += offset_;
    }
    const std::size_t bytes = static_cast<std::size_t>(span) * ref::storage_bytes(dtype_);
    const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    data_.reset(static_cast<std::byte*>(std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded)));
    if (!data_) throw std::bad_alloc();
    if (!dense_)  // a kernel that reads the padding or what precedes the tensor reads NaN
      for (std::int64_t i = 0; i < span; ++i)
        ref::store_native(std::numeric_limits<double>::quiet_NaN(), dtype_,
                          data_.get() + static_cast<std::size_t>(i) * ref::storage_bytes(dtype_));
  }
  std::int64_t numel() const { return numel_; }
  // Element i in row-major order.
  std::byte* at(std::int64_t i) {
    std::int64_t off = i;
    if (!dense_) {
      off = offset_;
      for (std::size_t d = shape_.size(); d-- > 0;) {
        off += (i % shape_[d]) * strides_[d];
        i /= shape_[d];
      }
    }
    return data_.get() + static_cast<std::size_t>(off) * ref::storage_bytes(dtype_);
  }
  nc_tensor view() {
    return {data_.get() + static_cast<std::size_t>(offset_) * ref::storage_bytes(dtype_),
            static_cast<std::int32_t>(dtype_), static_cast<std::int32_t>(shape_.size()), shape_.data(),
            strides_.data()};
  }
  ref::Tensor to_tensor() {
    ref::Tensor t{dtype_, shape_, std::vector<double>(static_cast<std::size_t>(numel_))};
    if (dense_) {
      ref::load_native_array(reinterpret_cast<const unsigned char*>(data_.get()), t.data.size(), dtype_, t.data.data());
      return t;
    }
    for (std::int64_t i = 0; i < numel_; ++i) t.data[static_cast<std::size_t>(i)] = ref::load_native(at(i), dtype_);
    return t;
  }
  // Stores the values of `v` (one per element, row-major), each of which must be a value of the
  // dtype (else CaseError naming `what`): store_native of each (ref::store_native_array where
  // the tensor is dense).
  void store_all(const std::vector<double>& v, const std::string& what) {
    auto general = [&](std::int64_t i) {
      const double x = v[static_cast<std::size_t>(i)];
      if (!ref::representable(x, dtype_))
        throw ref::CaseError(what, fmt::format("{} is not a {} value", x, ref::name_of(dtype_)));
      ref::store_native(x, dtype_, at(i));
    };
    if (dense_) {
      ref::store_native_array(v.data(), v.size(), dtype_, reinterpret_cast<unsigned char*>(data_.get()),
                              [&](std::size_t i) { general(static_cast<std::int64_t>(i)); });
      return;
    }
    for (std::int64_t i = 0; i < numel_; ++i) general(i);
  }
  // Every element set to `v` (a value of the dtype, or NaN): its storage computed once.
  void fill(double v) {
    const std::size_t size = ref::storage_bytes(dtype_);
    unsigned char bytes[8];
    ref::store_native(v, dtype_, bytes);
    for (std::int64_t i = 0; i < numel_; ++i) std::memcpy(at(i), bytes, size);
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  ref::DType dtype_;
  std::vector<std::int64_t> shape_;
  std::vector<std::int64_t> strides_;
  std::int64_t numel_ = 0;
  bool dense_ = true;
  std::int64_t offset_ = 0;  // elements before the tensor in its buffer
  std::unique_ptr<std::byte[], Free> data_;
};

// The nc_case of a ref::Case; its pointers point into this object, which therefore stays put.
class CaseView {
 public:
  explicit CaseView(const ref::Case& c) : g_(ref::geometry_of(c)), id_(c.id) {
    nc_.struct_size = sizeof(nc_case);
    nc_.case_id = id_.c_str();  // "" when the case did not come from a fixture file
    nc_.op = static_cast<std::int32_t>(c.op);
    nc_.direction = static_cast<std::int32_t>(c.direction);
    nc_.rank = static_cast<std::int32_t>(g_.shape.size());
    nc_.shape = g_.shape.data();
    nc_.n_norm_dims = static_cast<std::int32_t>(g_.norm_dims.size());
    nc_.norm_dims = g_.norm_dims.data();
    nc_.epsilon = c.epsilon;
    nc_.affine = static_cast<std::int32_t>(c.affine);
    nc_.weight_offset = c.weight_offset;
    nc_.residual = static_cast<std::int32_t>(c.residual);
    nc_.alpha = c.alpha;
    nc_.block = static_cast<std::int32_t>(c.block);
    nc_.layers = c.layers;
    nc_.activation = static_cast<std::int32_t>(c.activation);
    nc_.contract = c.contract.c_str();
    nc_.dtype_x = static_cast<std::int32_t>(c.dtype_x);
    nc_.dtype_param = static_cast<std::int32_t>(c.dtype_param);
    nc_.dtype_out = static_cast<std::int32_t>(c.dtype_out);
    nc_.dtype_compute = static_cast<std::int32_t>(c.dtype_compute);
    nc_.dtype_residual = static_cast<std::int32_t>(c.dtype_residual);
    nc_.quant = nullptr;
    if (c.quant) {
      const ref::QuantContract& q = *c.quant;
      preset_ = q.preset;
      q_.struct_size = sizeof(nc_quant);
      q_.format = static_cast<std::int32_t>(q.format);
      q_.scale = static_cast<std::int32_t>(q.scale);
      q_.residual_sum = static_cast<std::int32_t>(q.residual_sum);
      q_.value = static_cast<std::int32_t>(q.value);
      q_.apply = static_cast<std::int32_t>(q.apply);
      q_.mx_rule = static_cast<std::int32_t>(q.mx_rule);
      q_.nan = static_cast<std::int32_t>(q.nan);
      q_.scale_ub = q.scale_ub;
      q_.min_scale = q.min_scale;
      q_.amax = q.amax ? 1 : 0;
      q_.y = q.y ? 1 : 0;
      q_.preset = preset_.c_str();
      nc_.quant = &q_;
    }
  }
  CaseView(const CaseView&) = delete;
  CaseView& operator=(const CaseView&) = delete;
  const nc_case* get() const { return &nc_; }

 private:
  ref::Geometry g_;
  std::string id_;
  std::string preset_;
  nc_quant q_{};
  nc_case nc_{};
};

// The host buffer of a code output (candidate.h nc_quant): bytes as the fixture stores them,
// dense, filled with `fill`, followed by a guard region that run() checks.
class CodeBuffer {
 public:
  CodeBuffer(const OutputSpec& spec, std::uint8_t fill) : spec_(spec), layout_(wire::layout_of(spec)) {
    const auto bytes = static_cast<std::size_t>(layout_.bytes);
    guard_ = std::max<std::size_t>(bytes, kAlignment);
    const std::size_t rounded = (bytes + guard_ + kAlignment - 1) / kAlignment * kAlignment;
    data_.reset(static_cast<std::uint8_t*>(std::aligned_alloc(kAlignment, rounded)));
    if (!data_) throw std::bad_alloc();
    std::memset(data_.get(), fill, bytes);
    std::memset(data_.get() + bytes, kGuardByte, rounded - bytes);
    strides_.assign(layout_.shape.size(), 1);
    for (std::size_t d = layout_.shape.size(); d-- > 1;) strides_[d - 1] = strides_[d] * layout_.shape[d];
  }
  nc_tensor view() {
    return {data_.get(), layout_.storage == wire::Storage::int8 ? NC_INT8 : NC_UINT8,
            static_cast<std::int32_t>(layout_.shape.size()), layout_.shape.data(), strides_.data()};
  }
  // Where the plugin wrote past the end, if it did: "output 'q': ...".
  std::optional<std::string> overrun(const std::string& name) const {
    const auto bytes = static_cast<std::size_t>(layout_.bytes);
    for (std::size_t i = 0; i < guard_; ++i)
      if (data_[bytes + i] != kGuardByte)
        return fmt::format(
            "the plugin wrote past the end of output '{}' (byte {} of a {}-byte buffer, {} {}{}): a buffer overrun",
            name, bytes + i, bytes, wire::name_of(layout_.storage), proto_shape(layout_.shape),
            layout_.packed ? ", NVFP4 codes packed two per byte, element 2k in the low nibble" : "");
    return std::nullopt;
  }
  ref::Tensor to_tensor() const { return wire::from_bytes(spec_, data_.get()); }

 private:
  static std::string proto_shape(const std::vector<std::int64_t>& shape) {
    std::string out = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
    return out + "]";
  }
  struct Free {
    void operator()(std::uint8_t* p) const { std::free(p); }
  };
  OutputSpec spec_;
  wire::CodeLayout layout_;
  std::vector<std::int64_t> strides_;
  std::size_t guard_ = 0;
  std::unique_ptr<std::uint8_t[], Free> data_;
};

// The outputs the quantization contract makes float32 whatever the plugin's dtypes (the static
// scale input; dynamic scales, global scale and amax outputs).
bool quant_float32_tensor(const ref::Case& c, const std::string& name) {
  return c.quant && (name == "scale" || name == "global_scale" || name == "amax");
}

class PluginCandidate final : public Candidate {
 public:
  PluginCandidate(Loaded loaded, CandidateInfo info);
  ~PluginCandidate() override;
  const CandidateInfo& info() const override { return info_; }
  std::optional<std::string> declines(const ref::Case& c) const override;
  Outputs run(const ref::Case& c) override;
  bool set_output_sentinel(double value) override {
    sentinel_ = value;
    return true;
  }
  bool set_input_layout(const InputLayout& layout) override {
    if (layout.pad < 0 || layout.offset_bytes < 0 || layout.offset_bytes % static_cast<std::int64_t>(kAlignment) != 0)
      throw std::invalid_argument("input layout: pad and offset must be >= 0, the offset a multiple of 64 bytes");
    layout_ = layout;
    return true;
  }

 private:
  std::mutex& lock() const;

  Loaded loaded_;
  CandidateInfo info_;
  void* state_ = nullptr;
  std::optional<std::string> init_error_;  // every case is declined with it
  double sentinel_ = std::numeric_limits<double>::quiet_NaN();  // outputs' fill before run
  InputLayout layout_;  // of the inputs (dense row-major by default)
};

class DecliningCandidate final : public Candidate {
 public:
  DecliningCandidate(CandidateInfo info, std::string reason)
      : info_(std::move(info)), reason_(std::move(reason)) {}
  const CandidateInfo& info() const override { return info_; }
  std::optional<std::string> declines(const ref::Case&) const override { return reason_; }
  Outputs run(const ref::Case&) override { throw CandidateDeclined(reason_); }

 private:
  CandidateInfo info_;
  std::string reason_;
};

}  // namespace

class Library {
 public:
  explicit Library(void* handle) : handle_(handle) {}
  ~Library() {
    FenvGuard fenv;
    dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  void* handle() const { return handle_; }
  std::mutex& mutex() { return mutex_; }

 private:
  void* handle_;
  std::mutex mutex_;
};

namespace {

// dlopen returns the handle it already has for a file loaded twice; the candidates made from
// it then share one Library, and so one lock.
std::shared_ptr<Library> share(void* handle) {
  static std::mutex mu;
  static std::map<void*, std::weak_ptr<Library>> open;
  std::lock_guard<std::mutex> guard(mu);
  if (auto lib = open[handle].lock()) {
    FenvGuard fenv;
    dlclose(handle);  // drops the reference this dlopen added; `lib` holds the first one
    return lib;
  }
  std::erase_if(open, [](const auto& kv) { return kv.second.expired(); });
  auto lib = std::make_shared<Library>(handle);
  open[handle] = lib;
  return lib;
}

}  // namespace

Loaded load(const std::string& path) {
  // dlopen searches the library path for a name without a slash; a spec names a file.
  const std::string file = path.find('/') == std::string::npos ? "./" + path : path;
  void* handle = nullptr;
  {
    FenvGuard fenv;
    dlerror();
    handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (!handle)
    throw std::invalid_argument(
        fmt::format("plugin {}: not a loadable shared library: {}", path, dlerror_text(file)));
  Loaded out{share(handle), nullptr};

  dlerror();
  void* symbol = dlsym(handle, NORMCHECK_CANDIDATE_SYMBOL);
  if (!symbol)
    throw std::invalid_argument(
        fmt::format("plugin {}: no `{}` symbol (export `const nc_candidate* {}(void)` with C linkage; "
                    "candidate.h declares it)",
                    path, NORMCHECK_CANDIDATE_SYMBOL, NORMCHECK_CANDIDATE_SYMBOL));
  // POSIX makes the object-to-function pointer conversion of dlsym's result well defined.
  const auto entry = reinterpret_cast<nc_candidate_fn>(symbol);
  const nc_candidate* d = nullptr;
  {
    std::lock_guard<std::mutex> guard(out.library->mutex());
    FenvGuard fenv;
    try {
      d = entry();
    } catch (...) {
      throw std::invalid_argument(
          fmt::format("plugin {}: {}() threw a C++ exception", path, NORMCHECK_CANDIDATE_SYMBOL));
    }
  }
  if (!d)
    throw std::invalid_argument(
        fmt::format("plugin {}: {}() returned NULL", path, NORMCHECK_CANDIDATE_SYMBOL));
  if (d->abi_version != NORMCHECK_CANDIDATE_ABI_VERSION)
    throw std::invalid_argument(fmt::format("plugin {} speaks ABI version {}; this normcheck speaks {}", path,
                                            d->abi_version, NORMCHECK_CANDIDATE_ABI_VERSION));
  if (d->struct_size < kV1DescriptorSize)
    throw std::invalid_argument(
        fmt::format("plugin {}: descriptor struct_size is {} bytes, smaller than ABI version 1's {} (set it "
                    "to sizeof(nc_candidate))",
                    path, d->struct_size, kV1DescriptorSize));
  if (!d->run)
    throw std::invalid_argument(fmt::format("plugin {}: the descriptor has no run function", path));
  out.descriptor = d;
  return out;
}

CandidateInfo info_of(const nc_candidate& d, std::string name, CandidateKind kind) {
  CandidateInfo info;
  info.name = std::move(name);
  info.kind = kind;
  const std::string self = d.name ? d.name : "";
  const std::string what = d.description ? d.description : "";
  info.description = self.empty() ? what : what.empty() ? self : self + ": " + what;
  if (d.flags & NC_CAP_INTENDED_MUTANT) {  // a library's own mutant: its description names the fault
    info.kind = CandidateKind::mutant;
    if (info.fault.empty()) info.fault = what.empty() ? self : what;
  }
  Capabilities& caps = info.caps;
  caps.ops = from_bits(d.ops, {ref::Op::layernorm, ref::Op::rmsnorm});
  constexpr ref::DType kDtypes[] = {ref::DType::float64, ref::DType::float32, ref::DType::float16,
                                    ref::DType::bfloat16};
  caps.dtypes = from_bits(d.dtypes, kDtypes);
  caps.compute_dtypes = from_bits(d.compute_dtypes, kDtypes);
  caps.directions = from_bits(d.directions, {ref::Direction::forward, ref::Direction::backward});
  caps.contracts = split_contracts(d.contracts);
  caps.residual = d.flags & NC_CAP_RESIDUAL;
  caps.blocks = d.flags & NC_CAP_BLOCKS;
  caps.general_axes = d.flags & NC_CAP_GENERAL_AXES;
  caps.weight_offset = d.flags & NC_CAP_WEIGHT_OFFSET;
  caps.batch_dependent_order = d.flags & NC_CAP_BATCH_DEPENDENT_ORDER;
  caps.flush_subnormal_outputs = d.flags & NC_CAP_FLUSH_SUBNORMAL_OUTPUTS;
  caps.no_statistics = d.flags & NC_CAP_NO_STATISTICS;
  if (const std::uint32_t cls = NC_CAP_REDUCTION_CLASS(d.flags); cls != NC_REDUCTION_ANY || NC_CAP_REDUCTION_BLOCK(d.flags)) {
    // An invalid class is a bad plugin, said at load time (parse_reduction names the problem).
    constexpr const char* kNames[] = {"any", "two_pass", "welford", "pairwise", "blocked", "accumulate_f64"};
    if (cls > NC_REDUCTION_ACCUMULATE_F64)
      throw std::invalid_argument(fmt::format("plugin {}: unknown reduction class {} (NC_REDUCTION_*)", info.name, cls));
    const bool blocked = cls == NC_REDUCTION_PAIRWISE || cls == NC_REDUCTION_BLOCKED;
    const std::uint32_t block = NC_CAP_REDUCTION_BLOCK(d.flags);
    try {
      caps.reduction = parse_reduction(blocked || block ? fmt::format("{}:{}", kNames[cls], block) : std::string(kNames[cls]));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("plugin {}: {}", info.name, e.what()));
    }
  }
  if (d.struct_size >= kQuantDescriptorSize) {  // a plugin built before nc_quant declares none
    constexpr ref::QFormat kFormats[] = {ref::QFormat::float8_e4m3fn, ref::QFormat::float8_e5m2, ref::QFormat::int8,
                                         ref::QFormat::mxfp8_e4m3, ref::QFormat::mxfp8_e5m2, ref::QFormat::nvfp4_e2m1};
    constexpr ref::ScaleKind kScales[] = {ref::ScaleKind::static_tensor, ref::ScaleKind::dynamic_token,
                                          ref::ScaleKind::mx_block, ref::ScaleKind::nvfp4_block};
    if (d.quant_formats >> std::size(kFormats))
      throw std::invalid_argument(fmt::format("plugin {}: quant_formats 0x{:x} has bits of no format (NC_Q_*)",
                                              info.name, d.quant_formats));
    if (d.quant_scales >> std::size(kScales))
      throw std::invalid_argument(fmt::format("plugin {}: quant_scales 0x{:x} has bits of no scale kind (NC_QS_*)",
                                              info.name, d.quant_scales));
    caps.quant_formats = from_bits(d.quant_formats, kFormats);
    caps.quant_scales = from_bits(d.quant_scales, kScales);
  }
  caps.device = d.device && *d.device ? d.device : "cpu";
  return info;
}

namespace {

PluginCandidate::PluginCandidate(Loaded loaded, CandidateInfo info)
    : loaded_(std::move(loaded)), info_(std::move(info)) {
  const nc_candidate& d = *loaded_.descriptor;
  if (!d.init) return;
  std::lock_guard<std::mutex> guard(lock());
  FenvGuard fenv;
  char err[kMessageLen] = {};
  try {
    state_ = d.init(err, sizeof err);
  } catch (const std::exception& e) {
    init_error_ = fmt::format("plugin init threw a C++ exception: {}", e.what());
    return;
  } catch (...) {
    init_error_ = "plugin init threw a C++ exception";
    return;
  }
  if (!state_) {
    const std::string why = message_of(err, sizeof err);
    init_error_ = "plugin init failed: " + (why.empty() ? std::string("no reason given") : why);
  }
}

PluginCandidate::~PluginCandidate() {
  const nc_candidate& d = *loaded_.descriptor;
  if (init_error_ || !d.fini) return;
  std::lock_guard<std::mutex> guard(lock());
  FenvGuard fenv;
  try {
    d.fini(state_);
  } catch (...) {  // a destructor must not throw; the plugin broke the ABI, nothing to report to
  }
}

std::mutex& PluginCandidate::lock() const { return loaded_.library->mutex(); }

std::optional<std::string> PluginCandidate::declines(const ref::Case& c) const {
  if (init_error_) return init_error_;
  if (auto why = unsupported_reason(info_.caps, c)) return why;
  const nc_candidate& d = *loaded_.descriptor;
  if (!d.supports) return std::nullopt;
  const CaseView view(c);
  std::lock_guard<std::mutex> guard(lock());
  FenvGuard fenv;
  char reason[kMessageLen] = {};
  int rc = 0;
  try {
    rc = d.supports(state_, view.get(), reason, sizeof reason);
  } catch (...) {
    return std::string("plugin supports() threw a C++ exception");
  }
  if (rc == 0) return std::nullopt;
  const std::string why = message_of(reason, sizeof reason);
  return why.empty() ? fmt::format("declined by the plugin (supports returned {})", rc) : why;
}

Outputs PluginCandidate::run(const ref::Case& c) {
  if (init_error_) throw CandidateDeclined(*init_error_);
  const nc_candidate& d = *loaded_.descriptor;
  const CaseView view(c);
  // A C kernel handed a dtype it never declared would misread the bytes; the runner asks
  // declines() first, so this only guards against a caller that did not.
  const auto covered = [&](const std::string& name, ref::DType t, std::uint32_t bits) {
    if (!(bits & bit(static_cast<int>(t))))
      throw CandidateDeclined(
          fmt::format("{} has dtype {}, which the plugin does not declare", name, ref::name_of(t)));
  };

  std::vector<HostTensor> buffers;
  std::vector<nc_named_tensor> inputs;
  buffers.reserve(c.inputs.size());
  for (const auto& [name, t] : c.inputs) {
    if (!quant_float32_tensor(c, name)) covered(name, t.dtype, d.dtypes);
    auto& b = buffers.emplace_back(t.dtype, t.shape, layout_);
    if (static_cast<std::size_t>(b.numel()) != t.data.size())
      throw ref::CaseError("inputs/" + name, fmt::format("holds {} values for a shape of {} elements",
                                                         t.data.size(), b.numel()));
    b.store_all(t.data, "inputs/" + name);
    inputs.push_back({name.c_str(), b.view(), 0});
  }

  const auto specs = output_specs(c);
  std::vector<HostTensor> out_buffers;
  std::vector<CodeBuffer> code_buffers;  // code outputs (quantized cases), in the order of specs
  std::vector<nc_named_tensor> outputs;
  out_buffers.reserve(specs.size());
  code_buffers.reserve(specs.size());
  for (const auto& [name, spec] : specs) {
    if (!spec.codes.empty()) {
      // Codes have no NaN: 0xFF bytes (the NaN code of E4M3, E5M2 and E8M0), and another
      // pattern for the property tests' second call.
      auto& b = code_buffers.emplace_back(spec, std::isnan(sentinel_) ? std::uint8_t{0xFF} : std::uint8_t{0x5A});
      outputs.push_back({name.c_str(), b.view(), 0});
      continue;
    }
    if (!quant_float32_tensor(c, name)) covered(name, spec.dtype, d.dtypes | d.compute_dtypes);
    auto& b = out_buffers.emplace_back(spec.dtype, spec.shape);
    // The sentinel: an element the candidate never writes stays NaN and cannot pass (or holds
    // the second pattern set by set_output_sentinel, rounded to the output's dtype).
    const double fill = std::isnan(sentinel_) ? sentinel_ : ref::round_to(sentinel_, spec.dtype);
    b.fill(fill);
    outputs.push_back({name.c_str(), b.view(), 0});
  }
  const std::vector<nc_named_tensor> given = outputs;  // what the plugin must leave as it is

  int rc = 0;
  char err[kMessageLen] = {};
  {
    std::lock_guard<std::mutex> guard(lock());
    FenvGuard fenv;
    try {
      rc = d.run(state_, view.get(), inputs.data(), static_cast<std::int32_t>(inputs.size()), outputs.data(),
                 static_cast<std::int32_t>(outputs.size()), err, sizeof err);
    } catch (const std::exception& e) {
      throw CandidateError(fmt::format("plugin run threw a C++ exception across the C ABI: {}", e.what()));
    } catch (...) {
      throw CandidateError("plugin run threw a C++ exception across the C ABI");
    }
  }
  if (rc != 0) {
    const std::string why = message_of(err, sizeof err);
    throw CandidateError(why.empty() ? fmt::format("plugin run returned {} without a message", rc)
                                     : fmt::format("plugin run returned {}: {}", rc, why));
  }

  // A code buffer overrun, or a code output's nc_tensor changed (a plugin that thinks it returns
  // a buffer, a dtype or a shape of its own), is a broken case, said plainly (candidate.h nc_quant).
  {
    std::size_t i = 0, k = 0;
    for (const auto& [name, spec] : specs) {
      if (!spec.codes.empty()) {
        if (auto why = code_buffers[k++].overrun(name)) throw CandidateError(*why);
        const nc_tensor& was = given[i].tensor;
        const nc_tensor& now = outputs[i].tensor;
        if (now.data != was.data || now.dtype != was.dtype || now.rank != was.rank || now.shape != was.shape ||
            now.strides != was.strides)
          throw CandidateError(fmt::format(
              "the plugin changed the nc_tensor of output '{}' (dtype {} -> {}, rank {} -> {}, or its data, shape or "
              "strides pointer): outputs are allocated by the host; write the codes into the buffer given, as its "
              "dtype (NC_UINT8 / NC_INT8) and shape say",
              name, was.dtype, now.dtype, was.rank, now.rank));
      }
      ++i;
    }
  }

  // Read back from our own buffers, whatever the plugin did to the nc_tensor fields of the other
  // outputs; an output left at written = 0 is left out (MISSING).
  Outputs result;
  std::size_t i = 0, k = 0, f = 0;
  for (const auto& [name, spec] : specs) {
    const bool codes = !spec.codes.empty();
    if (outputs[i].written != 0) result.emplace(name, codes ? code_buffers[k].to_tensor() : out_buffers[f].to_tensor());
    ++(codes ? k : f);
    ++i;
  }
  return result;
}

}  // namespace

std::unique_ptr<Candidate> make_candidate_from(const std::string& path, std::string name,
                                               CandidateKind kind) {
  Loaded loaded = load(path);
  CandidateInfo info = info_of(*loaded.descriptor, std::move(name), kind);
  return std::make_unique<PluginCandidate>(std::move(loaded), std::move(info));
}

std::unique_ptr<Candidate> make_declining(CandidateInfo info, std::string reason) {
  return std::make_unique<DecliningCandidate>(std::move(info), std::move(reason));
}

}  // namespace plugin

std::unique_ptr<Candidate> make_plugin_candidate(const std::string& path) {
  return plugin::make_candidate_from(path, "plugin:" + path, CandidateKind::external);
}

}  // namespace normcheck::conf
