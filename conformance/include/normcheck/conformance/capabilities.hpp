// What a candidate declares it supports, and the one table of its fields: the subprocess
// protocol's hello (PROTOCOL.md) reads and writes it, `normcheck candidates` prints it as a line
// and as JSON (capabilities_json.hpp), all by looping over for_each_capability. A new capability
// is a field below and one line of the table.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "normcheck/judge/tolerance.hpp"
#include "normcheck/reference/case.hpp"
#include "normcheck/reference/quant.hpp"

namespace normcheck::conf {

// What a candidate declares it supports. A case outside it is UNSUPPORTED, never run.
struct Capabilities {
  std::vector<ref::Op> ops{ref::Op::layernorm, ref::Op::rmsnorm};
  // Dtypes it accepts for x, parameters, outputs and residual (each must be in the list).
  std::vector<ref::DType> dtypes{ref::DType::float32, ref::DType::float16, ref::DType::bfloat16};
  // Accumulation dtypes (the case's dtype_compute) it implements.
  std::vector<ref::DType> compute_dtypes{ref::DType::float32};
  std::vector<ref::Direction> directions{ref::Direction::forward, ref::Direction::backward};
  // Contract names it implements; "*" is any, "a+b" combinations are taken when each part is.
  std::vector<std::string> contracts{"*"};
  bool residual = true;      // fused add (residual add / add_bias)
  bool blocks = false;       // post / pre / sandwich / deepnorm blocks
  bool general_axes = true;  // axis other than the last dim, explicit axes
  bool weight_offset = true; // weight_offset != 0
  // The reduction order may depend on the batch size and the inputs' memory layout (candidate.h
  // NC_CAP_BATCH_DEPENDENT_ORDER): batch and layout invariance then hold within tolerance only.
  bool batch_dependent_order = false;
  // Subnormal output values may come back as zero (candidate.h NC_CAP_FLUSH_SUBNORMAL_OUTPUTS):
  // the checker and the relations accept a zero within its allowance plus the output dtype's
  // smallest normal, and count it apart (OutputResult::flushed).
  bool flush_subnormal_outputs = false;
  // The candidate returns no mean/rstd (candidate.h NC_CAP_NO_STATISTICS): they are not judged.
  bool no_statistics = false;
  // How its sums are formed (candidate.h NC_CAP_REDUCTION; TOLERANCE.md, section 9): `any`
  // holds it to every correct algorithm; a narrower class to that class's (smaller) bound.
  Reduction reduction;
  // Fused norm + quantization (cases with `quant`, reference/README.md "Quantized outputs"): the
  // code formats and the scale kinds it implements; a quantized case is taken when both its
  // format and its scale kind are listed (so both empty, the default, takes none). In memory a
  // candidate returns q as one code per element (NVFP4 unpacked) held as an exact integer, block
  // scales as codes; the plugin ABI (candidate.h nc_quant) and the protocol carry them as the
  // fixture stores them, uint8/int8 with NVFP4 packed two per byte (quant_wire.hpp converts).
  std::vector<ref::QFormat> quant_formats{};
  std::vector<ref::ScaleKind> quant_scales{};
  std::string device = "cpu";
};

// A capability's name in JSON, and how the one-line text of `normcheck candidates` shows it:
// a list as `text` followed by its names joined by ","; a flag as `text` when set and
// `text_off` when not (empty: nothing shown); the reduction class as `text` and its name unless
// it is `any`; the device as it is. A list with `hide_empty` is not shown when empty.
struct CapabilityField {
  std::string_view name;
  std::string_view text;
  std::string_view text_off = {};
  bool hide_empty = false;
};

// The table: every field the plugin ABI and the protocol carry, in the order they are written.
// `Caps` is Capabilities or const Capabilities; f(field, member).
template <class Caps, class F>
  requires std::is_same_v<std::remove_const_t<Caps>, Capabilities>
void for_each_capability(Caps& c, F&& f) {
  f(CapabilityField{"ops", ""}, c.ops);
  f(CapabilityField{"dtypes", ""}, c.dtypes);
  f(CapabilityField{"compute_dtypes", "compute "}, c.compute_dtypes);
  f(CapabilityField{"directions", ""}, c.directions);
  f(CapabilityField{"contracts", "contracts "}, c.contracts);
  f(CapabilityField{"residual", "residual"}, c.residual);
  f(CapabilityField{"blocks", "blocks"}, c.blocks);
  f(CapabilityField{"general_axes", "any axes", "last axis"}, c.general_axes);
  f(CapabilityField{"weight_offset", ""}, c.weight_offset);
  f(CapabilityField{"batch_dependent_order", ""}, c.batch_dependent_order);
  f(CapabilityField{"flush_subnormal_outputs", "flushes subnormal outputs"}, c.flush_subnormal_outputs);
  f(CapabilityField{"no_statistics", ""}, c.no_statistics);
  f(CapabilityField{"reduction", "reduction "}, c.reduction);
  f(CapabilityField{"quant_formats", "quant ", {}, true}, c.quant_formats);
  f(CapabilityField{"quant_scales", "quant scales ", {}, true}, c.quant_scales);
  f(CapabilityField{"device", ""}, c.device);
}

// The name of one element of a capability list (an op, a dtype, a direction, a contract).
template <class T>
std::string capability_item_name(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) return v;
  else return std::string(ref::name_of(v));
}

// One line: "layernorm,rmsnorm | float32,float16 | compute float32 | forward | contracts * |
// residual | any axes | cpu" (`normcheck candidates`).
inline std::string capabilities_text(const Capabilities& caps) {
  std::string out;
  const auto piece = [&](std::string_view s) {
    if (s.empty()) return;
    if (!out.empty()) out += " | ";
    out += s;
  };
  for_each_capability(caps, [&]<class T>(const CapabilityField& f, const T& v) {
    if constexpr (std::is_same_v<T, bool>) {
      piece(v ? f.text : f.text_off);
    } else if constexpr (std::is_same_v<T, Reduction>) {
      if (!v.is_any()) piece(std::string(f.text) + name_of(v));
    } else if constexpr (std::is_same_v<T, std::string>) {
      out += (out.empty() ? "" : " | ") + v;  // the device: always shown
    } else {
      if (f.hide_empty && v.empty()) return;
      std::string names;
      for (const auto& x : v) names += (names.empty() ? "" : ",") + capability_item_name(x);
      out += out.empty() ? "" : " | ";  // a list is shown even when empty (unless hide_empty)
      out += std::string(f.text) + names;
    }
  });
  return out;
}

}  // namespace normcheck::conf
