// A case: one normalization problem instance, in the vocabulary of docs/DESIGN.md ("Semantics").
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "normcheck/reference/dtype.hpp"
#include "normcheck/reference/enum_table.hpp"
#include "normcheck/reference/quant.hpp"

namespace normcheck::ref {

enum class Op : std::uint8_t { layernorm, rmsnorm };
enum class Affine : std::uint8_t { none, weight, weight_bias };
enum class Residual : std::uint8_t { none, add, add_bias };
enum class Block : std::uint8_t { none, post, pre, sandwich, deepnorm };
enum class Direction : std::uint8_t { forward, backward };
enum class Activation : std::uint8_t { gelu, relu };  // gelu: the exact erf form

// The value tables (enum_table.hpp): a new value of any of these is one row here.
template <>
struct EnumTable<Op> {
  static constexpr std::array rows{Named<Op>{Op::layernorm, "layernorm"}, Named<Op>{Op::rmsnorm, "rmsnorm"}};
};
template <>
struct EnumTable<Affine> {
  static constexpr std::array rows{Named<Affine>{Affine::none, "none"}, Named<Affine>{Affine::weight, "weight"},
                                   Named<Affine>{Affine::weight_bias, "weight_bias"}};
};
template <>
struct EnumTable<Residual> {
  static constexpr std::array rows{Named<Residual>{Residual::none, "none"}, Named<Residual>{Residual::add, "add"},
                                   Named<Residual>{Residual::add_bias, "add_bias"}};
};
template <>
struct EnumTable<Block> {
  static constexpr std::array rows{Named<Block>{Block::none, "none"}, Named<Block>{Block::post, "post"},
                                   Named<Block>{Block::pre, "pre"}, Named<Block>{Block::sandwich, "sandwich"},
                                   Named<Block>{Block::deepnorm, "deepnorm"}};
};
template <>
struct EnumTable<Direction> {
  static constexpr std::array rows{Named<Direction>{Direction::forward, "forward"},
                                   Named<Direction>{Direction::backward, "backward"}};
};
template <>
struct EnumTable<Activation> {
  static constexpr std::array rows{Named<Activation>{Activation::gelu, "gelu"},
                                   Named<Activation>{Activation::relu, "relu"}};
};

inline std::string_view name_of(Op v) { return enum_name(v); }
inline std::string_view name_of(Affine v) { return enum_name(v); }
inline std::string_view name_of(Residual v) { return enum_name(v); }
inline std::string_view name_of(Block v) { return enum_name(v); }
inline std::string_view name_of(Direction v) { return enum_name(v); }
inline std::string_view name_of(Activation v) { return enum_name(v); }

// A dense row-major tensor whose elements are values of `dtype`, held exactly as binary64.
struct Tensor {
  DType dtype = DType::float32;
  std::vector<std::int64_t> shape;
  std::vector<double> data;

  std::int64_t numel() const;
};

// Raised for any invalid case; `field` names what is wrong ("epsilon", "inputs/weight" ...).
class CaseError : public std::runtime_error {
 public:
  CaseError(std::string field, const std::string& message);
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

struct Case {
  Op op = Op::layernorm;
  // ONNX semantics: normalize over dims [axis, rank); negative counts from the end.
  std::int64_t axis = -1;
  // Explicit normalized dims (any order given, used sorted); overrides `axis` when present.
  std::optional<std::vector<std::int64_t>> axes;
  double epsilon = 1e-5;
  Affine affine = Affine::weight_bias;
  double weight_offset = 0.0;  // scale = weight_offset + weight (Gemma-style zero-centred: 1)
  Residual residual = Residual::none;
  double alpha = 1.0;  // h = alpha * x + residual (+ residual_bias)
  Block block = Block::none;
  // Blocks: L layers, each with a position-wise FFN F(v) = W2 act(W1 v + b1) + b2; inputs
  // ffn_w1 [L, D_ff, D], ffn_b1 [L, D_ff], ffn_w2 [L, D, D_ff], ffn_b2 [L, D], and the norms'
  // weight/bias [L, K, D] (K = 2 for sandwich, else 1). See reference/README.md.
  std::int64_t layers = 1;
  Activation activation = Activation::gelu;
  Direction direction = Direction::forward;
  std::string contract = "exact";
  DType dtype_x = DType::float32;
  DType dtype_param = DType::float32;
  DType dtype_out = DType::float32;
  DType dtype_compute = DType::float32;
  DType dtype_residual = DType::float32;  // dtype of `residual` input and `residual_out`

  // inputs: x, and as the case needs: weight, bias, residual, residual_bias, dy
  std::map<std::string, Tensor> inputs;

  // Fused quantization of the output (quant.hpp): when set, the case's outputs are q, its
  // scales and optionally amax, y and residual_out (outputs.hpp); a static scale is the input
  // `scale` (float32, shape [1]).
  std::optional<QuantContract> quant;

  // The fixture case id when the case comes from a fixture file ("" otherwise): passed to
  // candidates for their messages; never part of the semantics.
  std::string id;
};

// Where the normalized dims are: rows are the index set of the other dims (in order),
// columns the index set of the normalized dims (in order). Offsets are into the row-major x.
struct Geometry {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> norm_dims;   // sorted
  std::vector<std::int64_t> param_shape;  // extents of the normalized dims
  std::vector<std::int64_t> stat_shape;   // shape with normalized dims set to 1
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<std::int64_t> row_base;   // offset of element (row, 0)
  std::vector<std::int64_t> col_delta;  // offset of element (row, c) minus row_base[row]
};

// Hard limits that keep an absurd case from exhausting memory: reported as CaseError.
inline constexpr std::int64_t kMaxElements = std::int64_t{1} << 31;
inline constexpr std::int64_t kMaxRank = 8;
inline constexpr std::int64_t kMaxLayers = 64;

Geometry geometry_of(const Case& c);  // validates shape/axis; throws CaseError
void validate(const Case& c);         // full validation; throws CaseError

namespace detail {
// validate() with the check that every x value belongs to dtype_x optional: evaluate() leaves
// it out for float32 rows it checks itself from the row scan, and checks the rest element by
// element, with the same error.
void validate(const Case& c, bool x_values);
}  // namespace detail

}  // namespace normcheck::ref
