// The tolerance model (TOLERANCE.md has the derivation of every line).
//
// Notation: u = unit roundoff of the compute dtype, gam(k) = k u / (1 - k u), eta = half the
// smallest subnormal spacing of the compute dtype (the absolute floor of a rounding). Row
// quantities are evaluated in binary64 from the case's inputs: they are magnitudes that scale
// the bounds, so their own rounding errors (relative 2^-53) do not matter; the comparison itself
// is against the certified expected_f64.
#include "normcheck/judge/tolerance.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

#include "normcheck/reference/outputs.hpp"
#include "normcheck/reference/contract.hpp"
#include "tolerance_model.hpp"

namespace normcheck::conf {

// The table. Each constant is justified in TOLERANCE.md, section "The table".
const BoundConstants kBounds{
    /*welford=*/6.0,   // Chan & Lewis (1979): updating algorithms err by O(n u kappa); 6 covers
                       // |x_k - M_{k-1}| <= 3 rms(d) in the product rule (TOLERANCE.md, 3.2)
    /*sqrt_div=*/4.0,  // 2 ulp: correctly rounded sqrt + division, or CUDA rsqrtf (2 ulp)
    /*mistrust=*/0.5,  // a bound of half the row's standard deviation on x-hat means nothing
    /*f64_result=*/1.0,   // a binary64 sum rounded once into the compute dtype (TOLERANCE.md, 9)
    /*exact_round=*/1.0,  // an exact sum of squares divided by n = 2^k: exact; one rounding of margin
    /*quant_slop=*/0x1p-50,  // y = expected_f64/q / m: 2^-52 (the fixture) + 2^-53 (the division), doubled
};

namespace {

using ref::DType;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace



namespace tol {

std::map<std::string, OutputAllowance> Model::derive() {
  const std::int64_t R = g_.rows, n = g_.cols;
  const bool ln = c_.op == ref::Op::layernorm;
  const bool fwd = c_.direction == ref::Direction::forward;
  std::map<std::string, OutputAllowance> out = empty_allowances();
  // Column (parameter) values shared by all rows.
  std::vector<double> scale(n, 1.0), e_scale(n, 0.0), scale_fwd(n, 1.0), e_scale_fwd(n, 0.0);
  std::vector<double> bias(n, 0.0), e_bias(n, 0.0);
  for (std::int64_t j = 0; j < n; ++j) {
    if (w_) {
      const double w = w_->data[j];
      scale[j] = c_.weight_offset + w;
      e_scale[j] = cp_.conv(w, c_.dtype_param) + (c_.weight_offset != 0 ? cp_.u * std::fabs(scale[j]) : 0.0);
      scale_fwd[j] = scale[j];
      e_scale_fwd[j] = e_scale[j];
      if (pts_.scale) {
        scale_fwd[j] = ref::round_to(scale[j], *pts_.scale);
        e_scale_fwd[j] = through_rounding(scale[j], e_scale[j], slack_of(std::fabs(scale[j]), 1), *pts_.scale);
      }
    }
    if (b_) {
      bias[j] = b_->data[j];
      e_bias[j] = cp_.conv(bias[j], c_.dtype_param);
    }
  }
  // Column sums of the backward pass: sum over rows of |terms| and of propagated errors.
  ColumnBound dw, db, drb;
  dw.resize(n);
  db.resize(n);
  drb.resize(n);
  std::vector<std::uint8_t> col_nonfinite(n, 0);
  std::int64_t untrusted_rows = 0;
  Worst worst;
  RowModel m;
  for (std::int64_t row = 0; row < R; ++row) {
    row_model(row, m);
    worst.see(m);
    if (!m.trusted) ++untrusted_rows;
    const std::int64_t base = g_.row_base[row];
    if (fwd) {
      auto& y = out.at("y");
      for (std::int64_t j = 0; j < n; ++j) {
        const std::size_t k = static_cast<std::size_t>(base + g_.col_delta[j]);
        if (!m.finite) {
          // The finite elements of such a row are the bias (RMSNorm: rstd = 0), which a correct
          // kernel rounds to dtype_out once (found by the property tests: a float64 bias
          // rounded to a float32 y failed the subnormal-sized allowance).
          y.abs[k] = std::max(ieee_allowance(c_.dtype_out),
                              final_allowance(bias[j], e_bias[j] + cp_.eta, c_.dtype_out));
          y.nan_ok[k] = 1;
          continue;
        }
        if (!m.trusted) {
          y.abs[k] = kNaN;
          continue;
        }
        double xh = m.xhat[j], e_xh = m.e_xhat[j];
        // Our value against the reference's after the contract's rounding points (point_slack):
        // 0 where ours rounds as the exact one does, else a neighbour's distance.
        double p_slack = 0;
        if (pts_.xhat) {
          e_xh = through_rounding(xh, e_xh, m.slack_xhat(j), *pts_.xhat);
          p_slack = point_slack(xh, m.slack_xhat(j), *pts_.xhat);
          xh = ref::round_to(xh, *pts_.xhat);
        }
        double mul = xh, e_mul = e_xh;
        if (w_) {
          mul = xh * scale_fwd[j];
          e_mul = std::fabs(scale_fwd[j]) * e_xh + std::fabs(xh) * e_scale_fwd[j] + e_xh * e_scale_fwd[j] +
                  cp_.u * std::fabs(mul);
          p_slack *= std::fabs(scale_fwd[j]);
        }
        if (pts_.mul) {
          const double s_mul = m.slack_xhat(j) * std::fabs(scale_fwd[j]) + slack_of(std::fabs(mul), 1);
          e_mul = through_rounding(mul, e_mul, s_mul, *pts_.mul);
          p_slack = point_slack(mul, s_mul + p_slack, *pts_.mul);
          mul = ref::round_to(mul, *pts_.mul);
        }
        const double yv = mul + bias[j];
        const double e_y = e_mul + e_bias[j] + (b_ ? cp_.u * std::fabs(yv) + cp_.eta : 0.0);
        y.abs[k] = final_out(yv, e_y, m.slack_xhat(j) * std::fabs(scale_fwd[j]) + slack_of(std::fabs(yv), 3) + p_slack,
                             c_.dtype_out);
      }
      if (!m.finite) {
        if (ln) out.at("mean").nan_ok[row] = 1;
        out.at("rstd").nan_ok[row] = 1;
      }
      if (ln) out.at("mean").abs[row] = !m.finite  ? ieee_allowance(c_.dtype_compute)
                                        : m.overflow_mean || m.ar_overflow_mean ? kNaN
                                                     : final_out(m.mean, m.e_mean, slack_of(m.A, static_cast<double>(n)), c_.dtype_compute);
      out.at("rstd").abs[row] = !m.finite ? ieee_allowance(c_.dtype_compute)
                                : m.e_q_rel >= kBounds.mistrust || m.overflow || m.ar_overflow
                                    ? kNaN
                                    : final_out(m.rstd, m.rstd * m.e_rstd_rel, slack_of(m.rstd * (std::isfinite(m.kappa) ? m.kappa * m.kappa : 1.0), 2.0 * static_cast<double>(n) + 8), c_.dtype_compute);
      if (r_) {
        auto& ro = out.at("residual_out");
        for (std::int64_t j = 0; j < n; ++j) {
          const std::size_t k = static_cast<std::size_t>(base + g_.col_delta[j]);
          // residual_out is h itself: its elements are independent, NaN only where h is NaN, so
          // a finite h in a row holding a NaN or an infinity keeps the allowance of its own
          // roundings (found by the property tests: a correctly rounded x + residual failed).
          // residual_out is h after the contract's h point: where that rounding may go either
          // way (through_rounding), a correct kernel's h is a neighbour (found by the property
          // tests: h summed in float32, then rounded to float16 onto a tie).
          ro.abs[k] = !std::isfinite(m.h[j]) ? ieee_allowance(c_.dtype_residual)
                      : m.h_overflow[j]      ? kNaN
                                             : final_allowance(m.h[j], std::max(m.e_h_pre[j], m.e_h_post[j]),
                                                               c_.dtype_residual);
        }
      }
      continue;
    }
    // A row whose backward sums may overflow counts as untrusted: its dh enters
    // dresidual_bias, and the column sums are MISTRUSTED with it (dbias excepted, as above).
    if (!backward_row(row, m, scale, e_scale, out, dw, db, drb, col_nonfinite, worst) && m.trusted) ++untrusted_rows;
  }
  if (!fwd) {
    auto column = [&](const char* name, const ColumnBound& cb) {
      auto it = out.find(name);
      if (it == out.end()) return;
      for (std::int64_t j = 0; j < n; ++j) {
        double& a = it->second.abs[static_cast<std::size_t>(j)];
        if (col_nonfinite[j]) {
          // A column sum that a non-finite row enters: the reference gives NaN (its policy),
          // while the IEEE result of a kernel depends on its order and on whether it forms
          // x-hat at all (dbias = sum dy is finite when only x is infinite). Not constrained.
          a = kInf;
          it->second.nan_ok[static_cast<std::size_t>(j)] = 1;
        }
        else if (untrusted_rows > 0 && std::string_view(name) != "dbias") a = kNaN;
        else if (may_overflow(cb.abs[static_cast<std::size_t>(j)] + cb.err[static_cast<std::size_t>(j)], R, worst))
          a = kNaN;
        else a = column_allowance(cb, static_cast<std::size_t>(j), R);
      }
    };
    column("dweight", dw);
    column("dbias", db);
    column("dresidual_bias", drb);
  }
  count_mistrusted(out, worst, untrusted_rows, R, "");
  return out;
}

}  // namespace tol

std::map<std::string, OutputAllowance> derive_allowances(const ref::Case& c, const Reduction& red) {
  // Residual blocks are held to `any`: their FFN products are not the norm's reductions
  // (TOLERANCE.md, section 9).
  if (c.block != ref::Block::none) return tol::Model(c).derive_block();
  return tol::Model(c, red).derive();
}

bool StatsAllReduce::active(ref::DType compute) const {
  return ranks >= 2 && (flush_subnormals || ref::unit_roundoff(dtype) > ref::unit_roundoff(compute));
}

std::map<std::string, OutputAllowance> derive_allowances(const ref::Case& c, const Reduction& red,
                                                         const StatsAllReduce& ar) {
  if (c.block != ref::Block::none)
    throw ref::CaseError("block", "a statistics all-reduce over tp ranks is derived for plain norms only");
  return tol::Model(c, red, ar).derive();
}

std::string name_of(const Reduction& r) {
  switch (r.kind) {
    case ReductionKind::any: return "any";
    case ReductionKind::two_pass: return "two_pass";
    case ReductionKind::welford: return "welford";
    case ReductionKind::pairwise: return fmt::format("pairwise:{}", r.block);
    case ReductionKind::blocked: return fmt::format("blocked:{}", r.block);
    case ReductionKind::accumulate_f64: return "accumulate_f64";
  }
  return "any";
}

Reduction parse_reduction(std::string_view s) {
  const auto colon = s.find(':');
  const std::string_view name = s.substr(0, colon);
  const std::string_view arg = colon == std::string_view::npos ? std::string_view{} : s.substr(colon + 1);
  const bool has_arg = colon != std::string_view::npos;
  static constexpr std::pair<std::string_view, ReductionKind> kNames[] = {
      {"any", ReductionKind::any},           {"two_pass", ReductionKind::two_pass},
      {"welford", ReductionKind::welford},   {"pairwise", ReductionKind::pairwise},
      {"blocked", ReductionKind::blocked},   {"accumulate_f64", ReductionKind::accumulate_f64}};
  for (const auto& [n, k] : kNames) {
    if (n != name) continue;
    const bool blocked = k == ReductionKind::pairwise || k == ReductionKind::blocked;
    if (!blocked) {
      if (has_arg)
        throw std::invalid_argument(fmt::format("reduction class '{}' takes no block size (got '{}')", n, s));
      return Reduction{k, 0};
    }
    if (!has_arg || arg.empty())
      throw std::invalid_argument(
          fmt::format("reduction class '{}' needs a block size: '{}:B', B the most terms a group holds", n, n));
    std::int64_t b = 0;
    for (char ch : arg) {
      if (ch < '0' || ch > '9' || b > (std::int64_t{1} << 40))
        throw std::invalid_argument(fmt::format("reduction class '{}': block size '{}' is not a positive integer", s, arg));
      b = b * 10 + (ch - '0');
    }
    if (b < 1) throw std::invalid_argument(fmt::format("reduction class '{}': block size must be >= 1", s));
    return Reduction{k, b};
  }
  throw std::invalid_argument(fmt::format(
      "unknown reduction class '{}' (any, two_pass, welford, pairwise:B, blocked:B, accumulate_f64)", s));
}

}  // namespace normcheck::conf
