// The subprocess transport: the codec, the C++ host against a C++ child (this executable run
// with --serve, serving an oracle candidate through serve_protocol), Python children (the numpy
// example, misbehaving scripts, the PyTorch adapter) and `normcheck worker`.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "protocol.hpp"
#include "subprocess_candidate.hpp"
#include "transports.hpp"

namespace normcheck::conf {
namespace {

using ref::DType;

std::string g_self_exe;  // this test executable, for --serve children

const std::string kSource = NORMCHECK_SOURCE_DIR;
const std::string kPython = NORMCHECK_PYTHON_EXE;
const std::string kNormcheck = NORMCHECK_EXE;

std::string python_dir() { return kSource + "/conformance/python"; }  // the protocol module, numpy_candidate.py
std::string torch_adapter() { return kSource + "/conformance/candidates/torch/torch_adapter.py"; }
std::string helper() { return kSource + "/conformance/subprocess/tests/helpers/misbehave.py"; }

bool same_value(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

// Random values of dtype t, normal(mu, sigma) rounded to the dtype.
std::vector<double> values(std::size_t n, DType t, std::uint64_t seed, double mu = 0, double sigma = 1) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(mu, sigma);
  std::vector<double> v(n);
  for (auto& x : v) x = ref::round_to(dist(gen), t);
  return v;
}

ref::Tensor tensor(DType t, std::vector<std::int64_t> shape, std::uint64_t seed, double mu = 0,
                   double sigma = 1) {
  ref::Tensor out;
  out.dtype = t;
  out.shape = std::move(shape);
  out.data = values(static_cast<std::size_t>(out.numel()), t, seed, mu, sigma);
  return out;
}

// A valid case: x [rows, cols], affine as asked, everything in dtype t unless changed after.
ref::Case make_case(ref::Op op, DType t, std::int64_t rows, std::int64_t cols,
                    ref::Affine affine = ref::Affine::weight_bias, std::uint64_t seed = 1) {
  ref::Case c;
  c.op = op;
  c.affine = affine;
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_residual = t;
  c.inputs["x"] = tensor(t, {rows, cols}, seed);
  if (affine != ref::Affine::none) c.inputs["weight"] = tensor(t, {cols}, seed + 1, 1, 0.5);
  if (affine == ref::Affine::weight_bias) c.inputs["bias"] = tensor(t, {cols}, seed + 2, 0, 0.5);
  return c;
}

void add_residual(ref::Case& c, std::uint64_t seed = 7) {
  c.residual = ref::Residual::add;
  c.inputs["residual"] = tensor(c.dtype_residual, c.inputs["x"].shape, seed);
}

void make_backward(ref::Case& c, std::uint64_t seed = 11) {
  c.direction = ref::Direction::backward;
  c.inputs["dy"] = tensor(c.dtype_out, c.inputs["x"].shape, seed);
}

// Outputs bit for bit equal to the reference's correctly rounded values.
void expect_exact(const Outputs& got, const ref::Case& c) {
  const auto want = ref::evaluate(c);
  ASSERT_EQ(got.size(), want.outputs.size());
  for (const auto& [name, o] : want.outputs) {
    ASSERT_TRUE(got.count(name)) << name;
    const auto& g = got.at(name);
    EXPECT_EQ(g.dtype, o.value.dtype) << name;
    EXPECT_EQ(g.shape, o.value.shape) << name;
    ASSERT_EQ(g.data.size(), o.value.data.size()) << name;
    for (std::size_t i = 0; i < g.data.size(); ++i)
      ASSERT_TRUE(same_value(g.data[i], o.value.data[i]))
          << name << "[" << i << "]: " << std::hexfloat << g.data[i] << " vs " << o.value.data[i];
  }
}

// Every output the reference computes is present and within `ulps` units in the last place of
// its dtype, measured at max(|expected|, floor) (normalized outputs are O(1); measuring at a
// value near zero would charge the candidate for cancellation in y = xhat*w + b).
void expect_close(const Outputs& got, const ref::Case& c, double ulps, double floor = 1.0,
                  const std::vector<std::string>& skip = {}) {
  const auto want = ref::evaluate(c);
  for (const auto& [name, o] : want.outputs) {
    if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
    ASSERT_TRUE(got.count(name)) << "missing output " << name;
    const auto& g = got.at(name);
    ASSERT_EQ(g.dtype, o.value.dtype) << name;
    ASSERT_EQ(g.shape, o.value.shape) << name;
    const double u = 2 * ref::unit_roundoff(o.value.dtype);  // ulp of 1
    double worst = 0;
    for (std::size_t i = 0; i < g.data.size(); ++i) {
      const double e = o.value.data[i];
      const double scale = std::exp2(std::floor(std::log2(std::max(std::fabs(e), floor))));
      worst = std::max(worst, std::fabs(g.data[i] - e) / (u * scale));
    }
    EXPECT_LE(worst, ulps) << name << ": worst error " << worst << " ulps";
  }
}

std::unique_ptr<Candidate> serve_self(const std::string& name = "oracle", double timeout_s = 10) {
  return make_subprocess_candidate({g_self_exe, "--serve"}, "cmd:" + name, timeout_s);
}

std::unique_ptr<Candidate> python(const std::vector<std::string>& args, SubprocessOptions opt) {
  std::vector<std::string> argv{kPython};
  argv.insert(argv.end(), args.begin(), args.end());
  return make_subprocess_candidate(argv, "cmd:python", opt);
}

std::unique_ptr<Candidate> misbehave(const std::string& mode, double timeout_s = 10, double hello_s = 0) {
  SubprocessOptions opt;
  opt.timeout_s = timeout_s;
  opt.hello_timeout_s = hello_s;
  return python({helper(), mode}, opt);
}

#define SKIP_WITHOUT_PYTHON() \
  if (kPython.empty()) GTEST_SKIP() << "no python3 found by CMake (NORMCHECK_PYTHON)"

// Expects `stmt` to throw exactly E (not a subclass relation in the wrong direction) with a
// message containing `part`.
template <class E, class F>
void expect_throw(F&& f, const std::string& part) {
  try {
    f();
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "message: " << e.what();
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another exception type: " << e.what();
    return;
  }
  ADD_FAILURE() << "did not throw";
}

// ---- the codec -------------------------------------------------------------------------------

TEST(Codec, KnownBitPatterns) {
  const auto bits = [](double v, DType t) {
    unsigned char b[8] = {};
    proto::encode(&v, 1, t, b);
    std::uint64_t out = 0;
    for (std::size_t i = 0; i < ref::storage_bytes(t); ++i) out |= std::uint64_t{b[i]} << (8 * i);
    return out;
  };
  EXPECT_EQ(bits(1.0, DType::float16), 0x3c00u);
  EXPECT_EQ(bits(-2.0, DType::float16), 0xc000u);
  EXPECT_EQ(bits(65504.0, DType::float16), 0x7bffu);
  EXPECT_EQ(bits(0x1p-24, DType::float16), 0x0001u);
  EXPECT_EQ(bits(0x1p-14, DType::float16), 0x0400u);
  EXPECT_EQ(bits(-0.0, DType::float16), 0x8000u);
  EXPECT_EQ(bits(NAN, DType::float16), 0x7e00u);
  EXPECT_EQ(bits(-INFINITY, DType::float16), 0xfc00u);
  EXPECT_EQ(bits(1.0, DType::bfloat16), 0x3f80u);
  EXPECT_EQ(bits(-0x1p-133, DType::bfloat16), 0x8001u);
  EXPECT_EQ(bits(NAN, DType::bfloat16), 0x7fc0u);
  EXPECT_EQ(bits(1.0, DType::float32), 0x3f800000u);
  EXPECT_EQ(bits(1.0, DType::float64), 0x3ff0000000000000u);
}

TEST(Codec, RoundTripsEveryValueClass) {
  for (DType t : {DType::float64, DType::float32, DType::float16, DType::bfloat16}) {
    const auto f = ref::format_of(t);
    std::vector<double> v{0.0,
                          -0.0,
                          1.0,
                          -1.5,
                          ref::max_finite(t),
                          -ref::max_finite(t),
                          std::ldexp(1.0, f.min_exp),                    // smallest normal
                          std::ldexp(1.0, f.min_exp - f.precision + 1),  // smallest subnormal
                          -std::ldexp(3.0, f.min_exp - f.precision + 1),
                          INFINITY,
                          -INFINITY,
                          NAN};
    const auto random = values(1000, t, 42, 0, 1e3);
    v.insert(v.end(), random.begin(), random.end());
    std::vector<unsigned char> bytes(v.size() * ref::storage_bytes(t));
    proto::encode(v.data(), v.size(), t, bytes.data(), /*check=*/true);
    proto::TensorEntry e{
        "x", t, {static_cast<std::int64_t>(v.size())}, static_cast<std::int64_t>(v.size()), bytes.size(), std::nullopt};
    const auto back = proto::decode(e, bytes.data());
    for (std::size_t i = 0; i < v.size(); ++i)
      ASSERT_TRUE(same_value(back.data[i], v[i])) << ref::name_of(t) << " " << std::hexfloat << v[i];
  }
}

TEST(Codec, CheckedEncodeRejectsValuesOutsideTheDtype) {
  const double v = 1 + 0x1p-20;  // not a float16
  unsigned char b[2];
  EXPECT_THROW(proto::encode(&v, 1, DType::float16, b, true), std::domain_error);
}

TEST(Codec, EntriesAreChecked) {
  using nlohmann::json;
  const auto entry = [](json shape, json nbytes, std::string dtype = "float32") {
    return json{{"name", "y"}, {"dtype", dtype}, {"shape", shape}, {"nbytes", nbytes}};
  };
  EXPECT_EQ(proto::parse_entry(entry({2, 3}, 24), "e").numel, 6);
  EXPECT_EQ(proto::parse_entry(entry(json::array(), 4), "e").numel, 1);
  EXPECT_EQ(proto::parse_entry(entry({0, 5}, 0), "e").nbytes, 0u);
  EXPECT_THROW(proto::parse_entry(entry({2, 3}, 25), "e"), proto::ProtocolError);
  EXPECT_THROW(proto::parse_entry(entry({-1, 3}, 12), "e"), proto::ProtocolError);
  EXPECT_THROW(proto::parse_entry(entry({65536, 65536}, 1ull << 34), "e"), proto::ProtocolError);
  EXPECT_THROW(proto::parse_entry(entry({2}, 8, "int8"), "e"), proto::ProtocolError);
  EXPECT_THROW(proto::parse_entry(entry({1, 1, 1, 1, 1, 1, 1, 1, 1}, 4), "e"), proto::ProtocolError);
  EXPECT_THROW(proto::parse_entry(entry({2.5}, 8), "e"), proto::ProtocolError);
  EXPECT_THROW(proto::parse_header("{\"type\": 3}"), proto::ProtocolError);
  EXPECT_THROW(proto::parse_header("[1]"), proto::ProtocolError);
  EXPECT_THROW(proto::parse_header("nope"), proto::ProtocolError);
}

TEST(Codec, CaseJsonRoundTrip) {
  ref::Case c = make_case(ref::Op::rmsnorm, DType::bfloat16, 2, 6);
  c.inputs["x"].shape = {2, 3, 2};
  c.inputs["weight"].shape = {3, 2};
  c.inputs["bias"].shape = {3, 2};
  c.axis = -2;
  c.epsilon = 1e-5;
  c.alpha = 0.7;
  c.weight_offset = 1;
  c.contract = "llama+fused_add_lowp";
  c.dtype_compute = DType::float32;
  c.dtype_out = DType::float16;
  const auto j = proto::case_json(c);
  EXPECT_EQ(j["norm_dims"], nlohmann::json({1, 2}));
  EXPECT_EQ(j["epsilon_hex"], "0x1.4f8b588e368f1p-17");
  EXPECT_FALSE(j.contains("axes"));
  const ref::Case back = proto::case_from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(back.op, c.op);
  EXPECT_EQ(back.axis, c.axis);
  EXPECT_EQ(back.epsilon, c.epsilon);
  EXPECT_EQ(back.alpha, c.alpha);
  EXPECT_EQ(back.weight_offset, c.weight_offset);
  EXPECT_EQ(back.contract, c.contract);
  EXPECT_EQ(back.dtype_out, DType::float16);
  EXPECT_EQ(back.dtype_x, DType::bfloat16);
  c.axes = std::vector<std::int64_t>{0};
  EXPECT_EQ(proto::case_json(c)["axes"], nlohmann::json({0}));
  EXPECT_EQ(proto::case_json(c)["norm_dims"], nlohmann::json({0}));
}

// ---- C++ child: serve_protocol with the reference as the candidate ---------------------------

// NC_CAP_BATCH_DEPENDENT_ORDER's protocol field: absent means false (bit identity), and it
// round-trips (the worker passes a plugin's declaration on to the host).
TEST(Codec, BatchDependentOrderCapability) {
  EXPECT_FALSE(proto::capabilities_from_json(nlohmann::json::object()).batch_dependent_order);
  Capabilities caps;
  caps.batch_dependent_order = true;
  EXPECT_TRUE(proto::capabilities_from_json(proto::capabilities_json(caps)).batch_dependent_order);
  EXPECT_THROW(proto::capabilities_from_json(nlohmann::json{{"batch_dependent_order", 1}}), proto::ProtocolError);
}

// NC_CAP_FLUSH_SUBNORMAL_OUTPUTS's protocol field, the same way: absent means false (zeros in place
// of subnormal outputs fail), and it round-trips through an isolated plugin's worker.
TEST(Codec, FlushSubnormalOutputsCapability) {
  EXPECT_FALSE(proto::capabilities_from_json(nlohmann::json::object()).flush_subnormal_outputs);
  Capabilities caps;
  caps.flush_subnormal_outputs = true;
  EXPECT_TRUE(proto::capabilities_from_json(proto::capabilities_json(caps)).flush_subnormal_outputs);
  EXPECT_FALSE(proto::capabilities_from_json(proto::capabilities_json(Capabilities{})).flush_subnormal_outputs);
  Capabilities no_stats;
  no_stats.no_statistics = true;
  EXPECT_TRUE(proto::capabilities_from_json(proto::capabilities_json(no_stats)).no_statistics);
  EXPECT_FALSE(proto::capabilities_from_json(nlohmann::json::object()).no_statistics);
  EXPECT_THROW(proto::capabilities_from_json(nlohmann::json{{"flush_subnormal_outputs", "yes"}}),
               proto::ProtocolError);
}

// The declared reduction class (TOLERANCE.md, section 9): absent means any; a name round-trips;
// a bad one is a protocol error naming the problem.
TEST(Codec, ReductionCapability) {
  EXPECT_TRUE(proto::capabilities_from_json(nlohmann::json::object()).reduction.is_any());
  Capabilities caps;
  caps.reduction = parse_reduction("pairwise:128");
  EXPECT_EQ(proto::capabilities_from_json(proto::capabilities_json(caps)).reduction, caps.reduction);
  EXPECT_THROW(proto::capabilities_from_json(nlohmann::json{{"reduction", "pairwise"}}), proto::ProtocolError);
  EXPECT_THROW(proto::capabilities_from_json(nlohmann::json{{"reduction", 3}}), proto::ProtocolError);
}

// The one capabilities table (capabilities.hpp): every field it lists is written and read back
// under its name, a capabilities object has exactly the table's keys, and changing any field
// from its default changes what a reader gets (a field the writer or the reader skipped would
// come back as the default). The one-line text of `normcheck candidates` comes from the table too.
TEST(Codec, EveryCapabilityOfTheTableRoundTrips) {
  Capabilities other;
  other.ops = {ref::Op::rmsnorm};
  other.dtypes = {DType::bfloat16, DType::float64};
  other.compute_dtypes = {DType::float64};
  other.directions = {ref::Direction::backward};
  other.contracts = {"llama", "te"};
  other.residual = false;
  other.blocks = true;
  other.general_axes = false;
  other.weight_offset = false;
  other.batch_dependent_order = true;
  other.flush_subnormal_outputs = true;
  other.no_statistics = true;
  other.reduction = parse_reduction("blocked:8");
  other.quant_formats = {ref::QFormat::nvfp4_e2m1, ref::QFormat::float8_e4m3fn};
  other.quant_scales = {ref::ScaleKind::static_tensor};
  other.device = "gpu:lavapipe";
  const nlohmann::json j = proto::capabilities_json(other);
  std::vector<std::string> names;
  for_each_capability(other, [&](const CapabilityField& f, const auto&) { names.emplace_back(f.name); });
  EXPECT_EQ(names.size(), j.size());
  const Capabilities back = proto::capabilities_from_json(j);
  for (const auto& name : names) {
    ASSERT_TRUE(j.contains(name)) << name;
    // Each field alone: from the defaults, only this key set to `other`'s value.
    const nlohmann::json one{{name, j[name]}};
    const nlohmann::json got = proto::capabilities_json(proto::capabilities_from_json(one));
    const nlohmann::json dflt = proto::capabilities_json(Capabilities{});
    EXPECT_EQ(got[name], j[name]) << name;
    EXPECT_NE(got[name], dflt[name]) << name << ": the test's value must differ from the default";
  }
  EXPECT_EQ(proto::capabilities_json(back), j);
  EXPECT_EQ(capabilities_text(other),
            "rmsnorm | bfloat16,float64 | compute float64 | backward | contracts llama,te | blocks | last axis | "
            "flushes subnormal outputs | reduction blocked:8 | quant nvfp4_e2m1,float8_e4m3fn | "
            "quant scales static_tensor | gpu:lavapipe");
  EXPECT_EQ(capabilities_text(Capabilities{}),
            "layernorm,rmsnorm | float32,float16,bfloat16 | compute float32 | forward,backward | contracts * | "
            "residual | any axes | cpu");
  // A dtype list takes the aliases parse_dtype takes; unknown names are skipped.
  EXPECT_EQ(proto::capabilities_from_json(nlohmann::json{{"dtypes", {"bf16", "float8", "float32"}}}).dtypes,
            (std::vector<DType>{DType::bfloat16, DType::float32}));
  EXPECT_THROW(proto::capabilities_from_json(nlohmann::json{{"ops", "layernorm"}}), proto::ProtocolError);
  EXPECT_THROW(proto::capabilities_from_json(nlohmann::json{{"device", 1}}), proto::ProtocolError);
}

TEST(Oracle, HelloFillsInfo) {
  auto cand = serve_self();
  EXPECT_EQ(cand->info().name, "cmd:oracle");
  EXPECT_EQ(cand->info().kind, CandidateKind::correct);
  EXPECT_NE(cand->info().description.find("oracle"), std::string::npos);
  EXPECT_TRUE(cand->info().caps.blocks);
  EXPECT_EQ(cand->info().caps.device, "test");
}

TEST(Oracle, BitExactThroughTheProtocol) {
  // The oracle child returns the reference's values: any change on the way is a codec bug.
  auto cand = serve_self();
  std::vector<ref::Case> cases;
  for (DType t : {DType::float32, DType::float16, DType::bfloat16, DType::float64}) {
    auto c = make_case(ref::Op::layernorm, t, 3, 17);
    if (t == DType::float64) c.dtype_compute = DType::float64;
    cases.push_back(c);
    auto r = make_case(ref::Op::rmsnorm, t, 4, 8, ref::Affine::weight, 5);
    add_residual(r);
    r.alpha = 0.5;
    cases.push_back(r);
    auto b = make_case(ref::Op::layernorm, t, 5, 6, ref::Affine::weight_bias, 9);
    make_backward(b);
    cases.push_back(b);
  }
  auto nf = make_case(ref::Op::rmsnorm, DType::bfloat16, 3, 4, ref::Affine::none);
  nf.inputs["x"].data = {NAN, 1, 2, 3, INFINITY, 1, 2, 3, -0.0, 0x1p-133, 4, 5};
  cases.push_back(nf);
  auto ch = make_case(ref::Op::layernorm, DType::float32, 1, 1, ref::Affine::weight);
  ch.inputs["x"] = tensor(DType::float32, {2, 3, 4}, 3);
  ch.inputs["weight"] = tensor(DType::float32, {3}, 4);
  ch.axes = std::vector<std::int64_t>{1};  // channels-first
  cases.push_back(ch);
  for (auto dir : {ref::Direction::forward, ref::Direction::backward}) {
    // A post-LN block: FFN inputs, [L, K, D] norm parameters, dffn_* outputs.
    auto blk = make_case(ref::Op::layernorm, DType::float32, 3, 4, ref::Affine::none);
    blk.block = ref::Block::post;
    blk.affine = ref::Affine::weight_bias;
    blk.inputs["weight"] = tensor(DType::float32, {1, 1, 4}, 31, 1, 0.5);
    blk.inputs["bias"] = tensor(DType::float32, {1, 1, 4}, 32);
    blk.inputs["ffn_w1"] = tensor(DType::float32, {1, 3, 4}, 33);
    blk.inputs["ffn_b1"] = tensor(DType::float32, {1, 3}, 34);
    blk.inputs["ffn_w2"] = tensor(DType::float32, {1, 4, 3}, 35);
    blk.inputs["ffn_b2"] = tensor(DType::float32, {1, 4}, 36);
    if (dir == ref::Direction::backward) make_backward(blk);
    cases.push_back(blk);
  }
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(ref::name_of(c.op)) + " " + std::string(ref::name_of(c.dtype_x)) + " " +
                 std::string(ref::name_of(c.block)) + " " + std::string(ref::name_of(c.direction)));
    expect_exact(cand->run(c), c);
  }
}

