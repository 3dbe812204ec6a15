// The plugin transport: the example plugin against the certified reference, the broken plugins
// of bad_plugin.c, and bundled-plugin discovery.
#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "normcheck/candidate.h"
#include "normcheck/conformance/candidate.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "candidates/bundled_plugins.hpp"
#include "transports.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace normcheck::conf {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr double kU = 0x1p-24;  // unit roundoff of float32

// fp32 LayerNorm forward over the last dim with weight and bias. x holds small integers, so
// with a power-of-two hidden size every sum in the example's two passes is exact (|sum| <= 2^12
// with granularity 2^-8 for the squares: 20 bits), and the only errors are the few roundings
// the bounds in MatchesReference count.
ref::Case small_case(std::vector<std::int64_t> shape) {
  ref::Case c;
  c.op = ref::Op::layernorm;
  c.affine = ref::Affine::weight_bias;
  c.epsilon = 1e-5;
  std::int64_t n = 1;
  for (auto e : shape) n *= e;
  const std::int64_t d = shape.back();
  std::uint32_t s = 12345;
  auto next = [&s] { return s = s * 1664525u + 1013904223u, static_cast<int>(s >> 27); };  // 0..31
  ref::Tensor x{ref::DType::float32, shape, {}}, w{ref::DType::float32, {d}, {}},
      b{ref::DType::float32, {d}, {}};
  for (std::int64_t i = 0; i < n; ++i) x.data.push_back(next() / 2 - 8);  // -8..7
  for (std::int64_t j = 0; j < d; ++j) {
    w.data.push_back(std::ldexp(next() + 17, -5));  // 0.53..1.5
    b.data.push_back(std::ldexp(next() - 16, -4));  // -1..0.94
  }
  c.inputs = {{"x", x}, {"weight", w}, {"bias", b}};
  return c;
}

std::int64_t ulps(double a, double b) {
  const auto key = [](float f) {
    const auto i = std::bit_cast<std::int32_t>(f);
    return i < 0 ? -static_cast<std::int64_t>(i & 0x7fffffff) : static_cast<std::int64_t>(i);
  };
  return std::llabs(key(static_cast<float>(a)) - key(static_cast<float>(b)));
}

std::unique_ptr<Candidate> plugin(const std::string& path) { return make_candidate("plugin:" + path); }

