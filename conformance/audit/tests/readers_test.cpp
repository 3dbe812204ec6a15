// The readers on hand-built bytes: values read exactly, every malformed header rejected with a
// message that names the problem (never a crash, never an allocation sized by the file's
// claims), and the bundled profiles valid.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "binding.hpp"
#include "normcheck/audit/audit.hpp"
#include "normcheck/audit/checkpoint.hpp"

namespace {

using normcheck::audit::CheckpointError;
using Bytes = std::vector<std::uint8_t>;

void put_u64(Bytes& b, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_u32(Bytes& b, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_str(Bytes& b, const std::string& s) {
  put_u64(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}
void put_f32(Bytes& b, float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  put_u32(b, u);
}

Bytes safetensors(const std::string& header, const Bytes& data) {
  Bytes b;
  put_u64(b, header.size());
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

std::string error_of(const Bytes& b, bool gguf) {
  try {
    if (gguf)
      normcheck::audit::parse_gguf(b.data(), b.size(), "t");
    else
      normcheck::audit::parse_safetensors(b.data(), b.size(), "t");
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

TEST(Widening, HalfAndBfloat16AreExact) {
  EXPECT_EQ(normcheck::audit::f16_to_double(0x3c00), 1.0);
  EXPECT_EQ(normcheck::audit::f16_to_double(0x0001), std::ldexp(1.0, -24));  // smallest subnormal
  EXPECT_EQ(normcheck::audit::f16_to_double(0x7bff), 65504.0);
  EXPECT_EQ(normcheck::audit::f16_to_double(0xc000), -2.0);
  EXPECT_TRUE(std::isinf(normcheck::audit::f16_to_double(0x7c00)));
  EXPECT_TRUE(std::isnan(normcheck::audit::f16_to_double(0x7e00)));
  EXPECT_EQ(normcheck::audit::bf16_to_double(0x3f80), 1.0);
  EXPECT_EQ(normcheck::audit::bf16_to_double(0x3f81), 1.0 + std::ldexp(1.0, -7));
}

TEST(Safetensors, ReadsValues) {
  Bytes data;
  put_f32(data, 1.5f);
  put_f32(data, -0.25f);
  data.push_back(0x80);  // bf16 1.0 = 0x3f80, little-endian
  data.push_back(0x3f);
  const auto b = safetensors(
      R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "h": {"dtype": "BF16", "shape": [1], "data_offsets": [8, 10]}, "__metadata__": {"format": "pt"}})",
      data);
  const auto c = normcheck::audit::parse_safetensors(b.data(), b.size(), "t");
  ASSERT_EQ(c->tensors().size(), 2u);
  EXPECT_EQ(c->read(*c->find("w")), (std::vector<double>{1.5, -0.25}));
  EXPECT_EQ(c->read(*c->find("h")), (std::vector<double>{1.0}));
  EXPECT_EQ(c->metadata()["format"], "pt");
}

TEST(Safetensors, RejectsMalformedHeaders) {
  const Bytes zeros(16, 0);
  struct Case {
    std::string header, expect;
  };
  for (const auto& [header, expect] : std::vector<Case>{
           {R"({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", "beyond the data area"},
           {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", "end before they begin"},
           {R"({"w": {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]}})", "unknown dtype 'X9'"},
           {R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", "needs 12"},
           {R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 8]}})", "not a non-negative integer"},
           {R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})", "overflows"},
           {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", "data_offsets is not"},
           {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", "overlap"},
           {R"({"w": 3})", "entry is not an object"},
           {R"([1, 2])", "not a JSON object"},
           {R"({"w": )", "not valid JSON"},
       })
    EXPECT_NE(error_of(safetensors(header, zeros), false).find(expect), std::string::npos) << header << ": " << error_of(safetensors(header, zeros), false);
  Bytes beyond;
  put_u64(beyond, 1u << 20);
  beyond.push_back('{');
  EXPECT_NE(error_of(beyond, false).find("runs beyond the file"), std::string::npos);
  EXPECT_NE(error_of(Bytes{1, 2, 3}, false).find("truncated"), std::string::npos);
}

Bytes gguf_header(std::uint32_t version, std::uint64_t tensors, std::uint64_t kvs) {
  Bytes b{'G', 'G', 'U', 'F'};
  put_u32(b, version);
  put_u64(b, tensors);
  put_u64(b, kvs);
  return b;
}

TEST(Gguf, ReadsMetadataAndValues) {
  Bytes b = gguf_header(3, 1, 2);
  put_str(b, "general.architecture");
  put_u32(b, 8);
  put_str(b, "llama");
  put_str(b, "llama.attention.layer_norm_rms_epsilon");
  put_u32(b, 6);
  put_f32(b, 1e-5f);
  put_str(b, "output_norm.weight");
  put_u32(b, 1);
  put_u64(b, 3);
  put_u32(b, 0);  // F32
  put_u64(b, 0);
  while (b.size() % 32) b.push_back(0);
  for (float f : {1.0f, 2.0f, -3.0f}) put_f32(b, f);
  const auto c = normcheck::audit::parse_gguf(b.data(), b.size(), "t");
  EXPECT_EQ(c->metadata()["general.architecture"], "llama");
  EXPECT_EQ(c->metadata()["llama.attention.layer_norm_rms_epsilon"].get<double>(), static_cast<double>(1e-5f));
  EXPECT_EQ(c->read(*c->find("output_norm.weight")), (std::vector<double>{1.0, 2.0, -3.0}));
}

TEST(Gguf, RejectsMalformedHeaders) {
  EXPECT_NE(error_of(gguf_header(1, 0, 0), true).find("GGUF version 1"), std::string::npos);
  EXPECT_NE(error_of(gguf_header(3, 1ull << 62, 0), true).find("tensor count"), std::string::npos);
  Bytes s = gguf_header(3, 0, 1);
  put_u64(s, ~0ull);  // key length
  s.resize(s.size() + 16, 0);
  EXPECT_NE(error_of(s, true).find("metadata key needs"), std::string::npos);
  Bytes a = gguf_header(3, 0, 1);
  put_str(a, "k");
  put_u32(a, 9);
  put_u32(a, 9);  // array of arrays ...
  put_u64(a, 1);
  for (int i = 0; i < 8; ++i) {
    put_u32(a, 9);
    put_u64(a, 1);
  }
  EXPECT_NE(error_of(a, true).find("nested deeper"), std::string::npos) << error_of(a, true);
  Bytes t = gguf_header(3, 1, 0);
  put_str(t, "w");
  put_u32(t, 1);
  put_u64(t, 4);
  put_u32(t, 4);  // removed Q4_2
  put_u64(t, 0);
  EXPECT_NE(error_of(t, true).find("unknown ggml type 4"), std::string::npos);
  Bytes al = gguf_header(3, 0, 1);
  put_str(al, "general.alignment");
  put_u32(al, 4);
  put_u32(al, 24);
  EXPECT_NE(error_of(al, true).find("not a power of two"), std::string::npos);
}

TEST(Hdf5, RejectsGarbageImages) {
  const Bytes junk = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n', 0, 0, 0, 0};
  EXPECT_THROW(normcheck::audit::parse_hdf5_image(junk.data(), junk.size(), "junk.h5"), CheckpointError);
}

TEST(NamePattern, HfSuffixesGgufWholeNames) {
  using normcheck::audit::detail::NamePattern;
  int layer = -2;
  const NamePattern hf("model.layers.{L}.input_layernorm.weight", false);
  EXPECT_TRUE(hf.match("model.layers.12.input_layernorm.weight", layer));
  EXPECT_EQ(layer, 12);
  EXPECT_TRUE(hf.match("language_model.model.layers.3.input_layernorm.weight", layer));
  EXPECT_EQ(layer, 3);
  EXPECT_FALSE(hf.match("xmodel.layers.3.input_layernorm.weight", layer));  // not at a dot
  EXPECT_FALSE(hf.match("model.layers..input_layernorm.weight", layer));    // no digits
  EXPECT_FALSE(hf.match("model.layers.1234567.input_layernorm.weight", layer));  // 7 digits
  EXPECT_FALSE(hf.match("model.layers.3.input_layernorm.weight.extra", layer));
  const NamePattern single("ln_f.weight", false);
  EXPECT_TRUE(single.match("transformer.ln_f.weight", layer));
  EXPECT_EQ(layer, -1);
  const NamePattern gguf("blk.{L}.attn_norm.weight", true);
  EXPECT_TRUE(gguf.match("blk.0.attn_norm.weight", layer));
  EXPECT_FALSE(gguf.match("x.blk.0.attn_norm.weight", layer));
  // A name of a megabyte of dots costs time proportional to it, not a stack frame per character.
  EXPECT_FALSE(hf.match(std::string(1 << 20, '.'), layer));
}

TEST(Profiles, BundledOnesLoad) {
  const auto profiles = normcheck::audit::load_profiles(normcheck::audit::default_profiles_dir());
  std::vector<std::string> names;
  for (const auto& p : profiles) names.push_back(p.name);
  for (const char* want : {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gpt2", "bert", "t5", "olmo2", "phi3"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
}

TEST(Profiles, InvalidOneIsNamed) {
  const auto dir = std::filesystem::temp_directory_path() / ("audit_profiles_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "bad.json") << R"({"name": "bad", "op": "rmsnorm", "offset": {"hf": 0}})";
  try {
    normcheck::audit::load_profiles(dir.string());
    ADD_FAILURE() << "accepted an invalid profile";
  } catch (const normcheck::audit::AuditInputError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("offset"), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