TEST(Oracle, CandidateExceptionIsAnErrorReplyAndTheChildGoesOn) {
  auto cand = serve_self();
  auto c = make_case(ref::Op::layernorm, DType::float32, 2, 4);
  c.epsilon = 0.125;  // the oracle throws on this epsilon
  expect_throw<CandidateError>([&] { cand->run(c); }, "asked to fail");
  c.epsilon = 1e-5;
  expect_exact(cand->run(c), c);
}

TEST(Oracle, ServerSideDeclineIsCandidateDeclined) {
  auto cand = serve_self();
  auto c = make_case(ref::Op::layernorm, DType::float32, 2, 4);
  c.epsilon = 0.25;  // the oracle's declines() refuses this epsilon
  expect_throw<CandidateDeclined>([&] { cand->run(c); }, "asked to decline");
  c.epsilon = 0.625;  // the oracle's run() throws CandidateDeclined
  expect_throw<CandidateDeclined>([&] { cand->run(c); }, "declined in run");
}

TEST(Oracle, BadOutputsOfTheServedCandidateAreErrorReplies) {
  auto cand = serve_self();
  auto c = make_case(ref::Op::layernorm, DType::float16, 2, 4);
  c.epsilon = 0.5;  // the oracle returns y with a wrong shape
  expect_throw<CandidateError>([&] { cand->run(c); }, "the case wants float16 [2, 4]");
  c.epsilon = 0.75;  // the oracle returns a y value that is not a float16
  expect_throw<CandidateError>([&] { cand->run(c); }, "is not a float16 value");
  c.epsilon = 1e-5;
  expect_exact(cand->run(c), c);
}

