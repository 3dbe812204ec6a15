// libFuzzer target for one checkpoint reader (NORMCHECK_FUZZ_FORMAT: 0 safetensors, 1 GGUF,
// 2 HDF5 file image): parse, read every readable tensor of modest size, and run the audit on
// what was parsed. A CheckpointError or AuditInputError is the expected answer to bad bytes;
// anything else (a crash, a sanitizer report, another exception, a leak) is a finding.
#include <cstddef>
#include <cstdint>

#include "normcheck/audit/audit.hpp"
#include "normcheck/audit/checkpoint.hpp"

namespace {

std::unique_ptr<normcheck::audit::Checkpoint> parse(const std::uint8_t* data, std::size_t size) {
#if NORMCHECK_FUZZ_FORMAT == 0
  return normcheck::audit::parse_safetensors(data, size, "fuzz.safetensors");
#elif NORMCHECK_FUZZ_FORMAT == 1
  return normcheck::audit::parse_gguf(data, size, "fuzz.gguf");
#else
  return normcheck::audit::parse_hdf5_image(data, size, "fuzz.h5");
#endif
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto profiles = normcheck::audit::load_profiles(normcheck::audit::default_profiles_dir());
  try {
    const auto c = parse(data, size);
    for (const auto& t : c->tensors())
      if (t.readable && t.elements <= (1u << 16)) (void)c->read(t);
    (void)normcheck::audit::audit_checkpoint(*c, profiles, {});
  } catch (const normcheck::audit::CheckpointError&) {
  } catch (const normcheck::audit::AuditInputError&) {
  }
  return 0;
}