// The message of the std::invalid_argument that loading `path` throws.
std::string load_error(const std::string& path) {
  try {
    make_plugin_candidate(path);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << path << " loaded";
  return "";
}

// A fresh directory under the temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "normcheck_plugin_test.XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_text(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

// ---- the example plugin --------------------------------------------------------------------

TEST(ExamplePlugin, DeclaresWhatItTakes) {
  const auto k = plugin(EXAMPLE_PLUGIN);
  const CandidateInfo& info = k->info();
  EXPECT_EQ(info.name, std::string("plugin:") + EXAMPLE_PLUGIN);
  EXPECT_EQ(info.kind, CandidateKind::external);
  EXPECT_THAT(info.description, HasSubstr("example_layernorm"));
  EXPECT_EQ(info.caps.ops, std::vector<ref::Op>{ref::Op::layernorm});
  EXPECT_EQ(info.caps.dtypes, std::vector<ref::DType>{ref::DType::float32});
  EXPECT_EQ(info.caps.compute_dtypes, std::vector<ref::DType>{ref::DType::float32});
  EXPECT_EQ(info.caps.directions, std::vector<ref::Direction>{ref::Direction::forward});
  EXPECT_EQ(info.caps.contracts, std::vector<std::string>{"exact"});
  EXPECT_FALSE(info.caps.residual || info.caps.blocks || info.caps.general_axes || info.caps.weight_offset);
  EXPECT_EQ(info.caps.device, "cpu");
}

TEST(ExamplePlugin, MatchesReference) {
  const ref::Case c = small_case({2, 3, 16});
  const auto k = plugin(EXAMPLE_PLUGIN);
  ASSERT_EQ(k->declines(c), std::nullopt);
  const Outputs out = k->run(c);
  const ref::Result want = ref::evaluate(c);
  ASSERT_EQ(out.size(), 3u);
  const auto& x = c.inputs.at("x").data;
  const auto& w = c.inputs.at("weight").data;
  const auto& y = out.at("y").data;
  const auto& mean = out.at("mean").data;
  const auto& rstd = out.at("rstd").data;
  const auto& y_ref = want.outputs.at("y").value.data;
  const auto& mean_ref = want.outputs.at("mean").value.data;
  const auto& rstd_ref = want.outputs.at("rstd").value.data;
  ASSERT_EQ(y.size(), y_ref.size());
  ASSERT_EQ(rstd.size(), 6u);
  for (std::size_t r = 0; r < 6; ++r) {
    // The mean is exact (small_case): sum and division by 16 lose nothing.
    EXPECT_EQ(mean[r], mean_ref[r]) << "row " << r;
    // rstd = 1/sqrtf(var + eps) with var exact: eps to float (u relative to eps), the add, the
    // sqrt and the division each err by at most u, and the sqrt halves what it is given, so
    // the relative error is below 3u = 3 * 2^-24 < 3 ulps of rstd; the reference is correctly
    // rounded (0.5 ulp): together below 3.5 ulps, that is at most 3 between two floats.
    EXPECT_LE(ulps(rstd[r], rstd_ref[r]), 3) << "row " << r;
    for (std::size_t j = 0; j < 16; ++j) {
      const std::size_t i = r * 16 + j;
      // y = ((x - mean) * rstd) * w + b: x - mean is exact, so w*xhat carries rstd's 3u and two
      // more roundings (5u), the add one more on |y|, and the reference 0.5 ulp <= u on |y|:
      // |y - y_ref| <= 5u |w xhat| + 2u |y|, a few ulps of the larger of the two (6u and 3u
      // leave room for the first-order terms dropped).
      const double wxhat = std::fabs(w[j] * (x[i] - mean_ref[r]) * rstd_ref[r]);
      EXPECT_LE(std::fabs(y[i] - y_ref[i]), 6 * kU * wxhat + 3 * kU * std::fabs(y_ref[i]))
          << "element " << i << ": " << y[i] << " vs " << y_ref[i];
    }
  }
}

TEST(ExamplePlugin, DeclinesWhatItDoesNotTake) {
  const auto k = plugin(EXAMPLE_PLUGIN);
  ref::Case bf16 = small_case({2, 8});
  bf16.dtype_x = bf16.dtype_param = bf16.dtype_out = ref::DType::bfloat16;
  for (auto& [name, t] : bf16.inputs) t.dtype = ref::DType::bfloat16;  // small values: exact in bf16
  EXPECT_EQ(k->declines(bf16), "dtype_x bfloat16 not supported");

  ref::Case rms = small_case({2, 8});
  rms.op = ref::Op::rmsnorm;
  rms.affine = ref::Affine::weight;
  rms.inputs.erase("bias");
  EXPECT_EQ(k->declines(rms), "op rmsnorm not supported");

  ref::Case llama = small_case({2, 8});
  llama.contract = "llama";
  EXPECT_EQ(k->declines(llama), "contract llama not supported");

  ref::Case channels_first = small_case({2, 8});
  channels_first.axis = 0;
  EXPECT_THAT(k->declines(channels_first).value_or(""), HasSubstr("other than the last"));
}

// The example indexes every tensor through its strides: a column-major x, padded y rows, spaced
// statistics and a strided weight give the same bits as the dense layout.
TEST(ExamplePlugin, HonoursStrides) {
  void* lib = dlopen(EXAMPLE_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  const auto entry = reinterpret_cast<nc_candidate_fn>(dlsym(lib, NORMCHECK_CANDIDATE_SYMBOL));
  ASSERT_NE(entry, nullptr);
  const nc_candidate* d = entry();

  constexpr std::int64_t kRows = 3, kCols = 16;
  const ref::Case rc = small_case({kRows, kCols});
  const std::int64_t shape[] = {kRows, kCols}, stat_shape[] = {kRows, 1}, w_shape[] = {kCols};
  const std::int64_t norm_dims[] = {1};
  nc_case c{};
  c.struct_size = sizeof(nc_case);
  c.case_id = "strides";
  c.op = NC_LAYERNORM;
  c.rank = 2;
  c.shape = shape;
  c.n_norm_dims = 1;
  c.norm_dims = norm_dims;
  c.epsilon = rc.epsilon;
  c.affine = NC_AFFINE_WEIGHT_BIAS;
  c.layers = 1;
  c.contract = "exact";
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_compute = c.dtype_residual = NC_FLOAT32;

  // Runs the plugin with x, weight, y and the statistics laid out by the given strides (the
  // buffers are sized for them) and returns y, mean and rstd densely.
  auto run = [&](std::vector<std::int64_t> xs, std::vector<std::int64_t> ws, std::vector<std::int64_t> ys,
                 std::vector<std::int64_t> ss) {
    const auto span = [](const std::int64_t* sh, const std::vector<std::int64_t>& st) {
      std::int64_t last = 0;
      for (std::size_t i = 0; i < st.size(); ++i) last += (sh[i] - 1) * st[i];
      return static_cast<std::size_t>(last + 1);
    };
    std::vector<float> x(span(shape, xs)), w(span(w_shape, ws)), b(span(w_shape, ws));
    std::vector<float> y(span(shape, ys), NAN), mean(span(stat_shape, ss), NAN),
        rstd(span(stat_shape, ss), NAN);
    for (std::int64_t i = 0; i < kRows; ++i)
      for (std::int64_t j = 0; j < kCols; ++j)
        x[static_cast<std::size_t>(i * xs[0] + j * xs[1])] =
            static_cast<float>(rc.inputs.at("x").data[static_cast<std::size_t>(i * kCols + j)]);
    for (std::int64_t j = 0; j < kCols; ++j) {
      w[static_cast<std::size_t>(j * ws[0])] =
          static_cast<float>(rc.inputs.at("weight").data[static_cast<std::size_t>(j)]);
      b[static_cast<std::size_t>(j * ws[0])] =
          static_cast<float>(rc.inputs.at("bias").data[static_cast<std::size_t>(j)]);
    }
    const nc_named_tensor in[] = {{"x", {x.data(), NC_FLOAT32, 2, shape, xs.data()}, 0},
                                  {"weight", {w.data(), NC_FLOAT32, 1, w_shape, ws.data()}, 0},
                                  {"bias", {b.data(), NC_FLOAT32, 1, w_shape, ws.data()}, 0}};
    nc_named_tensor out[] = {{"mean", {mean.data(), NC_FLOAT32, 2, stat_shape, ss.data()}, 0},
                             {"rstd", {rstd.data(), NC_FLOAT32, 2, stat_shape, ss.data()}, 0},
                             {"y", {y.data(), NC_FLOAT32, 2, shape, ys.data()}, 0}};
    char err[256] = {};
    EXPECT_EQ(d->run(nullptr, &c, in, 3, out, 3, err, sizeof err), 0) << err;
    std::vector<std::uint32_t> bits;
    for (std::int64_t i = 0; i < kRows; ++i) {
      for (std::int64_t j = 0; j < kCols; ++j)
        bits.push_back(std::bit_cast<std::uint32_t>(y[static_cast<std::size_t>(i * ys[0] + j * ys[1])]));
      bits.push_back(std::bit_cast<std::uint32_t>(mean[static_cast<std::size_t>(i * ss[0])]));
      bits.push_back(std::bit_cast<std::uint32_t>(rstd[static_cast<std::size_t>(i * ss[0])]));
    }
    return bits;
  };
  const auto dense = run({kCols, 1}, {1}, {kCols, 1}, {1, 1});
  const auto strided = run({1, kRows}, {3}, {kCols + 5, 1}, {2, 1});
  EXPECT_EQ(dense, strided);
  for (std::uint32_t v : dense) EXPECT_FALSE(std::isnan(std::bit_cast<float>(v)));
  dlclose(lib);
}

// "plugin:libx.so" names a file in the working directory; dlopen alone would search the
// library path for it instead.
TEST(ExamplePlugin, BareFileNameMeansWorkingDirectory) {
  TempDir dir;
  fs::copy_file(EXAMPLE_PLUGIN, dir.path() / "libexample.so");
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  std::unique_ptr<Candidate> k;
  EXPECT_NO_THROW(k = make_candidate("plugin:libexample.so"));
  fs::current_path(cwd);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->info().name, "plugin:libexample.so");
  EXPECT_EQ(k->run(small_case({1, 8})).size(), 3u);
}

// Two candidates from one file share the loaded library; dropping one leaves the other working.
TEST(ExamplePlugin, LoadedTwice) {
  auto a = plugin(EXAMPLE_PLUGIN);
  auto b = plugin(EXAMPLE_PLUGIN);
  const ref::Case c = small_case({2, 8});
  const Outputs first = a->run(c);
  a.reset();
  EXPECT_EQ(b->run(c).at("y").data, first.at("y").data);
}

// ---- broken plugins --------------------------------------------------------------------------

TEST(BadPlugin, NotASharedLibrary) {
  TempDir dir;
  const fs::path fake = dir.path() / "libfake.so";
  write_text(fake, "this is a text file, not an ELF object\n");
  const std::string e = load_error(fake.string());
  EXPECT_THAT(e, HasSubstr("plugin " + fake.string() + ": not a loadable shared library"));
}

TEST(BadPlugin, NoSymbol) {
  EXPECT_THAT(load_error(NC_BAD_NO_SYMBOL),
              HasSubstr(std::string("plugin ") + NC_BAD_NO_SYMBOL + ": no `normcheck_candidate` symbol"));
}

TEST(BadPlugin, NullDescriptor) {
  EXPECT_THAT(load_error(NC_BAD_NULL_DESCRIPTOR), HasSubstr("normcheck_candidate() returned NULL"));
}

TEST(BadPlugin, OtherAbiVersion) {
  EXPECT_EQ(load_error(NC_BAD_ABI2),
            std::string("plugin ") + NC_BAD_ABI2 + " speaks ABI version 2; this normcheck speaks 1");
}

TEST(BadPlugin, DescriptorTooSmall) {
  EXPECT_THAT(load_error(NC_BAD_SMALL_STRUCT),
              HasSubstr("struct_size is 16 bytes, smaller than ABI version 1's"));
}

TEST(BadPlugin, NullRun) { EXPECT_THAT(load_error(NC_BAD_NULL_RUN), HasSubstr("has no run function")); }

TEST(BadPlugin, RunErrorIsCandidateError) {
  const auto k = plugin(NC_BAD_RUN_ERROR);
  try {
    k->run(small_case({2, 8}));
    FAIL() << "run succeeded";
  } catch (const CandidateError& e) {
    EXPECT_STREQ(e.what(), "plugin run returned 7: deliberate failure: kernel launch failed (3 outputs) in case ''");
  }
}

TEST(BadPlugin, InitFailureDeclinesEveryCase) {
  const auto k = plugin(NC_BAD_INIT_FAILS);
  const std::string why = "plugin init failed: no device found (deliberate)";
  EXPECT_EQ(k->declines(small_case({2, 8})), why);
  ref::Case rms = small_case({2, 8});
  rms.op = ref::Op::rmsnorm;
  EXPECT_EQ(k->declines(rms), why);  // before the capabilities: the reason that matters
  EXPECT_THROW(k->run(small_case({2, 8})), CandidateDeclined);
}

TEST(BadPlugin, SupportsDeclinesWithItsReason) {
  const auto k = plugin(NC_BAD_DECLINES);
  EXPECT_EQ(k->declines(small_case({2, 16})), std::nullopt);
  EXPECT_EQ(k->declines(small_case({2, 12})), "hidden size 12 is not a multiple of 8");
  // Capabilities come first: the plugin's supports() never sees an rmsnorm case.
  ref::Case rms = small_case({2, 12});
  rms.op = ref::Op::rmsnorm;
  EXPECT_EQ(k->declines(rms), "op rmsnorm not supported");
}

TEST(BadPlugin, IntendedMutantIsAMutant) {
  const auto k = plugin(NC_BAD_INTENDED_MUTANT);
  EXPECT_EQ(k->info().kind, CandidateKind::mutant);
  EXPECT_EQ(k->info().fault, "writes zeros for y (the library's own mutation test)");
  EXPECT_EQ(plugin(NC_BAD_DECLINES)->info().kind, CandidateKind::external);
}

TEST(BadPlugin, UnwrittenOutputIsMissing) {
  const Outputs out = plugin(NC_BAD_UNWRITTEN)->run(small_case({2, 8}));
  EXPECT_EQ(out.count("y"), 1u);
  EXPECT_EQ(out.count("mean"), 1u);
  EXPECT_EQ(out.count("rstd"), 0u);
}

TEST(BadPlugin, PartlyWrittenOutputShowsTheSentinel) {
  const Outputs out = plugin(NC_BAD_PARTIAL)->run(small_case({2, 8}));
  const auto& y = out.at("y");
  EXPECT_EQ(y.dtype, ref::DType::float32);
  EXPECT_EQ(y.shape, (std::vector<std::int64_t>{2, 8}));
  ASSERT_EQ(y.data.size(), 16u);
  for (std::size_t i = 0; i + 1 < y.data.size(); ++i) EXPECT_EQ(y.data[i], 0.0);
  EXPECT_TRUE(std::isnan(y.data.back()));
}

TEST(BadPlugin, ExceptionBecomesCandidateError) {
  const auto k = plugin(NC_BAD_THROWS);
  try {
    k->run(small_case({2, 8}));
    FAIL() << "run succeeded";
  } catch (const CandidateError& e) {
    EXPECT_THAT(e.what(), HasSubstr("std::vector too long (deliberate)"));
  }
}

#if defined(NC_BAD_SETS_FTZ)
// Flush-to-zero would make the reference, in this process, round subnormals wrongly.
TEST(BadPlugin, FloatingPointEnvironmentIsRestored) {
  constexpr unsigned kFtzDaz = 0x8040;
  ASSERT_EQ(_mm_getcsr() & kFtzDaz, 0u);
  const auto loaded = plugin(NC_BAD_FTZ_ON_LOAD);  // sets FTZ/DAZ in a load-time constructor
  EXPECT_EQ(_mm_getcsr() & kFtzDaz, 0u);
  const auto k = plugin(NC_BAD_SETS_FTZ);  // sets them in run
  k->run(small_case({2, 8}));
  EXPECT_EQ(_mm_getcsr() & kFtzDaz, 0u);
  volatile float tiny = 0x1p-126f;
  EXPECT_GT(tiny / 4, 0.0f);
}
#endif

// ---- bundled plugins -------------------------------------------------------------------------

class EnvVar {
 public:
  EnvVar(const char* name, const std::string& value) : name_(name) { setenv(name, value.c_str(), 1); }
  ~EnvVar() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(BundledPlugins, DefaultDirIsBesideTheExecutable) {
  unsetenv("NORMCHECK_PLUGIN_DIR");
  const fs::path exe = fs::read_symlink("/proc/self/exe");
  EXPECT_EQ(bundled_plugin_dir(), (exe.parent_path() / "../lib/normcheck/plugins").lexically_normal());
}

TEST(BundledPlugins, MissingDirListsNothing) {
  EnvVar env("NORMCHECK_PLUGIN_DIR", "/nonexistent/normcheck/plugins");
  EXPECT_TRUE(bundled_plugin_entries().empty());
}

TEST(BundledPlugins, ScansTheDirNamedByTheEnvironment) {
  TempDir dir;
  fs::copy_file(EXAMPLE_PLUGIN, dir.path() / "libnormcheck_example.so");
  write_text(dir.path() / "libnormcheck_broken.so", "not a library\n");
  write_text(dir.path() / "README.txt", "ignored\n");
  fs::copy_file(EXAMPLE_PLUGIN, dir.path() / "libother.so");  // not libnormcheck_*: ignored
  EnvVar env("NORMCHECK_PLUGIN_DIR", dir.path().string());
  EXPECT_EQ(bundled_plugin_dir(), dir.path());

  const auto entries = bundled_plugin_entries();
  ASSERT_EQ(entries.size(), 2u);
  const ref::Case c = small_case({2, 8});

  const BuiltinEntry& broken = entries[0];
  EXPECT_EQ(broken.info.name, "builtin:broken");
  EXPECT_EQ(broken.info.kind, CandidateKind::correct);
  EXPECT_THAT(broken.info.description, HasSubstr("not loaded"));
  EXPECT_THAT(broken.info.description, HasSubstr("not a loadable shared library"));
  const auto bk = broken.make();
  EXPECT_EQ(bk->info().name, "builtin:broken");
  EXPECT_THAT(bk->declines(c).value_or(""), HasSubstr("not a loadable shared library"));
  EXPECT_THROW(bk->run(c), CandidateDeclined);

  const BuiltinEntry& example = entries[1];
  EXPECT_EQ(example.info.name, "builtin:example");
  EXPECT_EQ(example.info.kind, CandidateKind::correct);
  EXPECT_EQ(example.info.caps.ops, std::vector<ref::Op>{ref::Op::layernorm});
  const auto ek = example.make();
  EXPECT_EQ(ek->info().name, "builtin:example");
  EXPECT_EQ(ek->info().kind, CandidateKind::correct);
  EXPECT_EQ(ek->declines(c), std::nullopt);
  EXPECT_EQ(ek->run(c).size(), 3u);

  // A second scan (another entry point asking again) finds the same and makes the same.
  const auto again = bundled_plugin_entries();
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[1].info.name, example.info.name);
  EXPECT_EQ(again[1].make()->info().description, ek->info().description);
}

// ---- fused norm + quantization over the ABI (candidate.h nc_quant) --------------------------

// RMSNorm of [2, 32] bfloat16 values quantized by `preset`: x small multiples of 1/8, weight
// near 1, a static scale of 0.25 where the preset takes one.
ref::Case quant_case(const std::string& preset, const std::string& contract = "exact") {
  ref::Case c;
  c.op = ref::Op::rmsnorm;
  c.affine = ref::Affine::weight;
  c.epsilon = 1e-6;
  c.contract = contract;
  c.dtype_x = c.dtype_param = c.dtype_out = ref::DType::bfloat16;
  c.quant = ref::quant_preset(preset);
  ref::Tensor x{ref::DType::bfloat16, {2, 32}, {}}, w{ref::DType::bfloat16, {32}, {}};
  for (int i = 0; i < 64; ++i) x.data.push_back(((i * 37) % 29 - 14) / 8.0);
  for (int j = 0; j < 32; ++j) w.data.push_back(1 + (j % 5) / 16.0);
  c.inputs = {{"x", x}, {"weight", w}};
  if (c.quant->scale == ref::ScaleKind::static_tensor) c.inputs["scale"] = {ref::DType::float32, {1}, {0.25}};
  ref::validate(c);
  return c;
}

TEST(QuantPlugin, DeclaresItsFormatsAndScaleKinds) {
  const auto cand = make_plugin_candidate(NC_QUANT_PLUGIN);
  const Capabilities& caps = cand->info().caps;
  EXPECT_EQ(caps.quant_formats, (std::vector<ref::QFormat>{ref::QFormat::float8_e4m3fn, ref::QFormat::float8_e5m2,
                                                           ref::QFormat::mxfp8_e4m3, ref::QFormat::mxfp8_e5m2,
                                                           ref::QFormat::nvfp4_e2m1}));
  EXPECT_EQ(caps.quant_scales, (std::vector<ref::ScaleKind>{ref::ScaleKind::static_tensor, ref::ScaleKind::mx_block,
                                                            ref::ScaleKind::nvfp4_block}));
  EXPECT_THAT(capabilities_text(caps), HasSubstr("quant float8_e4m3fn,float8_e5m2,mxfp8_e4m3,mxfp8_e5m2,nvfp4_e2m1"));
  EXPECT_EQ(cand->declines(quant_case("vllm_dynamic_fp8")), "quant scale dynamic_token not supported");
  EXPECT_EQ(cand->declines(quant_case("vllm_dynamic_int8")), "quant format int8 not supported");
  EXPECT_EQ(cand->declines(quant_case("vllm_static_fp8", "llama")), "contract llama not supported");
  EXPECT_EQ(cand->declines(quant_case("vllm_static_fp8")), std::nullopt);
}

// Codes (NVFP4 packed by the plugin, unpacked by the host), E8M0 and E4M3 block scales, the
// global scale and amax come back as the reference computes them: the rows are well
// conditioned, and the plugin's norm is binary64 rounded once.
TEST(QuantPlugin, MatchesTheReferenceCodeForCode) {
  const auto cand = make_plugin_candidate(NC_QUANT_PLUGIN);
  for (const char* preset : {"vllm_static_fp8", "flashinfer_fp8", "te_delayed_fp8", "te_mxfp8", "ocp_mxfp8", "te_nvfp4"}) {
    const ref::Case c = quant_case(preset);
    const auto want = ref::evaluate(c);
    const Outputs got = cand->run(c);
    ASSERT_EQ(got.size(), want.outputs.size()) << preset;
    for (const auto& [name, o] : want.outputs) {
      ASSERT_TRUE(got.count(name)) << preset << " " << name;
      EXPECT_EQ(got.at(name).shape, o.value.shape) << preset << " " << name;
      EXPECT_EQ(got.at(name).data, o.value.data) << preset << " " << name;
    }
  }
}

TEST(QuantPlugin, TheWrongVariantReturnsOtherCodes) {
  const auto cand = make_plugin_candidate(NC_QUANT_WRONG);
  EXPECT_EQ(cand->info().kind, CandidateKind::mutant);
  for (const char* preset : {"vllm_static_fp8", "te_nvfp4"}) {
    const ref::Case c = quant_case(preset);
    EXPECT_NE(cand->run(c).at("q").data, ref::evaluate(c).outputs.at("q").value.data) << preset;
  }
}

TEST(QuantPlugin, AnOverrunOfThePackedBufferIsNamed) {
  const auto cand = make_plugin_candidate(NC_QUANT_UNPACKED);
  try {
    cand->run(quant_case("te_nvfp4"));
    ADD_FAILURE() << "no error";
  } catch (const CandidateError& e) {
    EXPECT_THAT(e.what(), HasSubstr("wrote past the end of output 'q' (byte 32 of a 32-byte buffer, uint8 [2, 16], "
                                    "NVFP4 codes packed two per byte"));
  }
  // The same plugin's FP8 codes fit their buffer: only NVFP4 is broken.
  EXPECT_NO_THROW(cand->run(quant_case("vllm_static_fp8")));
}

TEST(QuantPlugin, AChangedOutputDescriptorIsNamed) {
  const auto cand = make_plugin_candidate(NC_QUANT_CHANGES_DTYPE);
  try {
    cand->run(quant_case("vllm_static_fp8"));
    ADD_FAILURE() << "no error";
  } catch (const CandidateError& e) {
    EXPECT_THAT(e.what(), HasSubstr("the plugin changed the nc_tensor of output 'q' (dtype 4 -> 1"));
  }
}

TEST(QuantPlugin, UnknownFormatBitsAreRefusedAtLoad) {
  EXPECT_THAT(load_error(NC_QUANT_BAD_BITS), HasSubstr("quant_formats 0x23b has bits of no format (NC_Q_*)"));
}

// Additive within v1: a descriptor without the quant fields (a plugin built before them), and
// the example plugin, which never set them, declare no quantization and are never sent a
// quantized case.
TEST(QuantPlugin, OlderPluginsDeclineQuantizedCases) {
  for (const char* path : {NC_QUANT_OLD_DESCRIPTOR, EXAMPLE_PLUGIN}) {
    const auto cand = make_plugin_candidate(path);
    EXPECT_TRUE(cand->info().caps.quant_formats.empty()) << path;
    EXPECT_TRUE(cand->info().caps.quant_scales.empty()) << path;
    EXPECT_THAT(capabilities_text(cand->info().caps), Not(HasSubstr("quant"))) << path;
  }
  // The old descriptor's other capabilities are the quant plugin's (RMSNorm): the case reaches
  // the quant check, which declines it with the reason.
  EXPECT_THAT(make_plugin_candidate(NC_QUANT_OLD_DESCRIPTOR)->declines(quant_case("vllm_static_fp8")).value_or(""),
              HasSubstr("quantized outputs (q, scale) not supported"));
}

}  // namespace
}  // namespace normcheck::conf
