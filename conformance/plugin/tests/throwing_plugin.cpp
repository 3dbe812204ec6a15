// A C++ plugin that breaks candidate.h's rule and lets an exception out of run: the host must
// turn it into CandidateError rather than terminate.
#include <stdexcept>

#include "normcheck/candidate.h"

namespace {

int run(void*, const nc_case*, const nc_named_tensor*, int32_t, nc_named_tensor*, int32_t, char*, size_t) {
  throw std::runtime_error("std::vector too long (deliberate)");
}

nc_candidate make_descriptor() {
  nc_candidate d{};
  d.abi_version = NORMCHECK_CANDIDATE_ABI_VERSION;
  d.struct_size = sizeof(nc_candidate);
  d.name = "throwing_plugin";
  d.ops = 1u << NC_LAYERNORM;
  d.dtypes = 1u << NC_FLOAT32;
  d.compute_dtypes = 1u << NC_FLOAT32;
  d.directions = 1u << NC_FORWARD;
  d.contracts = "*";
  d.run = run;
  return d;
}

const nc_candidate kCandidate = make_descriptor();

}  // namespace

// C linkage and default visibility come from candidate.h's declaration.
const nc_candidate* normcheck_candidate(void) { return &kCandidate; }