TEST(Oracle, SegfaultIsCrashedAndTheNextCaseGetsAFreshChild) {
  auto cand = serve_self();
  auto c = make_case(ref::Op::rmsnorm, DType::float32, 2, 4);
  c.epsilon = 0.375;  // the oracle raises SIGSEGV
  expect_throw<CandidateError>([&] { cand->run(c); }, "killed by signal 11 (SIGSEGV)");
  expect_throw<CandidateError>([&] { cand->run(c); }, "oracle crashes now");  // its stderr is quoted
  c.epsilon = 1e-5;
  expect_exact(cand->run(c), c);
}

// ---- quantized cases (PROTOCOL.md, "Quantized cases") ---------------------------------------

// RMSNorm of [2, 32] bfloat16 values quantized by `preset`: x small multiples of 1/8, weight
// near 1, a static scale of 0.25 where the preset takes one.
ref::Case quant_case(const std::string& preset) {
  ref::Case c;
  c.op = ref::Op::rmsnorm;
  c.affine = ref::Affine::weight;
  c.epsilon = 1e-6;
  c.dtype_x = c.dtype_param = c.dtype_out = DType::bfloat16;
  c.quant = ref::quant_preset(preset);
  ref::Tensor x{DType::bfloat16, {2, 32}, {}}, w{DType::bfloat16, {32}, {}};
  for (int i = 0; i < 64; ++i) x.data.push_back(((i * 37) % 29 - 14) / 8.0);
  for (int j = 0; j < 32; ++j) w.data.push_back(1 + (j % 5) / 16.0);
  c.inputs = {{"x", x}, {"weight", w}};
  if (c.quant->scale == ref::ScaleKind::static_tensor) c.inputs["scale"] = {DType::float32, {1}, {0.25}};
  ref::validate(c);
  return c;
}

