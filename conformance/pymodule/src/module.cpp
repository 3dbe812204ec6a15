// normcheck._core: the certified reference, the fixtures and the judge (tolerance, checker,
// diagnosis) for Python. Every number comes from the C++ libraries; this file only converts
// arrays and names between Python and C++ and maps C++ exceptions to Python ones. The package
// normcheck/ (README.md) is the interface users call; _core is its private layer.
//
// Conversions: an array reaches C++ with the name of its dtype ("float64", "float32",
// "float16", "bfloat16"); bfloat16 (and float16 given as bits) arrive as uint16 bit patterns.
// Computations run with the GIL released: the arguments are copied into C++ values first.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "normcheck/fixtures/case_list.hpp"
#include "normcheck/fixtures/error.hpp"
#include "normcheck/fixtures/generate.hpp"
#include "normcheck/fixtures/hdf5_io.hpp"
#include "normcheck/judge/checker_quant.hpp"
#include "normcheck/judge/checker.hpp"
#include "normcheck/judge/declared.hpp"
#include "normcheck/judge/diagnosis.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "normcheck/reference/contract.hpp"
#include "normcheck/reference/evaluate.hpp"

namespace py = pybind11;
using namespace normcheck;

namespace {

// A Python ValueError whose message starts with the argument it is about.
struct ArgError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct ArgTypeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

ref::DType dtype_arg(const std::string& name, const char* arg) {
  if (auto t = ref::parse_dtype(name)) return *t;
  throw ArgError(std::string(arg) + ": unknown dtype '" + name + "' (float64, float32, float16, bfloat16)");
}

// A declared reduction class ("two_pass", "pairwise:128", ...; TOLERANCE.md, section 9) as the
// CLI's --reduction parses it; a bad one is a ValueError naming the argument.
conf::Reduction reduction_arg(const std::string& name) {
  try {
    return conf::parse_reduction(name);
  } catch (const std::invalid_argument& e) {
    throw ArgError(std::string("reduction: ") + e.what());
  }
}

// The field of a ref::CaseError as the Python argument that sets it.
std::string argument_of(const std::string& field) {
  if (field == "epsilon") return "eps";
  if (field.rfind("inputs/", 0) == 0) return field.substr(7);
  return field;
}

// An array of Python (C-contiguous, as the package passes it) -> a tensor of `dtype`.
ref::Tensor tensor_of(const py::array& a, const std::string& dtype_name, const std::string& arg) {
  const ref::DType t = dtype_arg(dtype_name, arg.c_str());
  if (!(a.flags() & py::array::c_style)) throw ArgTypeError(arg + ": the array must be C-contiguous");
  const char kind = a.dtype().kind();
  const auto item = static_cast<std::size_t>(a.itemsize());
  const bool bits16 = (t == ref::DType::bfloat16 || t == ref::DType::float16) && kind == 'u' && item == 2;
  const bool native = kind == 'f' && item == ref::storage_bytes(t);
  if (!bits16 && !native)
    throw ArgTypeError(arg + ": an array of " + std::string(py::str(a.dtype())) + " cannot hold " +
                       std::string(ref::name_of(t)) + " values");
  ref::Tensor out;
  out.dtype = t;
  for (py::ssize_t d = 0; d < a.ndim(); ++d) out.shape.push_back(static_cast<std::int64_t>(a.shape(d)));
  const auto n = static_cast<std::size_t>(a.size());
  const auto* p = static_cast<const unsigned char*>(a.data());
  // The caller's array stays alive (`a` holds it); the copy runs without the GIL.
  py::gil_scoped_release nogil;
  out.data.resize(n);
  for (std::size_t i = 0; i < n; ++i) out.data[i] = ref::load_native(p + i * item, t);
  return out;
}

// An output to compare: the array's values as elements of the case's output dtype `t`. A float32
// array for a bfloat16 output (what reference() returns for one) must hold bfloat16 values.
ref::Tensor output_of(const py::array& a, const std::string& given_dtype, ref::DType t, const std::string& arg) {
  const ref::DType given = dtype_arg(given_dtype, arg.c_str());
  if (given == t) return tensor_of(a, given_dtype, arg);
  if (!(given == ref::DType::float32 && t == ref::DType::bfloat16))
    throw ArgTypeError(arg + ": " + std::string(ref::name_of(given)) + " values for an output of dtype " +
                       std::string(ref::name_of(t)) +
                       " (give the kernel's output as it is; the case's dtypes come from reference())");
  ref::Tensor out = tensor_of(a, given_dtype, arg);
  for (std::size_t i = 0; i < out.data.size(); ++i)
    if (!ref::representable(out.data[i], t))
      throw ArgError(arg + ": element " + std::to_string(i) + " = " + ref::hex_text(out.data[i]) +
                     " is not a bfloat16 value (pass a torch.bfloat16 tensor or uint16 bits with dtype='bfloat16')");
  out.dtype = t;
  return out;
}

// A tensor -> a numpy array of its dtype; bfloat16 as float32 (every bfloat16 value is one).
py::array array_of(const ref::Tensor& t) {
  std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
  const ref::DType stored = t.dtype == ref::DType::bfloat16 ? ref::DType::float32 : t.dtype;
  py::array a(py::dtype(std::string(ref::name_of(stored))), shape);
  auto* p = static_cast<unsigned char*>(a.mutable_data());
  const std::size_t item = ref::storage_bytes(stored);
  for (std::size_t i = 0; i < t.data.size(); ++i) ref::store_native(t.data[i], stored, p + i * item);
  return a;
}

py::array f64_array(const std::vector<double>& v, const std::vector<std::int64_t>& shape) {
  py::array_t<double> a(std::vector<py::ssize_t>(shape.begin(), shape.end()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

py::array mask_array(const std::vector<std::uint8_t>& v, const std::vector<std::int64_t>& shape) {
  py::array_t<bool> a(std::vector<py::ssize_t>(shape.begin(), shape.end()));
  bool* p = a.mutable_data();
  for (std::size_t i = 0; i < v.size(); ++i) p[i] = v[i] != 0;
  return a;
}

// A fixture case: the case (attributes and inputs) with its certified outputs.
using CasePtr = std::shared_ptr<fix::FixtureCase>;

ref::Stats evaluate_case(fix::FixtureCase& fc) {
  ref::Result r;
  {
    py::gil_scoped_release nogil;
    r = ref::evaluate(fc.c);
  }
  fc.expected = std::move(r.outputs);
  return r.stats;
}

// Keeps only the named outputs (all when `names` is empty); an unknown name is an error.
void keep_outputs(fix::FixtureCase& fc, const std::vector<std::string>& names) {
  if (names.empty()) return;
  std::map<std::string, ref::Output> kept;
  for (const auto& n : names) {
    auto it = fc.expected.find(n);
    if (it == fc.expected.end()) {
      std::string have;
      for (const auto& [k, v] : fc.expected) have += (have.empty() ? "" : ", ") + k;
      throw ArgError("outputs: '" + n + "' is not an output of this case (it has " + have + ")");
    }
    kept.emplace(n, std::move(it->second));
  }
  py::gil_scoped_release nogil;  // freeing the outputs not kept (megabytes for a large case)
  fc.expected = std::move(kept);
}

struct CaseArgs {
  std::string op = "layernorm", contract = "exact", direction = "forward", id = "python_case";
  double eps = 1e-5, weight_offset = 0, alpha = 1;
  std::int64_t axis = -1;
  std::optional<std::vector<std::int64_t>> axes;
  std::optional<std::string> dtype_out, dtype_compute;
  std::vector<std::string> outputs;
};

CasePtr make_case(const std::map<std::string, std::pair<py::array, std::string>>& inputs, const CaseArgs& a) {
  fix::FixtureCase fc;
  fc.id = a.id;
  fc.category = "python";
  fc.description = "made by normcheck.reference()";
  ref::Case& c = fc.c;
  const auto op = ref::enum_parse<ref::Op>(a.op);
  if (!op) throw ArgError("op: '" + a.op + "' (layernorm or rmsnorm)");
  c.op = *op;
  const auto direction = ref::enum_parse<ref::Direction>(a.direction);
  if (!direction) throw ArgError("direction: '" + a.direction + "' (forward or backward)");
  c.direction = *direction;
  for (const auto& [name, arr] : inputs) c.inputs.emplace(name, tensor_of(arr.first, arr.second, name));
  auto has = [&](const char* n) { return c.inputs.count(n) != 0; };
  if (!has("x")) throw ArgError("x: missing");
  if (has("bias") && !has("weight")) throw ArgError("bias: given without weight (pass weight too, e.g. ones)");
  if (has("residual_bias") && !has("residual")) throw ArgError("residual_bias: given without residual");
  if (c.direction == ref::Direction::backward && !has("dy")) throw ArgError("dy: direction='backward' needs dy");
  if (c.direction == ref::Direction::forward && has("dy")) throw ArgError("dy: given with direction='forward'");
  c.affine = has("bias") ? ref::Affine::weight_bias : has("weight") ? ref::Affine::weight : ref::Affine::none;
  c.residual = has("residual_bias") ? ref::Residual::add_bias : has("residual") ? ref::Residual::add : ref::Residual::none;
  c.dtype_x = c.inputs.at("x").dtype;
  c.dtype_param = has("weight") ? c.inputs.at("weight").dtype : c.dtype_x;
  c.dtype_residual = has("residual") ? c.inputs.at("residual").dtype : c.dtype_x;
  c.dtype_out = a.dtype_out ? dtype_arg(*a.dtype_out, "dtype_out") : has("dy") ? c.inputs.at("dy").dtype : c.dtype_x;
  // The statistics are held in float32 unless x is float64 (what the kernels of every library
  // this suite models do); dtype_compute= says otherwise.
  c.dtype_compute = a.dtype_compute ? dtype_arg(*a.dtype_compute, "dtype_compute")
                                    : (c.dtype_x == ref::DType::float64 ? ref::DType::float64 : ref::DType::float32);
  c.epsilon = a.eps;
  c.axis = a.axis;
  c.axes = a.axes;
  c.weight_offset = a.weight_offset;
  c.alpha = a.alpha;
  c.contract = a.contract;
  c.id = a.id;
  ref::validate(c);
  evaluate_case(fc);
  keep_outputs(fc, a.outputs);
  return std::make_shared<fix::FixtureCase>(std::move(fc));
}

py::dict attributes_of(const ref::Case& c) {
  py::dict d;
  d["op"] = std::string(ref::name_of(c.op));
  d["direction"] = std::string(ref::name_of(c.direction));
  d["axis"] = c.axis;
  if (c.axes) d["axes"] = *c.axes;
  else d["axes"] = py::none();
  d["epsilon"] = c.epsilon;
  d["affine"] = std::string(ref::name_of(c.affine));
  d["weight_offset"] = c.weight_offset;
  d["residual"] = std::string(ref::name_of(c.residual));
  d["alpha"] = c.alpha;
  d["block"] = std::string(ref::name_of(c.block));
  d["layers"] = c.layers;
  d["contract"] = c.contract;
  d["dtype_x"] = std::string(ref::name_of(c.dtype_x));
  d["dtype_param"] = std::string(ref::name_of(c.dtype_param));
  d["dtype_out"] = std::string(ref::name_of(c.dtype_out));
  d["dtype_compute"] = std::string(ref::name_of(c.dtype_compute));
  d["dtype_residual"] = std::string(ref::name_of(c.dtype_residual));
  // Fused quantization (outputs q, scale): the preset, else the code format; None when the case
  // is not quantized. The pytest plugin leaves quantized cases out unless a marker names `quant`.
  if (c.quant) d["quant"] = c.quant->preset.empty() ? std::string(ref::name_of(c.quant->format)) : c.quant->preset;
  else d["quant"] = py::none();
  const auto x = c.inputs.find("x");
  d["shape"] = x == c.inputs.end() ? std::vector<std::int64_t>{} : x->second.shape;
  return d;
}

// The judge on one case, as the CLI's runner judges it: under the allowances of the declared
// reduction class `red` (`any`: every correct algorithm), the diagnosis of a failure that can be
// diagnosed (conf::diagnosable: not a malformed output), and where an output fails its class but
// not `any`, a reason that says the declaration is what failed (declared.hpp). Per output: the
// allowance and the error of every element (NaN where the element is mistrusted).
struct Judgement {
  conf::CaseResult result;
  std::map<std::string, std::vector<double>> allowance, error;
};

Judgement judge(const fix::FixtureCase& fc, const std::map<std::string, std::pair<py::array, std::string>>& outputs,
                bool flush_subnormal_outputs, bool diagnose, const conf::Reduction& red) {
  conf::Outputs got;
  for (const auto& [name, arr] : outputs) {
    auto it = fc.expected.find(name);
    if (it == fc.expected.end()) {
      std::string have;
      for (const auto& [k, v] : fc.expected) have += (have.empty() ? "" : ", ") + k;
      throw ArgError("outputs: '" + name + "' is not an output of this case (it has " + have + ")");
    }
    got.emplace(name, output_of(arr.first, arr.second, it->second.value.dtype, "outputs['" + name + "']"));
  }
  Judgement j;
  py::gil_scoped_release nogil;
  // Outputs the caller did not pass are not judged (a kernel that returns only y is judged on
  // y): the checker sees the case with those expected outputs only.
  std::optional<fix::FixtureCase> subset;
  if (got.size() < fc.expected.size()) {
    subset.emplace();
    subset->id = fc.id;
    subset->category = fc.category;
    subset->description = fc.description;
    subset->c = fc.c;
    for (const auto& [name, t] : got) subset->expected.emplace(name, fc.expected.at(name));
  }
  const fix::FixtureCase& judged = subset ? *subset : fc;
  conf::CheckOptions opt;
  opt.flush_subnormal_outputs = flush_subnormal_outputs;
  if (fc.c.quant) {
    // Fused norm + quantization: codes and scales by TOLERANCE.md section 10 (their allowance is
    // that of the value before quantization, not one per code: no allowance or error arrays).
    j.result = conf::check_quant_case(judged, got, opt);
    if (diagnose && conf::diagnosable(j.result)) {
      j.result.diagnosis = conf::diagnose_quant(judged, got, j.result);
      j.result.diagnosed = true;
    }
    conf::describe_case(j.result, fc);
    return j;
  }
  const auto allow = conf::derive_allowances(fc.c, red);
  j.result = conf::check_case(judged, got, allow, opt);
  if (diagnose && conf::diagnosable(j.result)) {
    j.result.diagnosis = conf::diagnose(judged, got, allow);
    j.result.diagnosed = true;
  }
  conf::explain_declared(j.result, judged, got, red, opt);
  conf::describe_case(j.result, fc);
  for (const auto& [name, e] : judged.expected) {
    const auto a = allow.find(name);
    if (a == allow.end()) continue;
    j.allowance[name] = a->second.abs;
    const auto g = got.find(name);
    if (g == got.end() || g->second.data.size() != e.value.data.size()) continue;
    std::vector<double>& err = j.error[name];
    err.resize(e.value.data.size());
    for (std::size_t i = 0; i < err.size(); ++i)
      err[i] = std::isnan(a->second.abs[i])
                   ? NAN
                   : conf::element_error(g->second.data[i], e.f64[i], e.value.data[i], e.value.dtype);
  }
  return j;
}

void write_fixture(const fix::FixtureCase& fc, const std::string& path, bool overwrite, const std::string& command) {
  fix::Provenance prov;
  prov.generator_version = NORMCHECK_VERSION_TEXT;
  prov.reference_bits = ref::Options{}.max_bits;
  prov.tier = "user";
  prov.command = command;
  // HDF5 runs one call at a time (Debian's build: one global lock), and h5py in the same process
  // calls it holding the GIL: these calls keep the GIL too.
  fix::FixtureWriter w(path, prov, overwrite);
  w.write(fc);
  w.commit();
}

// "[====>   ] 12/484 case_id" on stderr when it is a terminal.
fix::Progress terminal_progress(bool want) {
  if (!want || !isatty(2)) return {};
  return [](std::size_t done, std::size_t total, const std::string& id) {
    const std::size_t width = 30, filled = total ? done * width / total : width;
    std::fprintf(stderr, "\r[%s%s] %zu/%zu %-40.40s", std::string(filled, '=').c_str(),
                 std::string(width - filled, ' ').c_str(), done, total, id.c_str());
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "normcheck's C++ layer (private: use the normcheck package)";
  m.attr("__version__") = NORMCHECK_VERSION_TEXT;

  static py::exception<fix::FixtureError> fixture_error(m, "FixtureError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ref::CaseError& e) {
      // "epsilon: nan must be finite" -> "eps: ..."; the field names the argument.
      std::string msg = e.what();
      const std::string arg = argument_of(e.field());
      if (msg.rfind(e.field(), 0) == 0) msg = arg + msg.substr(e.field().size());
      else msg = arg + ": " + msg;
      PyErr_SetString(PyExc_ValueError, msg.c_str());
    } catch (const ArgError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const ArgTypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const fix::FixtureError& e) {
      fixture_error(e.what());
    }
  });

  py::class_<fix::FixtureCase, std::shared_ptr<fix::FixtureCase>>(m, "FixtureCase")
      .def_property_readonly("id", [](const fix::FixtureCase& fc) { return fc.id; })
      .def_property_readonly("category", [](const fix::FixtureCase& fc) { return fc.category; })
      .def_property_readonly("description", [](const fix::FixtureCase& fc) { return fc.description; })
      .def_property_readonly("attributes", [](const fix::FixtureCase& fc) { return attributes_of(fc.c); })
      .def_property_readonly("inputs",
                             [](const fix::FixtureCase& fc) {
                               py::dict d;
                               for (const auto& [k, t] : fc.c.inputs) d[py::str(k)] = array_of(t);
                               return d;
                             })
      .def_property_readonly("input_dtypes",
                             [](const fix::FixtureCase& fc) {
                               py::dict d;
                               for (const auto& [k, t] : fc.c.inputs) d[py::str(k)] = std::string(ref::name_of(t.dtype));
                               return d;
                             })
      .def_property_readonly("expected",
                             [](const fix::FixtureCase& fc) {
                               py::dict d;
                               for (const auto& [k, o] : fc.expected) d[py::str(k)] = array_of(o.value);
                               return d;
                             })
      .def_property_readonly("expected_f64",
                             [](const fix::FixtureCase& fc) {
                               py::dict d;
                               for (const auto& [k, o] : fc.expected) d[py::str(k)] = f64_array(o.f64, o.value.shape);
                               return d;
                             })
      .def_property_readonly("certified",
                             [](const fix::FixtureCase& fc) {
                               py::dict d;
                               for (const auto& [k, o] : fc.expected)
                                 d[py::str(k)] = mask_array(o.certified, o.value.shape);
                               return d;
                             })
      .def_property_readonly("output_dtypes",
                             [](const fix::FixtureCase& fc) {
                               py::dict d;
                               for (const auto& [k, o] : fc.expected) d[py::str(k)] = std::string(ref::name_of(o.value.dtype));
                               return d;
                             })
      .def(
          "judge",
          [](const fix::FixtureCase& fc, const std::map<std::string, std::pair<py::array, std::string>>& outputs,
             bool flush, bool diagnose, const std::string& reduction) {
            const conf::Reduction red = reduction_arg(reduction);
            Judgement j = judge(fc, outputs, flush, diagnose, red);
            py::dict allowance, error;
            for (const auto& [k, v] : j.allowance) allowance[py::str(k)] = f64_array(v, fc.expected.at(k).value.shape);
            for (const auto& [k, v] : j.error) error[py::str(k)] = f64_array(v, fc.expected.at(k).value.shape);
            return py::make_tuple(j.result, allowance, error);
          },
          py::arg("outputs"), py::arg("flush_subnormal_outputs") = false, py::arg("diagnose") = true,
          py::arg("reduction") = "any")
      .def(
          "with_dtype_compute",
          [](const fix::FixtureCase& fc, const std::string& dtype) {
            auto copy = std::make_shared<fix::FixtureCase>(fc);
            copy->c.dtype_compute = dtype_arg(dtype, "dtype_compute");
            std::vector<std::string> names;
            for (const auto& [k, v] : fc.expected) names.push_back(k);
            ref::validate(copy->c);
            evaluate_case(*copy);
            keep_outputs(*copy, names);
            return copy;
          },
          py::arg("dtype"))
      .def("save", &write_fixture, py::arg("path"), py::arg("overwrite") = false, py::arg("command") = "");

  m.def(
      "make_case",
      [](const std::map<std::string, std::pair<py::array, std::string>>& inputs, const std::string& op, double eps,
         std::int64_t axis, std::optional<std::vector<std::int64_t>> axes, double weight_offset, double alpha,
         const std::string& contract, std::optional<std::string> dtype_out, std::optional<std::string> dtype_compute,
         const std::string& direction, std::vector<std::string> outputs, const std::string& id) {
        CaseArgs a;
        a.op = op;
        a.eps = eps;
        a.axis = axis;
        a.axes = std::move(axes);
        a.weight_offset = weight_offset;
        a.alpha = alpha;
        a.contract = contract;
        a.dtype_out = std::move(dtype_out);
        a.dtype_compute = std::move(dtype_compute);
        a.direction = direction;
        a.outputs = std::move(outputs);
        a.id = id;
        return make_case(inputs, a);
      },
      py::arg("inputs"), py::arg("op"), py::arg("eps"), py::arg("axis"), py::arg("axes"), py::arg("weight_offset"),
      py::arg("alpha"), py::arg("contract"), py::arg("dtype_out"), py::arg("dtype_compute"), py::arg("direction"),
      py::arg("outputs"), py::arg("id"));

  py::class_<conf::Diagnosis>(m, "Diagnosis")
      .def_readonly("dialect", &conf::Diagnosis::dialect)
      .def_readonly("fault_class", &conf::Diagnosis::fault_class)
      .def_readonly("title", &conf::Diagnosis::title)
      .def_readonly("score", &conf::Diagnosis::score)
      .def_readonly("explains", &conf::Diagnosis::explains)
      .def_readonly("evidence", &conf::Diagnosis::evidence)
      .def_readonly("parameters", &conf::Diagnosis::parameters)
      .def_readonly("same_as", &conf::Diagnosis::same_as);

  py::class_<conf::OutputResult>(m, "OutputResult")
      .def_readonly("name", &conf::OutputResult::name)
      .def_property_readonly("verdict", [](const conf::OutputResult& o) { return std::string(conf::name_of(o.verdict)); })
      .def_readonly("reason", &conf::OutputResult::reason)
      .def_readonly("elements", &conf::OutputResult::elements)
      .def_readonly("failed", &conf::OutputResult::failed)
      .def_readonly("mistrusted", &conf::OutputResult::mistrusted)
      .def_readonly("uncertified", &conf::OutputResult::uncertified)
      .def_readonly("flushed", &conf::OutputResult::flushed)
      .def_readonly("max_ulp", &conf::OutputResult::max_ulp)
      .def_readonly("max_abs", &conf::OutputResult::max_abs)
      .def_readonly("max_rel", &conf::OutputResult::max_rel)
      .def_readonly("max_ratio", &conf::OutputResult::max_ratio)
      .def_readonly("sensitivity", &conf::OutputResult::sensitivity)
      .def_readonly("probes", &conf::OutputResult::probes)
      .def_readonly("worst_index", &conf::OutputResult::worst_index)
      .def_readonly("worst_coords", &conf::OutputResult::worst_coords)
      .def_readonly("worst_got", &conf::OutputResult::worst_got)
      .def_readonly("worst_expected", &conf::OutputResult::worst_expected)
      .def_readonly("worst_exact", &conf::OutputResult::worst_exact)
      .def_readonly("worst_allowance", &conf::OutputResult::worst_allowance)
      .def_property_readonly("dtype", [](const conf::OutputResult& o) { return std::string(ref::name_of(o.dtype)); });

  py::class_<conf::CaseResult>(m, "CaseResult")
      .def_readonly("case_id", &conf::CaseResult::case_id)
      .def_property_readonly("verdict", [](const conf::CaseResult& r) { return std::string(conf::name_of(r.verdict)); })
      .def_readonly("message", &conf::CaseResult::message)
      .def_readonly("outputs", &conf::CaseResult::outputs)
      .def_readonly("diagnosis", &conf::CaseResult::diagnosis)
      .def_readonly("diagnosed", &conf::CaseResult::diagnosed)
      .def_readonly("row_mean_over_sigma", &conf::CaseResult::row_mean_over_sigma)
      .def_property_readonly("diagnosis_text", [](const conf::CaseResult& r) {
        return r.diagnosed ? conf::describe_diagnosis(r.diagnosis) : std::string();
      });

  py::class_<fix::FixtureReader>(m, "FixtureFile")
      .def(py::init([](const std::string& path) { return std::make_unique<fix::FixtureReader>(path); }),
           py::arg("path"))
      .def_property_readonly("case_ids", &fix::FixtureReader::case_ids)
      .def_property_readonly("provenance",
                             [](const fix::FixtureReader& r) {
                               const fix::Provenance& p = r.provenance();
                               py::dict d;
                               d["generator"] = p.generator;
                               d["generator_version"] = p.generator_version;
                               d["reference_bits"] = p.reference_bits;
                               d["seed"] = p.seed;
                               d["tier"] = p.tier;
                               d["command"] = p.command;
                               d["shard"] = p.shard;
                               return d;
                             })
      .def("read", [](const fix::FixtureReader& r, const std::string& id) {
        if (std::find(r.case_ids().begin(), r.case_ids().end(), id) == r.case_ids().end())
          throw ArgError("case_id: no case '" + id + "' in the file");
        // A damaged case is refused, naming its dataset (and only that case: the next read is judged anew).
        return std::make_shared<fix::FixtureCase>(r.read_case_later(id).finish_checked());
      });

  py::class_<fix::CaseList>(m, "CaseList")
      .def(py::init([](const std::string& path) {
             py::gil_scoped_release nogil;
             return fix::load_case_list(path);
           }),
           py::arg("path"))
      .def_readonly("path", &fix::CaseList::path)
      .def_readonly("tier", &fix::CaseList::tier)
      .def_property_readonly("case_ids",
                             [](const fix::CaseList& l) {
                               std::vector<std::string> ids;
                               for (const auto& s : l.cases) ids.push_back(s.id);
                               std::sort(ids.begin(), ids.end());
                               return ids;
                             })
      .def(
          "attributes",
          [](const fix::CaseList& l, const std::string& id) {
            for (const auto& s : l.cases)
              if (s.id == id) return attributes_of(s.base);
            throw ArgError("case_id: no case '" + id + "' in " + l.path);
          },
          py::arg("case_id"))
      .def(
          "case",
          [](const fix::CaseList& l, const std::string& id, std::uint64_t seed) {
            auto it = std::find_if(l.cases.begin(), l.cases.end(), [&](const fix::CaseSpec& s) { return s.id == id; });
            if (it == l.cases.end()) throw ArgError("case_id: no case '" + id + "' in " + l.path);
            auto fc = std::make_shared<fix::FixtureCase>();
            fc->id = it->id;
            fc->category = it->category;
            fc->description = it->description;
            fc->c = fix::materialize(*it, seed);
            evaluate_case(*fc);
            return fc;
          },
          py::arg("case_id"), py::arg("seed") = 1);

  m.def(
      "tier_path",
      [](const std::string& tier, const std::vector<std::string>& dirs_first) {
        for (const auto& d : dirs_first) {
          std::error_code ec;
          const auto p = std::filesystem::path(d) / (tier + ".json");
          if (std::filesystem::is_regular_file(p, ec)) return p.string();
        }
        return fix::tier_path(tier);
      },
      py::arg("tier"), py::arg("dirs_first") = std::vector<std::string>{});

  m.def(
      "generate",
      [](const std::string& list_path, const std::string& output, std::uint64_t seed, int threads, bool overwrite,
         const std::string& command, bool progress) {
        fix::GenerateOptions opt;
        opt.list_path = list_path;
        opt.output = output;
        opt.seed = seed;
        opt.threads = threads;
        opt.overwrite = overwrite;
        opt.command = command;
        opt.generator_version = NORMCHECK_VERSION_TEXT;
        opt.progress = terminal_progress(progress);
        // The GIL is kept: the generator's HDF5 calls must not meet another thread's.
        const fix::Summary s = fix::generate(opt);
        py::dict d;
        d["cases"] = s.cases;
        d["elements"] = s.elements;
        d["uncertified"] = s.uncertified;
        d["bytes"] = s.bytes;
        d["seconds"] = s.seconds;
        return d;
      },
      py::arg("list_path"), py::arg("output"), py::arg("seed") = 1, py::arg("threads") = 0,
      py::arg("overwrite") = false, py::arg("command") = "", py::arg("progress") = true);

  m.def("dialect_panel", [] {
    std::vector<std::tuple<std::string, std::string, std::string>> out;
    for (const auto& d : conf::dialect_panel()) out.emplace_back(d.name, d.fault_class, d.title);
    return out;
  });
  m.def("contracts", [] {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& c : ref::builtin_contracts()) out.emplace_back(c.name, c.models);
    return out;
  });
  m.def(
      "reduction_name", [](const std::string& name) { return conf::name_of(reduction_arg(name)); },
      py::arg("reduction"));
  m.def("hex_text", &ref::hex_text, py::arg("value"));
  m.def(
      "decimal_text", [](double v, const std::string& dtype) { return ref::decimal_text(v, dtype_arg(dtype, "dtype")); },
      py::arg("value"), py::arg("dtype"));
  m.def(
      "ulp_of", [](double v, const std::string& dtype) { return conf::ulp_of(v, dtype_arg(dtype, "dtype")); },
      py::arg("value"), py::arg("dtype"));
}
