// Sharded norms on the C++ emulation of shard plans (conformance/sharding/, README.md "Sharded
// norms on the emulation"): plans drawn and shrunk by RapidCheck, the emulated correct
// computation held to the unsharded certified reference by check_sharded (the tolerance model
// plus the sharding term, nothing else), and each planted fault rejected with its diagnosis.
// No candidate runs: `normcheck prop --candidate shard:emulation`.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <rapidcheck.h>
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include "normcheck/conformance/runner.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "normcheck/properties/properties.hpp"
#include "normcheck/sharding/shard.hpp"
#include "property_support.hpp"

namespace normcheck::prop {
namespace {

using namespace detail;

// What the emulation computes (shard::emulate): plain norms in float32 compute, x, parameters
// and outputs in any 16- or 32-bit float, the exact contract (it rounds once per output, as a
// correct kernel may). General axes are drawn so that QK-norm over [heads, head_dim] (axis -2)
// comes up; channels-first layouts are discarded by draw_plan (normalized dims not trailing).
class ShardEmulation final : public conf::Candidate {
 public:
  // `fault`: "" (correct), or a fault of shard::emulated_faults() planted in sharded_agreement.
  explicit ShardEmulation(std::string fault) : fault_(std::move(fault)) {
    info_.name = std::string(kShardEmulation) + (fault_.empty() ? "" : ":" + fault_);
    info_.kind = fault_.empty() ? conf::CandidateKind::correct : conf::CandidateKind::mutant;
    info_.description =
        fault_.empty()
            ? "the C++ emulation of shard plans (conformance/sharding/src/emulate.cpp): the bundled torch "
              "implementation's arithmetic rank by rank, correct and with each planted sharding fault"
            : fmt::format("the C++ emulation of shard plans with the fault {} planted in sharded_agreement",
                          fault_);
    if (!fault_.empty()) {
      info_.fault_class = "I";
      info_.fault = fault_;
    }
    info_.caps.dtypes = {ref::DType::float32, ref::DType::bfloat16, ref::DType::float16};
    info_.caps.compute_dtypes = {ref::DType::float32};
    info_.caps.contracts = {"exact"};
    info_.caps.residual = false;
    info_.caps.blocks = false;
  }
  const conf::CandidateInfo& info() const override { return info_; }
  const std::string& fault() const { return fault_; }
  // Its properties draw a plan with each case and call shard::emulate; a case alone is not
  // something it runs.
  conf::Outputs run(const ref::Case&) override {
    throw conf::CandidateError(
        fmt::format("{0} runs shard plans through its own properties (normcheck prop --list --candidate {0})",
                    kShardEmulation));
  }