TEST(Quant, CaseJsonCarriesTheContract) {
  for (const auto& [name, q] : ref::quant_presets()) {
    ref::Case c = quant_case(name);
    c.quant->scale_ub = 1200;
    c.quant->amax = true;
    const ref::Case back = proto::case_from_json(proto::case_json(c));
    ASSERT_TRUE(back.quant) << name;
    EXPECT_EQ(ref::name_of(back.quant->format), ref::name_of(c.quant->format)) << name;
    EXPECT_EQ(back.quant->scale, c.quant->scale) << name;
    EXPECT_EQ(back.quant->residual_sum, c.quant->residual_sum) << name;
    EXPECT_EQ(back.quant->value, c.quant->value) << name;
    EXPECT_EQ(back.quant->apply, c.quant->apply) << name;
    EXPECT_EQ(back.quant->mx_rule, c.quant->mx_rule) << name;
    EXPECT_EQ(back.quant->nan, c.quant->nan) << name;
    EXPECT_EQ(back.quant->scale_ub, 1200) << name;
    EXPECT_EQ(back.quant->min_scale, c.quant->min_scale) << name;
    EXPECT_TRUE(back.quant->amax) << name;
    EXPECT_FALSE(back.quant->y) << name;
    EXPECT_EQ(back.quant->preset, name);
  }
  EXPECT_FALSE(proto::case_from_json(proto::case_json(make_case(ref::Op::rmsnorm, DType::float32, 2, 8))).quant);
  nlohmann::json j = proto::case_json(quant_case("te_nvfp4"));
  j["quant"]["format"] = "float4";
  expect_throw<proto::ProtocolError>([&] { proto::case_from_json(j); }, "float4");
}

