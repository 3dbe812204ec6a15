// `normcheck reference`: evaluate one small case with the certified reference and print every
// output in decimal and hex float with its certified flag. A debugging aid.
#include <fmt/core.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "normcheck/reference/case_json.hpp"
#include "normcheck/reference/contract.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "normcheck/version.hpp"

namespace normcheck::cli {
namespace {

struct ReferenceArgs {
  std::string case_file;
  std::string op = "layernorm";
  std::string shape, x, weight, bias, residual, residual_bias, dy;
  std::string epsilon = "1e-5";
  std::string dtype = "float32", dtype_param, dtype_out, dtype_compute = "float32", dtype_residual;
  std::string contract = "exact", direction = "forward";
  std::int64_t axis = -1;
  std::vector<std::int64_t> axes;
  double weight_offset = 0, alpha = 1;
  bool json = false, all = false, no_fast_path = false;
  int max_bits = 2048;
  std::size_t limit = 64;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string item;
  std::stringstream in(s);
  while (std::getline(in, item, ',')) {
    const auto b = item.find_first_not_of(" \t");
    const auto e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

nlohmann::json tensor_json(const std::string& values, const std::vector<std::int64_t>& shape) {
  return {{"shape", shape}, {"data", split_list(values)}};
}

std::vector<std::int64_t> parse_shape(const std::string& s) {
  std::vector<std::int64_t> out;
  for (const auto& d : split_list(s)) {
    try {
      std::size_t used = 0;
      out.push_back(std::stoll(d, &used));
      if (used != d.size()) throw std::invalid_argument(d);
    } catch (const std::exception&) {
      throw ref::CaseError("--shape", "'" + d + "' is not an integer");
    }
  }
  return out;
}

// Builds the case JSON from the command-line flags.
nlohmann::json inline_case(const ReferenceArgs& a) {
  if (a.x.empty()) throw ref::CaseError("--x", "give the input values (or --case FILE)");
  const auto x_values = split_list(a.x);
  std::vector<std::int64_t> shape = a.shape.empty()
                                        ? std::vector<std::int64_t>{static_cast<std::int64_t>(x_values.size())}
                                        : parse_shape(a.shape);
  nlohmann::json j = {{"op", a.op},
                      {"axis", a.axis},
                      {"epsilon", a.epsilon},
                      {"weight_offset", a.weight_offset},
                      {"alpha", a.alpha},
                      {"contract", a.contract},
                      {"direction", a.direction},
                      {"dtype_x", a.dtype},
                      {"dtype_param", a.dtype_param.empty() ? a.dtype : a.dtype_param},
                      {"dtype_out", a.dtype_out.empty() ? a.dtype : a.dtype_out},
                      {"dtype_compute", a.dtype_compute},
                      {"dtype_residual", a.dtype_residual.empty() ? a.dtype : a.dtype_residual}};
  if (!a.axes.empty()) j["axes"] = a.axes;
  // The shape of the normalized dims, for weight/bias: from --axes or --axis.
  const auto rank = static_cast<std::int64_t>(shape.size());
  std::vector<std::int64_t> pshape;
  if (!a.axes.empty()) {
    auto axes = a.axes;
    for (auto& d : axes) d = d < 0 ? d + rank : d;
    std::sort(axes.begin(), axes.end());
    for (auto d : axes)
      if (d >= 0 && d < rank) pshape.push_back(shape[d]);
  } else {
    for (auto d = a.axis < 0 ? a.axis + rank : a.axis; d >= 0 && d < rank; ++d) pshape.push_back(shape[d]);
  }
  nlohmann::json inputs = {{"x", tensor_json(a.x, shape)}};
  j["affine"] = a.bias.empty() ? (a.weight.empty() ? "none" : "weight") : "weight_bias";
  if (!a.bias.empty() && a.weight.empty()) throw ref::CaseError("--bias", "needs --weight too");
  if (!a.weight.empty()) inputs["weight"] = tensor_json(a.weight, pshape);
  if (!a.bias.empty()) inputs["bias"] = tensor_json(a.bias, pshape);
  j["residual"] = a.residual.empty() ? "none" : (a.residual_bias.empty() ? "add" : "add_bias");
  if (!a.residual.empty()) inputs["residual"] = tensor_json(a.residual, shape);
  if (!a.residual_bias.empty()) inputs["residual_bias"] = tensor_json(a.residual_bias, pshape);
  if (!a.dy.empty()) inputs["dy"] = tensor_json(a.dy, shape);
  j["inputs"] = std::move(inputs);
  return j;
}

std::string index_text(std::size_t flat, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> idx(shape.size());
  auto rest = static_cast<std::int64_t>(flat);
  for (auto d = static_cast<std::int64_t>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = rest % shape[d];
    rest /= shape[d];
  }
  std::string s = "[";
  for (std::size_t i = 0; i < idx.size(); ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
  return s + "]";
}

void print_text(const ref::Case& c, const ref::Result& r, const ReferenceArgs& a) {
  const auto contract = ref::parse_contract(c.contract);
  fmt::print("case: {} {} eps={} ({}) affine={} offset={} residual={} contract={}\n", ref::name_of(c.op),
             c.axes ? "axes given" : fmt::format("axis={}", c.axis), ref::decimal_text(c.epsilon, ref::DType::float64),
             ref::hex_text(c.epsilon), ref::name_of(c.affine), c.weight_offset, ref::name_of(c.residual), c.contract);
  fmt::print("contract {}: {}\n", c.contract, contract->models);
  for (const auto& [name, o] : r.outputs) {
    std::string shape;
    for (auto d : o.value.shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
    fmt::print("\n{} ({}, shape {})\n", name, o.codes.empty() ? ref::name_of(o.value.dtype) : o.codes, shape);
    fmt::print("  {:<14} {:>24} {:>22} {:>24}  {}\n", "index", "value (decimal)", "value (hex)", "exact→binary64 (hex)",
               "certified");
    const std::size_t n = o.value.data.size();
    const std::size_t shown = a.all ? n : std::min(n, a.limit);
    for (std::size_t i = 0; i < shown; ++i) {
      const auto code = static_cast<int>(o.value.data[i]);  // codes: the integer and its bits in hex
      fmt::print("  {:<14} {:>24} {:>22} {:>24}  {}{}\n", index_text(i, o.value.shape),
                 o.codes.empty() ? ref::decimal_text(o.value.data[i], o.value.dtype) : std::to_string(code),
                 o.codes.empty() ? ref::hex_text(o.value.data[i]) : fmt::format("{:#04x}", code & 0xFF),
                 ref::hex_text(o.f64[i]), o.certified[i] ? "yes" : "NO (either neighbour accepted)",
                 !o.ties.empty() && o.ties[i] ? "  tie: the exact value is on a code boundary" : "");
    }
    if (shown < n) fmt::print("  ... {} more (--all shows every element)\n", n - shown);
  }
  fmt::print("\n{} elements, {} uncertified; {} decided by the double-double path, {} by MPFR{}\n", r.stats.elements,
             r.stats.uncertified, r.stats.fast, r.stats.slow,
             r.stats.max_bits_used ? fmt::format(" (up to {} bits)", r.stats.max_bits_used) : std::string());
}

}  // namespace

Runner add_reference_command(CLI::App& app) {
  auto args = std::make_shared<ReferenceArgs>();
  auto* cmd = app.add_subcommand("reference",
                                 "Evaluate one small case with the certified reference and print every output "
                                 "(decimal, hex float, certified flag)");
  cmd->footer(
      "Examples:\n"
      "  normcheck reference --x 1,2,3,4 --weight 1,1,1,1 --bias 0,0,0,0\n"
      "  normcheck reference --op rmsnorm --shape 2,3 --x 1,2,3,4,5,6 --dtype bfloat16 --dtype-compute float32\n"
      "  normcheck reference --case case.json --json      (format: reference/CASE_JSON.md)");
  cmd->add_option("--case", args->case_file, "Case JSON file ('-' for stdin); overrides the inline flags");
  cmd->add_option("--op", args->op, "layernorm | rmsnorm")->capture_default_str();
  cmd->add_option("--shape", args->shape, "Shape of x, comma separated (default: 1-D)");
  cmd->add_option("--x", args->x, "Values of x, comma separated (decimal, hex float, nan, inf)");
  cmd->add_option("--weight", args->weight, "Values of the weight (shape of the normalized dims)");
  cmd->add_option("--bias", args->bias, "Values of the bias");
  cmd->add_option("--residual", args->residual, "Values of the residual (fused add)");
  cmd->add_option("--residual-bias", args->residual_bias, "Values of the residual bias");
  cmd->add_option("--dy", args->dy, "Values of dy (with --direction backward)");
  cmd->add_option("--direction", args->direction, "forward | backward")->capture_default_str();
  cmd->add_option("--axis", args->axis, "ONNX axis: normalize dims [axis, rank)")->capture_default_str();
  cmd->add_option("--axes", args->axes, "Explicit normalized dims (comma separated)")->delimiter(',');
  cmd->add_option("--eps,--epsilon", args->epsilon, "Epsilon (decimal or hex float)")->capture_default_str();
  cmd->add_option("--offset,--weight-offset", args->weight_offset, "scale = offset + weight");
  cmd->add_option("--alpha", args->alpha, "h = alpha*x + residual");
  cmd->add_option("--dtype", args->dtype, "dtype of x (and default of the others)")->capture_default_str();
  cmd->add_option("--dtype-param", args->dtype_param, "dtype of weight/bias");
  cmd->add_option("--dtype-out", args->dtype_out, "dtype of y");
  cmd->add_option("--dtype-compute", args->dtype_compute, "dtype of mean/rstd")->capture_default_str();
  cmd->add_option("--dtype-residual", args->dtype_residual, "dtype of residual and residual_out");
  cmd->add_option("--contract", args->contract, "Precision contract (exact, llama, gemma, te, te_wdtype, onnx, fused_add_lowp; a+b)")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print the result as JSON (reference/CASE_JSON.md)");
  cmd->add_flag("--all", args->all, "Print every element (default: the first 64 of each output)");
  cmd->add_option("--max-bits", args->max_bits, "Working-precision cap of the Ziv loop")->capture_default_str();
  cmd->add_flag("--no-fast-path", args->no_fast_path, "Use MPFR for every element");

  return [args]() -> int {
    const ReferenceArgs& a = *args;
    nlohmann::json j;
    try {
      if (!a.case_file.empty()) {
        std::ifstream file;
        std::istream* in = &std::cin;
        if (a.case_file != "-") {
          file.open(a.case_file);
          if (!file) {
            fmt::print(stderr, "normcheck reference: cannot open case file '{}'\n", a.case_file);
            return kExitBadInput;
          }
          in = &file;
        }
        j = nlohmann::json::parse(*in);
      } else {
        j = inline_case(a);
      }
    } catch (const nlohmann::json::parse_error& e) {
      fmt::print(stderr, "normcheck reference: '{}' is not valid JSON: {}\n", a.case_file, e.what());
      return kExitBadInput;
    } catch (const ref::CaseError& e) {
      fmt::print(stderr, "normcheck reference: {}\n", e.what());
      return kExitBadInput;
    }
    try {
      const ref::Case c = ref::case_from_json(j);
      ref::Options opt;
      opt.max_bits = a.max_bits;
      opt.fast_path = !a.no_fast_path;
      const ref::Result r = ref::evaluate(c, opt);
      if (a.json) fmt::print("{}\n", ref::result_to_json(c, r, kVersion).dump());
      else print_text(c, r, a);
    } catch (const ref::CaseError& e) {
      fmt::print(stderr, "normcheck reference: invalid case: {}\n", e.what());
      return kExitBadInput;
    } catch (const nlohmann::json::exception& e) {
      fmt::print(stderr, "normcheck reference: invalid case: {}\n", e.what());
      return kExitBadInput;
    }
    return kExitOk;
  };
}

}  // namespace normcheck::cli