 private:
  std::string fault_;
  conf::CandidateInfo info_;
};

// The reference's cost dominates a test, and the plans need no more than this: rows up to 4096
// of up to 4 elements, or hidden sizes up to the limit over few rows.
CaseLimits sharded_limits(const Context& ctx) {
  CaseLimits lim = ctx.limits;
  lim.max_elements = 1 << 14;
  lim.many_rows = false;
  return lim;
}

// Sizes of `parts` contiguous shards of `n` elements: "R" (numpy.array_split's, the first n % R
// one larger) or drawn sizes s1+...+sR, each >= 1 (unequal shards). Shrinks towards "R".
std::string draw_split(std::int64_t n, int parts, const std::string& what) {
  if (n < parts) RC_DISCARD(fmt::format("{} has {} elements, fewer than its {} ranks", what, n, parts));
  if (draw_index(2) == 0) return std::to_string(parts);
  std::vector<std::int64_t> sizes;
  std::int64_t left = n;
  for (int k = 0; k + 1 < parts; ++k) {
    // leave at least one element for each later shard
    const auto s =
        1 + static_cast<std::int64_t>(draw_index(static_cast<std::size_t>(left - (parts - 1 - k))));
    sizes.push_back(s);
    left -= s;
  }
  sizes.push_back(left);
  return fmt::format("{}", fmt::join(sizes, "+"));
}

// A shard plan for the case (conformance/sharding/README.md, "Shard plans"): tp (2-8 ranks), sp
// (2-8 ranks, over any row dim: QK-norm per head is sp over the heads) or both (a grid of at
// most 8 ranks); equal or unequal contiguous shards; the gradients' all-reduce and (with tp ranks)
// the statistics' all-reduce each in float32, bfloat16 or float16, the dtypes the runtime offers;
// one plan in four declares all-reduces that flush subnormals. Shrinks towards tp=2. Plans that do not fit
// the case (more ranks than elements along a split dim) are discarded. `need` (a fault's) restricts the
// plan to those with tp ranks (tp, both) or with sp ranks (sp, both).
enum class Need { any, tp, sp };
shard::Plan draw_plan(const ref::Case& c, Need need = Need::any) {
  const auto g = ref::geometry_of(c);
  const auto rank = static_cast<std::int64_t>(g.shape.size()),
             k = static_cast<std::int64_t>(g.norm_dims.size());
  for (std::int64_t i = 0; i < k; ++i)
    if (g.norm_dims[static_cast<std::size_t>(i)] != rank - k + i)
      RC_DISCARD("the normalized dims are not trailing (sharded cases normalize trailing dims)");
  const std::int64_t first = rank - k;  // tp splits this dim; sp one of the dims before it
  enum Kind { tp, sp, both };
  const Kind kind = draw_from(need == Need::tp   ? std::vector<Kind>{tp, both}
                              : need == Need::sp ? std::vector<Kind>{sp, both}
                                                 : std::vector<Kind>{tp, sp, both});
  int T = 1, S = 1;
  if (kind == tp) T = 2 + static_cast<int>(draw_index(7));
  if (kind == sp) S = 2 + static_cast<int>(draw_index(7));
  if (kind == both)
    std::tie(T, S) = draw_from(std::vector<std::pair<int, int>>{{2, 2}, {2, 3}, {3, 2}, {2, 4}, {4, 2}});
  std::vector<std::string> items;
  if (T > 1) {
    items.push_back("tp=" +
                    draw_split(g.shape[static_cast<std::size_t>(first)], T, fmt::format("dim {}", first)));
    // the statistics' all-reduce: float32 (no item), or a 16-bit dtype (TOLERANCE.md, section 11)
    if (const auto r = draw_index(3); r > 0)
      items.push_back(r == 1 ? "stats_reduce=bfloat16" : "stats_reduce=float16");
  }
  if (S > 1) {
    if (first == 0) RC_DISCARD("no row dim for sp to split");
    const auto dim = static_cast<std::int64_t>(draw_index(static_cast<std::size_t>(first)));
    items.push_back("sp=" +
                    draw_split(g.shape[static_cast<std::size_t>(dim)], S, fmt::format("dim {}", dim)));
    if (dim != 0) items.push_back(fmt::format("sp_dim={}", dim));
    // the gradients' all-reduce: float32 (no item), or one of the 16-bit dtypes the grammar offers
    if (const auto r = draw_index(3); r > 0) items.push_back(r == 1 ? "reduce=bfloat16" : "reduce=float16");
  }
  // all-reduces that flush subnormals of their dtype, declared (one plan in four)
  if (draw_index(4) == 3) items.push_back("flush_subnormals=1");
  return shard::parse_plan(fmt::format("{}", fmt::join(items, ",")));
}

// Loss scaling: the upstream gradient of a backward case multiplied by 2^k, k drawn from {0, 8,
// 12, 16} (shrinks towards 1) and lowered until every element stays finite in dy's dtype (float16
// dy of N(0, 1) keeps about 2^13). Mixed-precision training scales the loss, and so dy, by up to 2^16
// (the usual initial scale of a dynamic loss scaler), and a float16 all-reduce of such gradients
// meets float16's range: at 2^16 a column sum of |dy x-hat| passes 65504 within two rows
// (conformance/sharding/README.md, "float16 all-reduce"); with dy ~ N(0, 1) alone no column of
// 4096 rows comes near it. The product is exact (a power of two).
void scale_gradients(ref::Case& c) {
  if (c.direction != ref::Direction::backward || !c.inputs.count("dy")) return;
  auto& dy = c.inputs.at("dy");
  int k = std::vector<int>{0, 8, 12, 16}[draw_index(4)];
  auto fits = [&](int e) {
    return std::all_of(dy.data.begin(), dy.data.end(), [&](double v) {
      return !std::isfinite(v) || std::isfinite(ref::round_to(std::ldexp(v, e), dy.dtype));
    });
  };
  while (k > 0 && !fits(k)) --k;
  for (double& v : dy.data) v = std::ldexp(v, k);
}

void sharded_agreement(Context& ctx) {
  auto d = draw_case(ctx.cand.info().caps, sharded_limits(ctx));
  scale_gradients(d.c);
  const auto plan = draw_plan(d.c);
  const auto* emu = dynamic_cast<const ShardEmulation*>(&ctx.cand);
  const std::string fault = emu ? emu->fault() : "";
  const auto res = shard::check_sharded(reference_case(d.c, "prop"), plan, shard::emulate(d.c, plan, fault));
  if (res.verdict != conf::Verdict::passed && res.verdict != conf::Verdict::mistrusted)
    fail(ctx, d.c, d.family,
         fmt::format("plan {}: the {} sharded computation is {}", plan.text,
                     fault.empty() ? "correct" : "emulated (fault " + fault + ")", conf::describe(res)),
         std::nullopt, false, plan.text, fault);
}

// Where the faulty outputs (gathered and every rank's copy) lie more than twice the allowance
// plus an ulp from the correct emulation's: the correct ones are within allowance + ulp of the
// exact value (sharded_agreement; the ulp where the rounding is undecided), so such an element is
// beyond its allowance and the fault must be rejected. Nearer, a correct kernel's error may hide
// it: such a draw tests nothing. Returns the first such element, described.
std::optional<std::string> visible_effect(const shard::ShardedOutputs& correct,
                                          const shard::ShardedOutputs& faulty,
                                          const std::map<std::string, conf::OutputAllowance>& allow) {
  auto compare = [&](const std::string& what, const ref::Tensor& c, const ref::Tensor& f,
                     const conf::OutputAllowance& a) -> std::optional<std::string> {
    for (std::size_t i = 0; i < c.data.size() && i < f.data.size() && i < a.abs.size(); ++i) {
      if (std::isnan(a.abs[i]) || !std::isfinite(c.data[i]) || !std::isfinite(f.data[i])) continue;
      const double bound = 2 * (a.abs[i] + conf::ulp_of(std::fabs(c.data[i]), c.dtype));
      if (std::fabs(f.data[i] - c.data[i]) > bound)
        return fmt::format(
            "{} element {} is {} where the correct computation gives {}, more than twice its "
            "allowance {} plus an ulp apart",
            what, i, value_text(f.data[i], f.dtype), value_text(c.data[i], c.dtype), a.abs[i]);
    }
    return std::nullopt;
  };
  for (const auto& [name, f] : faulty.gathered) {
    const auto a = allow.find(name);
    const auto c = correct.gathered.find(name);
    if (a == allow.end() || c == correct.gathered.end()) continue;
    if (auto why = compare(name, c->second, f, a->second)) return why;
    const auto fc = faulty.copies.find(name), cc = correct.copies.find(name);
    if (fc == faulty.copies.end() || cc == correct.copies.end()) continue;
    for (std::size_t k = 1; k < fc->second.size() && k < cc->second.size(); ++k)
      if (auto why = compare(fmt::format("{} copy {}", name, k), cc->second[k], fc->second[k], a->second))
        return why;
  }
  return std::nullopt;
}

// The fault is drawn first (each as often), then a case and a plan where it can apply: the
// gradient faults need a backward case with parameters and sp ranks, which a plan drawn for any
// case has in one test of ten.
void sharded_faults_rejected(Context& ctx) {
  const auto& f = draw_from(shard::emulated_faults());
  CaseLimits lim = sharded_limits(ctx);
  if (f.rms_only) lim.ops = {ref::Op::rmsnorm};
  if (!f.tp) {
    lim.directions = {ref::Direction::backward};
    lim.affines = {ref::Affine::weight, ref::Affine::weight_bias};
  }
  auto d = draw_case(ctx.cand.info().caps, lim);
  scale_gradients(d.c);
  const auto plan = draw_plan(d.c, f.tp ? Need::tp : Need::sp);
  if (const auto why = shard::fault_inapplicable(f, d.c, plan); !why.empty())
    RC_DISCARD(fmt::format("fault {} does not apply: {}", f.name, why));
  const auto faulty = shard::emulate(d.c, plan, f.name);
  const auto effect = visible_effect(shard::emulate(d.c, plan), faulty, shard::sharded_allowances(d.c, plan));
  if (!effect) RC_DISCARD("the fault moves no output beyond twice its allowance on this draw");
  const auto res = shard::check_sharded(reference_case(d.c, "prop"), plan, faulty);
  if (res.verdict != conf::Verdict::failed)
    fail(ctx, d.c, d.family,
         fmt::format("fault {} on plan {} is not rejected, though {}: {}", f.name, plan.text, *effect,
                     conf::describe(res)),
         std::nullopt, false, plan.text, f.name);
  if (res.message.find(f.diagnosis) == std::string::npos)
    fail(
        ctx, d.c, d.family,
        fmt::format("fault {} on plan {} is rejected, but the diagnosis does not name it ('{}' expected): {}",
                    f.name, plan.text, f.diagnosis, conf::describe(res)),
        std::nullopt, false, plan.text, f.name);
}

}  // namespace

bool is_shard_emulation(std::string_view spec) {
  return spec == kShardEmulation || spec.starts_with(std::string(kShardEmulation) + ":");
}

std::unique_ptr<conf::Candidate> make_shard_emulation(std::string_view spec) {
  if (!is_shard_emulation(spec))
    throw std::invalid_argument(fmt::format("'{}' is not {}[:FAULT]", spec, kShardEmulation));
  const std::string fault(spec.substr(std::min(spec.size(), kShardEmulation.size() + 1)));
  std::vector<std::string> known;
  for (const auto& f : shard::emulated_faults()) known.push_back(f.name);
  if (!fault.empty() && std::find(known.begin(), known.end(), fault) == known.end())
    throw std::invalid_argument(
        fmt::format("{}: unknown fault '{}' (the emulated faults: {})", spec, fault, fmt::join(known, ", ")));
  return std::make_unique<ShardEmulation>(fault);
}

const std::vector<Property>& shard_properties() {
  static const std::vector<Property> all{
      {"sharded_agreement",
       "the correct sharded computation (emulated; drawn tp/sp plans of 2-8 ranks, equal and unequal "
       "shards, float32, bfloat16 or float16 gradient and statistics all-reduces, flushing or not, gradients "
       "loss-scaled by up to 2^16) "
       "agrees with the unsharded certified reference within the tolerance model plus the sharding term, "
       "every rank's copy bit-identical",
       sharded_agreement},
      {"sharded_faults_rejected",
       "each planted sharding fault (rank-local statistics, sum of squares over the world size, "
       "gradients not reduced, averaged, reduced twice) that moves an output beyond twice its allowance "
       "is FAILED and diagnosed as that fault",
       sharded_faults_rejected},
  };
  return all;
}

}  // namespace normcheck::prop