TEST(Quant, CodeOutputsAreRequestedAsTheFixtureStoresThem) {
  const auto specs = output_specs(quant_case("te_nvfp4"));
  const nlohmann::json j = proto::output_specs_json(specs);
  bool saw_q = false;
  for (const auto& e : j) {
    if (e["name"] == "q") {
      saw_q = true;
      EXPECT_EQ(e["dtype"], "uint8");
      EXPECT_EQ(e["shape"], nlohmann::json({2, 16}));  // two codes a byte
      EXPECT_EQ(e["codes"], "nvfp4_e2m1");
      EXPECT_EQ(e["packing"], "low_nibble_first");
    }
    if (e["name"] == "scale") {
      EXPECT_EQ(e["codes"], "float8_e4m3fn");
    }
  }
  EXPECT_TRUE(saw_q);
  // And read back into the in-memory specs (float64 codes, unpacked).
  const auto back = proto::output_specs_from_json(nlohmann::json{{"outputs", j}});
  ASSERT_EQ(back.size(), specs.size());
  for (const auto& [name, s] : specs) {
    EXPECT_EQ(back.at(name).dtype, s.dtype) << name;
    EXPECT_EQ(back.at(name).shape, s.shape) << name;
    EXPECT_EQ(back.at(name).codes, s.codes) << name;
  }
  const auto i8 = proto::output_specs_json(output_specs(quant_case("vllm_dynamic_int8")));
  for (const auto& e : i8)
    if (e["name"] == "q") {
      EXPECT_EQ(e["dtype"], "int8");
    }
}

// The C++ child (serve.cpp) and the host both ways: codes, packed NVFP4, E8M0/E4M3 block scales
// and float scales come back as the reference computed them, code for code.
TEST(Quant, EveryPresetRoundTripsThroughTheProtocol) {
  auto cand = serve_self();
  EXPECT_FALSE(cand->info().caps.quant_formats.empty());
  for (const auto& [name, q] : ref::quant_presets()) {
    const ref::Case c = quant_case(name);
    const auto want = ref::evaluate(c);
    const Outputs got = cand->run(c);
    ASSERT_EQ(got.size(), want.outputs.size()) << name;
    for (const auto& [oname, o] : want.outputs) {
      ASSERT_TRUE(got.count(oname)) << name << " " << oname;
      const auto& g = got.at(oname);
      ASSERT_EQ(g.shape, o.value.shape) << name << " " << oname;
      ASSERT_EQ(g.dtype, o.value.dtype) << name << " " << oname;
      for (std::size_t i = 0; i < g.data.size(); ++i)
        ASSERT_TRUE(same_value(g.data[i], o.value.data[i])) << name << " " << oname << "[" << i << "]";
    }
  }
  // int8 codes keep their sign on the wire.
  const Outputs i8 = cand->run(quant_case("vllm_dynamic_int8"));
  EXPECT_LT(*std::min_element(i8.at("q").data.begin(), i8.at("q").data.end()), 0);
}

TEST(Quant, ACandidateWithoutQuantDeclaresNone) {
  SKIP_WITHOUT_PYTHON();
  SubprocessOptions opt;
  auto cand = python({python_dir() + "/numpy_candidate.py"}, opt);
  EXPECT_TRUE(cand->info().caps.quant_formats.empty());
  const auto why = cand->declines(quant_case("vllm_static_fp8"));
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("quantized outputs (q, scale) not supported"), std::string::npos) << *why;
}

TEST(Quant, PythonCandidateReturnsCodes) {
  SKIP_WITHOUT_PYTHON();
  SubprocessOptions opt;
  opt.timeout_s = 30;
  auto cand = python({kSource + "/conformance/subprocess/tests/helpers/quant_candidate.py"}, opt);
  EXPECT_EQ(cand->info().caps.quant_scales,
            (std::vector<ref::ScaleKind>{ref::ScaleKind::static_tensor, ref::ScaleKind::mx_block}));
  // vllm_static_fp8 needs the llama contract's arithmetic only when the case says so: this one is
  // `exact`, so the candidate takes it; NVFP4 is not among its formats.
  EXPECT_FALSE(cand->declines(quant_case("flashinfer_fp8")));
  const auto nv = cand->declines(quant_case("te_nvfp4"));
  ASSERT_TRUE(nv);
  EXPECT_EQ(*nv, "quant format nvfp4_e2m1 not supported");
  for (const char* preset : {"flashinfer_fp8", "te_delayed_fp8", "te_mxfp8", "ocp_mxfp8"}) {
    const ref::Case c = quant_case(preset);
    const auto want = ref::evaluate(c);
    const Outputs got = cand->run(c);
    // Its norm is binary64 rounded once, so on these well-conditioned rows every code and block
    // scale is the certified one.
    for (const char* oname : {"q", "scale"}) {
      if (!want.outputs.count(oname)) continue;
      ASSERT_TRUE(got.count(oname)) << preset << " " << oname;
      EXPECT_EQ(got.at(oname).data, want.outputs.at(oname).value.data) << preset << " " << oname;
    }
  }
}

TEST(Quant, MalformedCodeRepliesSayWhatIsWrong) {
  SKIP_WITHOUT_PYTHON();
  const std::pair<const char*, const char*> modes[] = {
      {"q_unpacked",
       "output 'q' is uint8 [2, 32]; the request asked for uint8 [2, 16] (nvfp4_e2m1 codes, packed two per byte, "
       "element 2k in the low nibble)"},
      {"q_float32", "output 'q' is float32 [2, 32]; the request asked for uint8 [2, 32] (float8_e4m3fn codes, one per byte)"},
      {"q_short", "nbytes 63 does not match shape [2, 32] of uint8 (64 bytes)"},
  };
  for (const auto& [mode, part] : modes) {
    auto cand = misbehave(mode);
    const ref::Case c = quant_case(std::string(mode) == "q_unpacked" ? "te_nvfp4" : "vllm_static_fp8");
    expect_throw<CandidateError>([&] { cand->run(c); }, part);
  }
}

// ---- Python children -------------------------------------------------------------------------

TEST(Python, NumpyCandidateAgreesWithTheReference) {
  SKIP_WITHOUT_PYTHON();
  auto cand = python({python_dir() + "/numpy_candidate.py"}, {});
  EXPECT_NE(cand->info().description.find("numpy"), std::string::npos);
  EXPECT_EQ(cand->info().caps.directions, std::vector<ref::Direction>{ref::Direction::forward});
  auto ln = make_case(ref::Op::layernorm, DType::float32, 8, 64);
  expect_close(cand->run(ln), ln, 8);
  auto rms = make_case(ref::Op::rmsnorm, DType::float32, 8, 64, ref::Affine::weight);
  add_residual(rms);
  expect_close(cand->run(rms), rms, 8);
  // Low precision: float32 compute rounded once is within one ulp of the output dtype.
  auto bf = make_case(ref::Op::layernorm, DType::bfloat16, 4, 32);
  expect_close(cand->run(bf), bf, 1, 1.0, {"mean", "rstd"});
  auto h = make_case(ref::Op::rmsnorm, DType::float16, 4, 32);
  h.weight_offset = 1;
  expect_close(cand->run(h), h, 1, 1.0, {"rstd"});
  // Channels-first LayerNorm: explicit axes.
  auto ch = make_case(ref::Op::layernorm, DType::float32, 1, 1, ref::Affine::weight);
  ch.inputs["x"] = tensor(DType::float32, {2, 3, 4}, 3);
  ch.inputs["weight"] = tensor(DType::float32, {3}, 4, 1, 0.5);
  ch.axes = std::vector<std::int64_t>{1};
  expect_close(cand->run(ch), ch, 8);
}

TEST(Python, SegfaultOnTheSecondCaseThenAFreshChild) {
  SKIP_WITHOUT_PYTHON();
  auto cand = misbehave("segv_second");
  auto c = make_case(ref::Op::layernorm, DType::float32, 2, 8);
  expect_close(cand->run(c), c, 8);
  expect_throw<CandidateError>([&] { cand->run(c); }, "SIGSEGV");
  expect_close(cand->run(c), c, 8);  // the first case of a fresh child
}

TEST(Python, HangIsATimeoutWithinTheLimit) {
  SKIP_WITHOUT_PYTHON();
  auto cand = misbehave("sleep_in_run", 0.5);
  auto c = make_case(ref::Op::layernorm, DType::float32, 2, 8);
  const auto t0 = std::chrono::steady_clock::now();
  expect_throw<CandidateTimeout>([&] { cand->run(c); }, "no reply within 0.5 s");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 2.0);
  EXPECT_GE(took, 0.5);
}

TEST(Python, ExceptionAndDeclineReplies) {
  SKIP_WITHOUT_PYTHON();
  auto cand = misbehave("raise");
  auto c = make_case(ref::Op::layernorm, DType::float32, 2, 8);
  c.epsilon = 0.125;
  expect_throw<CandidateError>([&] { cand->run(c); }, "ValueError: asked to fail");
  c.epsilon = 1e-5;
  expect_close(cand->run(c), c, 8);
  auto d = misbehave("decline");
  expect_throw<CandidateDeclined>([&] { d->run(c); }, "not this one");
}

TEST(Python, PrintsDoNotReachTheProtocolStream) {
  SKIP_WITHOUT_PYTHON();
  auto cand = misbehave("print_stdout");
  auto c = make_case(ref::Op::rmsnorm, DType::float32, 2, 8);
  expect_close(cand->run(c), c, 8);
}

TEST(Python, ChattyStderrNeitherBlocksNorGrows) {
  SKIP_WITHOUT_PYTHON();
  auto cand = misbehave("chatty_stderr", 20);
  auto c = make_case(ref::Op::rmsnorm, DType::float32, 2, 8);
  expect_close(cand->run(c), c, 8);
}

TEST(Python, StartupFailuresSayWhy) {
  SKIP_WITHOUT_PYTHON();
  expect_throw<std::invalid_argument>([] { misbehave("garbage_hello"); },
                                      "header is not JSON: 'hello world'");
  expect_throw<std::invalid_argument>([] { misbehave("endless_line"); }, "longer than 1 MiB");
  expect_throw<std::invalid_argument>([] { misbehave("version2"); },
                                      "speaks normcheck-subprocess version 2; this normcheck speaks");
  expect_throw<std::invalid_argument>([] { misbehave("error_hello"); }, "CUDA not available");
  expect_throw<std::invalid_argument>([] { misbehave("bad_caps"); }, "capabilities.ops must be an array");
  expect_throw<std::invalid_argument>([] { misbehave("exit_before_hello"); }, "exited with status 3");
  expect_throw<std::invalid_argument>([] { misbehave("exit_before_hello"); }, "boom: cannot import");
  expect_throw<std::invalid_argument>([] { misbehave("no_hello", 0, 0.5); }, "no hello within 0.5 s");
  expect_throw<std::invalid_argument>(
      [] { make_subprocess_candidate({"/nonexistent/program"}, "cmd:/nonexistent/program", 1); },
      "cannot start '/nonexistent/program': No such file or directory");
}

TEST(Python, MalformedRepliesAreProtocolErrors) {
  SKIP_WITHOUT_PYTHON();
  const std::pair<const char*, const char*> modes[] = {
      {"garbage_reply", "protocol error: header is not JSON"},
      {"bad_nbytes", "nbytes 68 does not match shape [2, 8]"},
      {"negative_dim", "negative dim"},
      {"huge", "more than 2^31 elements"},
      {"unknown_dtype", "unknown dtype 'float8'"},
      // int8 is a dtype now (quantized codes), but not y's
      {"int8_y", "output 'y' is int8 [2, 8]; the request asked for float32 [2, 8]"},
      {"wrong_shape", "output 'y' is float32 [1]; the request asked for float32 [2, 8]"},
      {"unrequested", "output 'foo' was not requested"},
      {"unknown_type", "unexpected reply type 'weather'"},
      {"short_payload_exit",
       "short payload: 8 of the 64 bytes of output 'y'; the candidate exited with status 0"},
      {"exit_in_run", "the candidate exited with status 7 before it replied"},
      {"close_stdin", "stopped reading its input"},
  };
  auto c = make_case(ref::Op::layernorm, DType::float32, 2, 8);
  for (const auto& [mode, part] : modes) {
    SCOPED_TRACE(mode);
    auto cand = misbehave(mode, 5);
    expect_throw<CandidateError>([&] { cand->run(c); }, part);
  }
  // The stderr tail is quoted.
  auto cand = misbehave("exit_in_run", 5);
  expect_throw<CandidateError>([&] { cand->run(c); }, "fatal: out of cheese");
  // Cut off and then silent: the timeout ends it.
  auto hang = misbehave("short_payload_hang", 0.5);
  expect_throw<CandidateTimeout>([&] { hang->run(c); }, "no reply within 0.5 s");
}

TEST(Python, AChildThatDiedWhileIdleIsReplacedWithoutAnError) {
  SKIP_WITHOUT_PYTHON();
  auto cand = misbehave("exit_after_reply");
  auto c = make_case(ref::Op::layernorm, DType::float32, 2, 8);
  EXPECT_TRUE(cand->run(c).empty());  // an empty result: every output MISSING
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(cand->run(c).empty());
}

TEST(Python, GivesUpAfterThreeFailedRestarts) {
  SKIP_WITHOUT_PYTHON();
  // A child that works once: every fresh one then fails its start (the script is replaced by a
  // failing one after the first start).
  const auto dir = std::filesystem::temp_directory_path() / ("normcheck_sub_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto script = dir / "once.py";
  {
    std::FILE* f = std::fopen(script.c_str(), "w");
    std::fprintf(f,
                 "import os, sys\nsys.path.insert(0, %s)\nimport numpy_candidate\n"
                 "from normcheck_protocol import serve\n"
                 "open(__file__, 'w').write('import sys\\nsys.exit(5)\\n')\n"
                 "def run(c, i):\n    os.kill(os.getpid(), 9)\n"
                 "serve('once', numpy_candidate.CAPABILITIES, run)\n",
                 ("'" + python_dir() + "'").c_str());
    std::fclose(f);
  }
  auto cand = python({script.string()}, {});
  auto c = make_case(ref::Op::layernorm, DType::float32, 2, 8);
  expect_throw<CandidateError>([&] { cand->run(c); }, "killed by signal 9 (SIGKILL)");
  for (int i = 0; i < 3; ++i) expect_throw<CandidateError>([&] { cand->run(c); }, "exited with status 5");
  expect_throw<CandidateError>([&] { cand->run(c); }, "not restarted after 3 failed starts");
  std::filesystem::remove_all(dir);
}

// ---- the PyTorch adapter ---------------------------------------------------------------------

bool have_torch() {
  if (kPython.empty()) return false;
  const std::string cmd = "'" + kPython + "' -c 'import torch' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

TEST(Torch, AgreesWithTheReferenceInFloat32) {
  if (!have_torch()) GTEST_SKIP() << "import torch fails with " << kPython;
  SubprocessOptions opt;
  opt.timeout_s = 60;
  auto cand = python({torch_adapter()}, opt);
  EXPECT_EQ(cand->info().caps.device, "cpu");
  auto ln = make_case(ref::Op::layernorm, DType::float32, 8, 64);
  expect_close(cand->run(ln), ln, 8);
  auto lnb = make_case(ref::Op::layernorm, DType::float32, 8, 64);
  make_backward(lnb);
  expect_close(cand->run(lnb), lnb, 64);  // dweight/dbias sum over rows
  auto lnr = make_case(ref::Op::layernorm, DType::float32, 4, 16);
  add_residual(lnr);
  lnr.inputs["x"] = tensor(DType::float32, {2, 4, 8}, 21);
  lnr.inputs["residual"] = tensor(DType::float32, {2, 4, 8}, 22);
  lnr.inputs["weight"] = tensor(DType::float32, {4, 8}, 23, 1, 0.5);
  lnr.inputs["bias"] = tensor(DType::float32, {4, 8}, 24);
  lnr.axis = 1;  // layer_norm's normalized_shape = the two trailing dims
  expect_close(cand->run(lnr), lnr, 8);
  auto rms = make_case(ref::Op::rmsnorm, DType::float32, 8, 64, ref::Affine::weight);
  rms.contract = "llama";
  expect_close(cand->run(rms), rms, 8);
  auto rmsb = rms;
  make_backward(rmsb);
  expect_close(cand->run(rmsb), rmsb, 64);
  auto ch = make_case(ref::Op::layernorm, DType::float32, 1, 1, ref::Affine::weight);
  ch.inputs["x"] = tensor(DType::float32, {2, 3, 4}, 3);
  ch.inputs["weight"] = tensor(DType::float32, {3}, 4);
  ch.axes = std::vector<std::int64_t>{1};
  expect_throw<CandidateDeclined>([&] { cand->run(ch); }, "not trailing");
}

TEST(Torch, GemmaRmsNormInBfloat16IsRoundedOnce) {
  if (!have_torch()) GTEST_SKIP() << "import torch fails with " << kPython;
  SubprocessOptions opt;
  opt.timeout_s = 60;
  auto cand = python({torch_adapter()}, opt);
  auto g = make_case(ref::Op::rmsnorm, DType::bfloat16, 8, 64, ref::Affine::weight);
  g.contract = "gemma";
  g.weight_offset = 1;
  g.inputs["weight"] = tensor(DType::bfloat16, {64}, 5, 0, 0.1);
  expect_close(cand->run(g), g, 1, 1.0, {"rstd"});
  auto l = make_case(ref::Op::rmsnorm, DType::bfloat16, 8, 64, ref::Affine::weight);
  l.contract = "llama";
  // x-hat is rounded to bfloat16 from float32 statistics: a flip there is up to 2 ulps of y.
  expect_close(cand->run(l), l, 2, 1.0, {"rstd"});
}

TEST(Torch, CudaWithoutAGpuSaysSo) {
  if (!have_torch()) GTEST_SKIP() << "import torch fails with " << kPython;
  const std::string probe = "'" + kPython + "' -c 'import torch, sys; sys.exit(torch.cuda.is_available())'";
  if (std::system(probe.c_str()) != 0) GTEST_SKIP() << "CUDA is available here";
  SubprocessOptions opt;
  opt.timeout_s = 60;
  expect_throw<std::invalid_argument>(
      [&] {
        python({torch_adapter(), "--device", "cuda"}, opt);
      },
      "CUDA not available");
}

// ---- normcheck worker --------------------------------------------------------------------------

TEST(Worker, UnknownSpecIsReportedAtStart) {
  expect_throw<std::invalid_argument>(
      [] {
        make_subprocess_candidate({kNormcheck, "worker", "builtin:no_such_kernel"}, "builtin:no_such_kernel",
                                  10);
      },
      "no built-in candidate 'no_such_kernel'");
}

TEST(Worker, BuiltinThroughTheWorkerMatchesInProcess) {
  const auto& all = builtin_candidates();
  const auto it = std::find_if(all.begin(), all.end(),
                               [](const BuiltinEntry& e) { return e.info.kind == CandidateKind::correct; });
  if (it == all.end()) GTEST_SKIP() << "no built-in candidate is registered yet";
  SpecOptions opt;
  opt.isolate = true;
  opt.self_exe = kNormcheck;
  opt.timeout_s = 30;
  auto isolated = make_candidate(it->info.name, opt);
  auto local = it->make();
  EXPECT_EQ(isolated->info().kind, CandidateKind::correct);
  int ran = 0;
  for (DType t : {DType::float32, DType::bfloat16, DType::float16}) {
    for (auto op : {ref::Op::layernorm, ref::Op::rmsnorm}) {
      auto c = make_case(op, t, 4, 40);
      if (local->declines(c)) continue;
      const auto a = isolated->run(c);
      const auto b = local->run(c);
      ASSERT_EQ(a.size(), b.size());
      for (const auto& [name, t2] : b) {
        ASSERT_TRUE(a.count(name)) << name;
        ASSERT_EQ(a.at(name).data.size(), t2.data.size()) << name;
        for (std::size_t i = 0; i < t2.data.size(); ++i)
          ASSERT_TRUE(same_value(a.at(name).data[i], t2.data[i])) << name << "[" << i << "]";
      }
      ++ran;
    }
  }
  EXPECT_GT(ran, 0) << it->info.name << " declined every case";
}

TEST(Worker, PluginThroughTheWorkerMatchesInProcess) {
  const std::string path = std::string(NORMCHECK_BINARY_DIR) + "/examples/libexample_layernorm.so";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "the example plugin is not built: " << path;
  SpecOptions opt;
  opt.isolate = true;
  opt.self_exe = kNormcheck;
  opt.timeout_s = 30;
  auto isolated = make_candidate("plugin:" + path, opt);
  auto local = make_candidate("plugin:" + path);
  auto c = make_case(ref::Op::layernorm, DType::float32, 4, 40);
  if (local->declines(c)) GTEST_SKIP() << "the example plugin declines " << *local->declines(c);
  const auto a = isolated->run(c);
  const auto b = local->run(c);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : b)
    for (std::size_t i = 0; i < t.data.size(); ++i)
      ASSERT_TRUE(same_value(a.at(name).data[i], t.data[i])) << name << "[" << i << "]";
}

// ---- overhead --------------------------------------------------------------------------------

void measure(Candidate& cand, const char* what) {
  auto c = make_case(ref::Op::layernorm, DType::float32, 2, 8);
  cand.run(c);  // warm
  constexpr int kCases = 200;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCases; ++i) cand.run(c);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[overhead] %s: %d tiny cases (2x8 float32 LayerNorm) in %.3f s: %.3f ms per case\n", what,
              kCases, s, 1e3 * s / kCases);
  EXPECT_LT(s / kCases, 0.1);  // generous: a loaded machine, not a benchmark
}

TEST(Overhead, RoundTripPerCase) {
  auto cpp = serve_self();
  measure(*cpp, "C++ child (serve_protocol + ref::evaluate)");
  if (kPython.empty()) return;
  auto py = python({python_dir() + "/numpy_candidate.py"}, {});
  measure(*py, "numpy_candidate.py");
}

TEST(Overhead, LargeCaseThroughput) {
  if (kPython.empty()) GTEST_SKIP() << "no python3";
  auto py = python({python_dir() + "/numpy_candidate.py"}, {});
  auto c = make_case(ref::Op::layernorm, DType::float32, 1024, 4096);  // 16 MiB each way
  py->run(c);
  const auto t0 = std::chrono::steady_clock::now();
  const auto out = py->run(c);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[overhead] numpy_candidate.py, 1024x4096 float32 LayerNorm (16 MiB in, 16 MiB out): %.3f s\n", s);
  EXPECT_EQ(out.at("y").data.size(), 1024u * 4096u);
}

// ---- the --serve child -----------------------------------------------------------------------

// The reference as a candidate, with misbehaviour on request through special epsilons (the
// only knob a case carries that does not change its shape).
class Oracle final : public Candidate {
 public:
  Oracle() {
    info_.name = "oracle";
    info_.kind = CandidateKind::correct;
    info_.description = "the certified reference (test oracle)";
    info_.caps.blocks = true;
    info_.caps.dtypes.push_back(DType::float64);
    info_.caps.compute_dtypes.push_back(DType::float64);
    info_.caps.device = "test";
    for (const auto& row : ref::EnumTable<ref::QFormat>::rows) info_.caps.quant_formats.push_back(row.value);
    for (const auto& row : ref::EnumTable<ref::ScaleKind>::rows) info_.caps.quant_scales.push_back(row.value);
  }
  const CandidateInfo& info() const override { return info_; }
  std::optional<std::string> declines(const ref::Case& c) const override {
    if (c.epsilon == 0.25) return "asked to decline";
    return Candidate::declines(c);
  }
  Outputs run(const ref::Case& c) override {
    if (c.epsilon == 0.125) throw CandidateError("asked to fail");
    if (c.epsilon == 0.375) {
      std::fprintf(stderr, "oracle crashes now\n");
      std::fflush(stderr);
      ::signal(SIGSEGV, SIG_DFL);  // a real death by signal, also under a sanitizer's handler
      ::raise(SIGSEGV);
    }
    if (c.epsilon == 0.625) throw CandidateDeclined("declined in run");
    Outputs out;
    for (auto& [name, o] : ref::evaluate(c).outputs) out[name] = std::move(o.value);
    if (c.epsilon == 0.5) out["y"].shape = {out["y"].numel()};
    if (c.epsilon == 0.75) out["y"].data[0] = 1 + 0x1p-20;
    return out;
  }

 private:
  CandidateInfo info_;
};

}  // namespace
}  // namespace normcheck::conf

int main(int argc, char** argv) {
  normcheck::conf::g_self_exe = std::filesystem::canonical("/proc/self/exe").string();
  if (argc >= 2 && std::strcmp(argv[1], "--serve") == 0) {
    // The child role, as `normcheck worker` does it: fd 1 for the protocol only.
    const int proto_out = ::dup(1);
    ::dup2(2, 1);
    ::signal(SIGPIPE, SIG_IGN);
    normcheck::conf::Oracle oracle;
    return normcheck::conf::serve_protocol(oracle, 0, proto_out);
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
