// The engine: one parameterized model of the norm (plain norms forward and backward, residual
// blocks forward and backward) that predicts every output of a case under a dialect's knobs
// (fault_model.hpp), in double, with the low-precision arithmetic of a fault emulated where the
// fault is a rounding effect.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fault_model.hpp"
#include "normcheck/reference/outputs.hpp"

namespace normcheck::conf::diag {


// Which elements a prediction covers: `rows` of the case (all of them, or a sample), and for
// each output the flat index of every predicted element, in the order of the prediction's
// vector.
struct Layout {
  std::vector<std::int64_t> rows;
  bool all_rows = true;
  std::map<std::string, std::vector<std::size_t>> flat;
};

// The parameterized model of a case (plain norms forward and backward; blocks forward).
template <class Real>
class Engine {
  using LD = Real;
  using RowStat = RowStatT<Real>;

 public:
  explicit Engine(const ref::Case& c) : c_(c), g_(ref::geometry_of(c)) {
    x_ = input(c, "x");
    w_ = c.affine != ref::Affine::none ? input(c, "weight") : nullptr;
    b_ = c.affine == ref::Affine::weight_bias ? input(c, "bias") : nullptr;
    r_ = c.residual != ref::Residual::none ? input(c, "residual") : nullptr;
    rb_ = c.residual == ref::Residual::add_bias ? input(c, "residual_bias") : nullptr;
    dy_ = c.direction == ref::Direction::backward ? input(c, "dy") : nullptr;
    stats_spec_ = spec();
  }

  Knobs spec() const {
    Knobs k;
    k.centre = c_.op == ref::Op::layernorm;
    k.eps = c_.epsilon;
    k.offset = c_.weight_offset;
    k.pts = ref::resolve_points(c_);
    return k;
  }

  const ref::Geometry& geometry() const { return g_; }

  // The layout of predictions over `rows` (every row: nullptr). Backward column sums are always
  // over every column; on a sample of rows they are predicted only where they follow from the
  // spec's (prime_columns).
  Layout layout(const std::vector<std::int64_t>* rows) const {
    Layout l;
    const bool all = !rows;
    l.all_rows = all;
    if (all) {
      l.rows.resize(static_cast<std::size_t>(g_.rows));
      for (std::int64_t r = 0; r < g_.rows; ++r) l.rows[r] = r;
    } else {
      l.rows = *rows;
    }
    std::vector<std::size_t> elems, per_row, cols;
    for (auto r : l.rows) {
      per_row.push_back(static_cast<std::size_t>(r));
      for (std::int64_t j = 0; j < g_.cols; ++j) elems.push_back(off(r, j));
    }
    for (std::int64_t j = 0; j < g_.cols; ++j) cols.push_back(static_cast<std::size_t>(j));
    for (const auto& [name, spec] : output_specs(c_)) {
      if (c_.block != ref::Block::none) {
        // Blocks: y and dx per element of the rows; the parameter gradients ([L, K, D], the
        // FFN's) over every element, on every row only (a sample scores dx alone).
        if (name == "y" || name == "dx") {
          l.flat[name] = elems;
        } else if (all) {
          std::size_t size = 1;
          for (auto d : spec.shape) size *= static_cast<std::size_t>(d);
          auto& f = l.flat[name];
          f.resize(size);
          for (std::size_t i = 0; i < size; ++i) f[i] = i;
        }
        continue;
      }
      if (name == "mean" || name == "rstd")
        l.flat[name] = per_row;
      else if (name == "dweight" || name == "dbias" || name == "dresidual_bias")
        l.flat[name] = cols;
      else if (c_.block == ref::Block::none || name == "y")
        l.flat[name] = elems;
    }
    return l;
  }

  // columns_only (backward): the column sums only, no dx (a cheaper bound for a ranking);
  // with only_cols (see subset_bound_ok), dweight and dbias of those columns only, the others
  // without a prediction (infinite slack: not scored).
  //
  // The stages: h (and residual_out's h) of the layout's rows, their statistics, then the
  // forward outputs (x-hat, affine, residual_out, mean and rstd) or the backward ones (dx,
  // dresidual, the column sums); residual blocks are run_block.
  Predictions run(const Knobs& k, const Layout& l, bool columns_only = false,
                  const std::vector<std::int64_t>* only_cols = nullptr) const {
    if (c_.block != ref::Block::none) return run_block(k, l);
    Rows hr;
    h_stage(k, l, hr);
    stats_stage(k, l, hr);
    if (k.saved_stats && c_.direction == ref::Direction::backward) {
      hr.st_saved = *hr.st;
      for (auto& s : hr.st_saved) s.mean = rnd(s.mean, *k.saved_stats), s.rstd = rnd(s.rstd, *k.saved_stats);
      hr.st = &hr.st_saved;
    }
    Predictions p = c_.direction == ref::Direction::forward ? run_forward(k, l, hr)
                                                             : run_backward(k, l, hr, columns_only, only_cols);
    p.var_below_zero = hr.var_below_zero;
    return p;
  }

  // Computes the spec's column sums on every row (for dialects evaluated on a sample of rows);
  // returns the spec's predictions on every row.
  Predictions prime_columns(const Knobs& spec, const Layout& all) {
    spec_ = spec;
    return run(spec, all);
  }

  // Whether run(k, every row, columns_only, only_cols) can predict a subset of the column sums:
  // no residual_bias (its sum needs every column's dh), parameters not remapped, sums reduced
  // as the spec's.
  bool subset_bound_ok(const Knobs& k) const {
    return !rb_ && !k.weight_flat_index && k.colsum == ColSum::normal && k.zero_cols.empty() &&
           k.dgamma_tile == 0 && c_.block == ref::Block::none && c_.direction == ref::Direction::backward;
  }

  // Gives the engine back the arrays of predictions no longer needed: the next runs fill them
  // instead of new zeroed ones (a case is ranked with some 40 runs of the same sizes).
  void recycle(Predictions&& p) const {
    for (auto& [name, v] : p.values)
      if (pool_.size() < kPoolSize && v.capacity() > 0) pool_.push_back(std::move(v));
    p = Predictions{};
  }

  // Whether k differs from the spec at most in how column sums are reduced.
  bool reduction_only(const Knobs& k) const { return spec_ && same_statistics(k, *spec_); }

  std::size_t off(std::int64_t row, std::int64_t j) const {
    return static_cast<std::size_t>(g_.row_base[row] + g_.col_delta[j]);
  }

 private:
  struct Columns {
    std::vector<LD> dw, db, drb, dw_a, db_a, drb_a, dwt;
    std::vector<std::uint8_t> dwt_unknown;
  };
  // h, residual_out's h and the statistics of the rows `rows` under the spec's statistics knobs.
  struct HCache {
    std::vector<std::int64_t> rows;
    std::vector<LD> h, hout;
  };
  struct StatsCache {
    std::vector<std::int64_t> rows;
    std::vector<RowStat> st;
  };
  mutable std::array<std::optional<HCache>, 2> h_cache_;
  mutable std::size_t next_h_slot_ = 0;
  mutable std::array<std::optional<StatsCache>, 2> stats_cache_;
  mutable std::size_t next_slot_ = 0;
  Knobs stats_spec_;  // spec(), set by the constructor

  // Whether a and b give the same h and residual_out's h.
  static bool same_h(const Knobs& a, const Knobs& b) {
    return a.res == b.res && a.pts.h == b.pts.h && a.h_round_x == b.h_round_x && a.res_out == b.res_out;
  }
  // Whether a and b give the same h, residual_out's h and row statistics (Engine::run's first
  // passes read exactly these knobs).
  static bool same_h_and_stats(const Knobs& a, const Knobs& b) {
    return same_h(a, b) && row_stats_knobs(a) == row_stats_knobs(b) && a.stat_dims == b.stat_dims;
  }
  mutable std::optional<Columns> cols_;
  std::optional<Knobs> spec_;
  // Arrays given back (recycle), reused by take.
  static constexpr std::size_t kPoolSize = 8;
  mutable std::vector<std::vector<double>> pool_;
  // An array of n elements for an output every element of which the run writes: from the pool
  // where one is there (its old values are all overwritten), else new.
  std::vector<double> take(std::size_t n) const {
    for (std::size_t i = pool_.size(); i-- > 0;) {
      if (pool_[i].size() < n) continue;
      std::vector<double> v = std::move(pool_[i]);
      pool_.erase(pool_.begin() + static_cast<std::ptrdiff_t>(i));
      v.resize(n);  // shrinking writes nothing
      return v;
    }
    return std::vector<double>(n);
  }

  // h and the row statistics of a layout's rows under one dialect's knobs: the caches' (shared
  // by every dialect that computes them as the spec does) or the dialect's own.
  struct Rows {
    bool var_below_zero = false;  // a one-pass variance of some row went below 0 (Predictions)
    Rows() = default;
    Rows(const Rows&) = delete;
    Rows& operator=(const Rows&) = delete;
    bool groups = false;  // statistics over other dims (stat_dims): per group of x's elements
    std::vector<LD> h_own, hout_own;
    std::vector<RowStat> st_own;
    std::vector<RowStat> st_saved;  // Knobs::saved_stats: the statistics the backward reads
    std::vector<std::int64_t> group_of;  // groups: the group of each element of x
    // h of the selected rows (compact: ri * n + j; groups: every element of x, by offset),
    // residual_out's h (compact), the statistics per selected row (groups: per group).
    const std::vector<LD>* h = nullptr;
    const std::vector<LD>* hout = nullptr;
    const std::vector<RowStat>* st = nullptr;
  };

  // h of element (row, j) under k; out_h: residual_out's h.
  LD h_at(const Knobs& k, std::int64_t row, std::int64_t j, LD* out_h) const {
    const std::int64_t n = g_.cols;
    const LD alpha = c_.alpha;
    const std::size_t i = off(row, j);
    const std::size_t pj = k.weight_flat_index ? i % static_cast<std::size_t>(n) : static_cast<std::size_t>(j);
    const LD x = x_->data[i], res = r_ ? r_->data[i] : LD(0), rb = rb_ ? rb_->data[pj] : LD(0);
    LD hv = 0;
    switch (k.res) {
      case ResMode::normal: hv = alpha * x + res + rb; break;
      case ResMode::not_added:
      case ResMode::after_norm: hv = alpha * x + rb; break;
      case ResMode::alpha_on_residual: hv = x + alpha * res + rb; break;
    }
    if (k.pts.h) hv = rnd(hv, *k.pts.h);
    if (k.h_round_x) hv = rnd(hv, c_.dtype_x);
    if (out_h) {
      LD ho = hv;
      if (k.res == ResMode::after_norm) ho = alpha * x + res + rb;
      if (k.res_out == ResOut::missing_bias) ho = alpha * x + res;
      if (k.res == ResMode::after_norm || k.res_out == ResOut::missing_bias) {
        if (k.pts.h) ho = rnd(ho, *k.pts.h);
        if (k.h_round_x) ho = rnd(ho, c_.dtype_x);
      }
      *out_h = ho;
    }
    return hv;
  }

  // Whether k forms h (and residual_out's h) as the spec does, so that the cached h serves it.
  bool shares_h(const Knobs& k) const {
    return !k.stat_dims.has_value() && same_h(k, stats_spec_) && !(rb_ && k.weight_flat_index);
  }

  // Stage h: h and residual_out's h of the layout's rows (every element where the statistics
  // are over other dims).
  void h_stage(const Knobs& k, const Layout& l, Rows& hr) const {
    const std::int64_t n = g_.cols;
    const auto RS = static_cast<std::int64_t>(l.rows.size());
    const std::size_t NS = static_cast<std::size_t>(RS * n);
    hr.groups = k.stat_dims.has_value();
    const bool groups = hr.groups;
    const bool h_shared = shares_h(k);
    const HCache* hc = nullptr;
    if (h_shared)
      for (const auto& slot : h_cache_)
        if (slot && slot->rows == l.rows) hc = &*slot;
    if (!hc) {
      hr.h_own.resize(groups ? x_->data.size() : NS);
      hr.hout_own.resize(r_ ? NS : 0);
      if (groups) {
        for (std::int64_t row = 0; row < g_.rows; ++row)
          for (std::int64_t j = 0; j < n; ++j) hr.h_own[off(row, j)] = h_at(k, row, j, nullptr);
      }
      for (std::int64_t ri = 0; ri < RS; ++ri)
        for (std::int64_t j = 0; j < n; ++j) {
          const std::size_t ci = static_cast<std::size_t>(ri * n + j);
          const LD hv = h_at(k, l.rows[ri], j, r_ ? &hr.hout_own[ci] : nullptr);
          if (!groups) hr.h_own[ci] = hv;
        }
      if (h_shared) {
        auto& slot = h_cache_[next_h_slot_];
        next_h_slot_ = (next_h_slot_ + 1) % h_cache_.size();
        slot = HCache{l.rows, std::move(hr.h_own), std::move(hr.hout_own)};
        hc = &*slot;
      }
    }
    hr.h = hc ? &hc->h : &hr.h_own;
    hr.hout = hc ? &hc->hout : &hr.hout_own;
  }

  // Stage statistics: per selected row, or per group of another set of dims (every group).
  void stats_stage(const Knobs& k, const Layout& l, Rows& hr) const {
    const std::int64_t n = g_.cols;
    const auto RS = static_cast<std::int64_t>(l.rows.size());
    const bool groups = hr.groups;
    const bool shared = shares_h(k) && same_h_and_stats(k, stats_spec_);
    const StatsCache* sc = nullptr;
    if (shared)
      for (const auto& slot : stats_cache_)
        if (slot && slot->rows == l.rows) sc = &*slot;
    if (!sc) {
      const std::vector<LD>& h = *hr.h;
      // Statistics: per selected row, or per group of another set of dims (all groups).
      if (groups) {
        ref::Case lc;
        lc.axes = *k.stat_dims;
        lc.inputs["x"] = ref::Tensor{x_->dtype, x_->shape, {}};
        const auto gs = ref::geometry_of(lc);
        hr.group_of.assign(x_->data.size(), 0);
        std::vector<LD> buf(static_cast<std::size_t>(gs.cols));
        for (std::int64_t gr = 0; gr < gs.rows; ++gr) {
          for (std::int64_t j = 0; j < gs.cols; ++j) {
            const auto i = static_cast<std::size_t>(gs.row_base[gr] + gs.col_delta[j]);
            hr.group_of[i] = gr;
            buf[j] = h[i];
          }
          hr.st_own.push_back(row_stats(buf.data(), gs.cols, k, c_.dtype_compute));
        }
      } else {
        hr.st_own.reserve(static_cast<std::size_t>(RS));
        for (std::int64_t ri = 0; ri < RS; ++ri)
          hr.st_own.push_back(row_stats(&h[static_cast<std::size_t>(ri * n)], n, k, c_.dtype_compute));
      }
      if (k.arith == StatArith::one_pass)
        for (const auto& st : hr.st_own) hr.var_below_zero = hr.var_below_zero || st.var < 0;
      if (shared) {
        auto& slot = stats_cache_[next_slot_];
        next_slot_ = (next_slot_ + 1) % stats_cache_.size();
        slot = StatsCache{l.rows, std::move(hr.st_own)};
        sc = &*slot;
      }
    }
    hr.st = sc ? &sc->st : &hr.st_own;
  }

  LD h_of(const Rows& hr, const Layout& l, std::int64_t ri, std::int64_t j) const {
    return hr.groups ? (*hr.h)[off(l.rows[ri], j)] : (*hr.h)[static_cast<std::size_t>(ri * g_.cols + j)];
  }
  const RowStat& stat_of(const Rows& hr, const Layout& l, std::int64_t ri, std::int64_t j) const {
    return hr.groups ? (*hr.st)[hr.group_of[off(l.rows[ri], j)]] : (*hr.st)[ri];
  }
  // A parameter's value at element (row, j) (by the flat index where k remaps the parameters).
  LD param(const Knobs& k, const ref::Tensor* t, std::int64_t row, std::int64_t j) const {
    if (!t) return 0;
    if (k.weight_flat_index) return t->data[off(row, j) % static_cast<std::size_t>(g_.cols)];
    return t->data[j];
  }
  // Rows from k.rows_limit on are not computed.
  static bool dead(const Knobs& k, std::int64_t row) { return k.rows_limit >= 0 && row >= k.rows_limit; }
  // Rows whose terms dweight and dbias leave out (k.colsum_rows: the column sums' grid limit).
  static bool unsummed(const Knobs& k, std::int64_t row) { return k.colsum_rows >= 0 && row >= k.colsum_rows; }

  // Stage forward: y (x-hat, the affine, the residual after the norm), residual_out, mean, rstd.
  Predictions run_forward(const Knobs& k, const Layout& l, const Rows& hr) const {
    const std::int64_t n = g_.cols;
    const auto RS = static_cast<std::int64_t>(l.rows.size());
    const std::size_t NS = static_cast<std::size_t>(RS * n);
    Predictions p;
    const bool ln = c_.op == ref::Op::layernorm;
    // Every element of y and residual_out is written below (a dead row's with k.unwritten).
    auto& y = p["y"];
    y = take(NS);
    std::vector<double>* rout = nullptr;
    if (r_) {
      rout = &p["residual_out"];
      *rout = take(NS);
    }
    // The scale and bias of each column (parameters indexed per element: per element).
    auto scale_bias = [&](std::int64_t row, std::int64_t j, LD& scale, LD& bv) {
      LD wv = param(k, w_, row, j);
      bv = b_ && !k.bias_missing ? param(k, b_, row, j) : LD(0);
      if (k.weight == WeightMode::swapped) std::swap(wv, bv);
      scale = k.weight == WeightMode::missing ? LD(1) : k.offset + wv;
      if (k.pts.scale && k.weight != WeightMode::missing) scale = rnd(scale, *k.pts.scale);
    };
    const bool per_col = w_ && !k.weight_flat_index;
    std::vector<LD> col_scale(per_col ? n : 0), col_bias(per_col ? n : 0);
    for (std::int64_t j = 0; per_col && j < n; ++j) scale_bias(0, j, col_scale[j], col_bias[j]);
    // The knobs the element loop reads, as locals (kept in registers, not reloaded from k).
    const bool centre = k.centre, bias_first = k.weight == WeightMode::bias_first,
               after_norm = k.res == ResMode::after_norm;
    const bool round_xhat = k.pts.xhat.has_value(), round_mul = k.pts.mul.has_value();
    const DType xhat_t = k.pts.xhat.value_or(DType::float64), mul_t = k.pts.mul.value_or(DType::float64);
    const ResOut res_out = k.res_out;
    for (std::int64_t ri = 0; ri < RS; ++ri) {
      const std::int64_t row = l.rows[ri];
      double* yr = &y[static_cast<std::size_t>(ri * n)];
      double* rr = rout ? &(*rout)[static_cast<std::size_t>(ri * n)] : nullptr;
      if (dead(k, row)) {
        for (std::int64_t j = 0; j < n; ++j) {
          yr[j] = k.unwritten;
          if (rr) rr[j] = k.unwritten;
        }
        continue;
      }
      // Statistics over other dims: per element; else the row's, and the row's h.
      const RowStat* row_stat = hr.groups ? nullptr : &(*hr.st)[static_cast<std::size_t>(ri)];
      const LD* hrow = hr.groups ? nullptr : &(*hr.h)[static_cast<std::size_t>(ri * n)];
      const LD* hout = rr && res_out != ResOut::holds_y && res_out != ResOut::holds_xhat
                           ? &(*hr.hout)[static_cast<std::size_t>(ri * n)]
                           : nullptr;
      for (std::int64_t j = 0; j < n; ++j) {
        const RowStat& s = row_stat ? *row_stat : stat_of(hr, l, ri, j);
        const LD hv = hrow ? hrow[j] : h_of(hr, l, ri, j);
        LD xh = (centre ? hv - s.mean : hv) * s.rstd;
        if (round_xhat) xh = rnd(xh, xhat_t);
        LD v = xh;
        if (w_) {
          LD scale, bv;
          if (per_col) {
            scale = col_scale[j];
            bv = col_bias[j];
          } else {
            scale_bias(row, j, scale, bv);
          }
          if (bias_first) {
            v = (xh + bv) * scale;
            if (round_mul) v = rnd(v, mul_t);
          } else {
            v = xh * scale;
            if (round_mul) v = rnd(v, mul_t);
            v += bv;
          }
        }
        if (after_norm) v += r_->data[off(row, j)];
        yr[j] = static_cast<double>(v);
        if (rr) {
          const LD o = res_out == ResOut::holds_y ? v : res_out == ResOut::holds_xhat ? xh : hout[j];
          rr[j] = static_cast<double>(o);
        }
      }
    }
    if (k.y_interval) {
      // y as the dialect's interval around the certified value: the prediction is the certified
      // value plus (this value - the spec's), so the engine's own value cancels.
      const OutputInterval& iv = *k.y_interval;
      auto& sl = p.slack["y"];
      sl.assign(NS, 0.0);
      p.grid["y"] = iv.grid;
      for (std::int64_t ri = 0; ri < RS; ++ri)
        for (std::int64_t j = 0; j < n; ++j) {
          const std::size_t ci = static_cast<std::size_t>(ri * n + j), i = off(l.rows[ri], j);
          y[ci] += iv.shift[i];
          sl[ci] = iv.half[i];
        }
    }
    auto& rs = p["rstd"];
    std::vector<double>* mean = ln ? &p["mean"] : nullptr;
    rs.assign(static_cast<std::size_t>(RS), 0.0);
    if (mean) mean->assign(static_cast<std::size_t>(RS), 0.0);
    for (std::int64_t ri = 0; ri < RS; ++ri) {
      if (dead(k, l.rows[ri])) {
        rs[ri] = k.unwritten;
        if (mean) (*mean)[ri] = k.unwritten;
        continue;
      }
      const RowStat& s = stat_of(hr, l, ri, 0);
      const LD out = k.rstd_out == RstdOut::rstd      ? (k.rstd_out_unrounded ? s.rstd_unrounded : s.rstd)
                     : k.rstd_out == RstdOut::std_dev ? LD(1) / s.rstd
                                                      : s.var;
      rs[ri] = k.saved_stats ? rnd(static_cast<double>(out), *k.saved_stats) : static_cast<double>(out);
      if (mean) (*mean)[ri] = k.saved_stats ? rnd(static_cast<double>(s.mean), *k.saved_stats) : static_cast<double>(s.mean);
    }
    return p;
  }

  // g = dy * scale: the scale of column j at (row, j) (per element where the parameters are
  // remapped).
  LD scale_at(const Knobs& k, std::int64_t row, std::int64_t j) const {
    if (!w_ || k.weight == WeightMode::missing) return 1;
    return k.offset + (k.weight == WeightMode::swapped && b_ ? param(k, b_, row, j) : param(k, w_, row, j));
  }

  // Statistics over other dims (stat_dims): the dx terms mean(g) and mean(g x-hat) are means
  // over the same groups as the statistics (a kernel normalizing those dims differentiates its
  // own function), so they need every element: per group, from every row.
  void group_terms(const Knobs& k, const Rows& hr, std::vector<LD>& gbar, std::vector<LD>& m2) const {
    const std::int64_t n = g_.cols;
    const std::vector<LD>& h = *hr.h;
    const std::vector<RowStat>& st = *hr.st;
    const auto& group_of = hr.group_of;
    const std::size_t ng = st.size();
    std::vector<LD> gs(ng, 0), gxs(ng, 0), cnt(ng, 0);
    for (std::int64_t row = 0; row < g_.rows; ++row)
      for (std::int64_t j = 0; j < n; ++j) {
        const std::size_t i = off(row, j);
        const auto gr = static_cast<std::size_t>(group_of[i]);
        const RowStat& s = st[gr];
        const LD xv = (k.centre ? h[i] - s.mean : h[i]) * s.rstd;
        const LD scale = scale_at(k, row, j);
        const LD gv = static_cast<LD>(dy_->data[i]) * scale;
        gs[gr] += gv;
        gxs[gr] += gv * xv;
        cnt[gr] += 1;
      }
    gbar.resize(ng);
    m2.resize(ng);
    for (std::size_t gr = 0; gr < ng; ++gr) {
      gbar[gr] = cnt[gr] > 0 ? gs[gr] / cnt[gr] : LD(0);
      m2[gr] = cnt[gr] > 0 ? gxs[gr] / cnt[gr] : LD(0);
    }
  }

  // Stage backward: dh = rstd (g - mean(g) - xhat mean(g xhat)), g = dy scale; dx = alpha dh,
  // dresidual = dh, and the column sums' terms (column_sums_stage emits them).
  Predictions run_backward(const Knobs& k, const Layout& l, const Rows& hr, bool columns_only,
                           const std::vector<std::int64_t>* only_cols) const {
    const std::int64_t n = g_.cols;
    const auto RS = static_cast<std::int64_t>(l.rows.size());
    const std::size_t NS = static_cast<std::size_t>(RS * n);
    const bool groups = hr.groups;
    const auto& group_of = hr.group_of;
    const LD alpha = c_.alpha;
    Predictions p;
    std::vector<double> no_dx;
    auto& dx = columns_only ? no_dx : p["dx"];
    // Every element of dx and dresidual is written below (a dead row's with k.unwritten).
    if (!columns_only) dx = take(NS);
    std::vector<double>* dres = r_ && !columns_only ? &p["dresidual"] : nullptr;
    if (dres) *dres = take(NS);
    // On a sample, column sums are predicted only from the spec's (below): not accumulated.
    const bool sums = l.all_rows;
    const std::size_t nw = sums && w_ ? static_cast<std::size_t>(n) : 0, nb = sums && b_ ? static_cast<std::size_t>(n) : 0,
                      nrb = sums && rb_ ? static_cast<std::size_t>(n) : 0;
    // The column sums, and their sums of |terms| (bf16_interval's bound).
    Columns cs;
    cs.dw.assign(nw, 0), cs.db.assign(nb, 0), cs.drb.assign(nrb, 0);
    cs.dw_a.assign(nw, 0), cs.db_a.assign(nb, 0), cs.drb_a.assign(nrb, 0);
    // dweight with the wrong lane's parameters (dgamma_tile; computed too when the spec's column
    // sums are cached for a sample), and the columns whose lane falls beyond the last column
    // (read out of bounds: no prediction).
    const bool priming = l.all_rows && !cols_ && reduction_only(k) && !columns_only;
    const std::int64_t tile =
        w_ && sums && (k.dgamma_tile > 0 || priming) ? (k.dgamma_tile > 0 ? k.dgamma_tile : kDgammaTile) : 0;
    cs.dwt.assign(static_cast<std::size_t>(tile ? n : 0), 0);
    cs.dwt_unknown.assign(static_cast<std::size_t>(tile ? n : 0), 0);
    auto accumulate = [&](std::vector<LD>& acc, std::vector<LD>& abs_sum, std::int64_t j, LD term) {
      acc[j] += term;
      abs_sum[j] += std::fabs(term);
    };
    // Statistics over other dims: the dx terms mean(g) and mean(g x-hat) per group (group_terms).
    std::vector<LD> grp_gbar, grp_m2;
    if (groups && (!columns_only || (rb_ && sums))) group_terms(k, hr, grp_gbar, grp_m2);
    // Column of parameter p that element (row, j) reads and its gradient goes to.
    auto pcol = [&](std::int64_t row, std::int64_t j) -> std::int64_t {
      return k.weight_flat_index ? static_cast<std::int64_t>(off(row, j) % static_cast<std::size_t>(n)) : j;
    };
    const bool bwd_per_col = !k.weight_flat_index;
    std::vector<LD> bwd_scale(bwd_per_col ? n : 0);
    for (std::int64_t j = 0; bwd_per_col && j < n; ++j) bwd_scale[j] = scale_at(k, 0, j);
    const bool subset = only_cols && columns_only && subset_bound_ok(k) && sums && !tile;
    const std::int64_t nj = subset ? static_cast<std::int64_t>(only_cols->size()) : n;
    std::vector<LD> g(n), xh(n);
    // The knobs the element loops read, as locals.
    const bool centre = k.centre, sub_mean = k.centre && k.dx != DxMode::no_mean,
               project = k.dx != DxMode::no_projection;
    for (std::int64_t ri = 0; ri < RS; ++ri) {
      const std::int64_t row = l.rows[ri];
      if (subset) {
        // The chosen columns' terms of dweight and dbias only.
        if (dead(k, row) || unsummed(k, row)) continue;
        for (std::int64_t jj = 0; jj < nj; ++jj) {
          const std::int64_t j = (*only_cols)[static_cast<std::size_t>(jj)];
          const RowStat& s = stat_of(hr, l, ri, j);
          const LD dyv = dy_->data[off(row, j)];
          const LD hv = h_of(hr, l, ri, j);
          if (w_) accumulate(cs.dw, cs.dw_a, j, dyv * ((k.centre ? hv - s.mean : hv) * s.rstd));
          if (b_) accumulate(cs.db, cs.db_a, j, dyv);
        }
        continue;
      }
      if (dead(k, row)) {
        for (std::int64_t j = 0; columns_only ? false : j < n; ++j) {
          dx[static_cast<std::size_t>(ri * n + j)] = k.unwritten;
          if (dres) (*dres)[static_cast<std::size_t>(ri * n + j)] = k.unwritten;
        }
        continue;
      }
      LD gsum = 0, gx = 0;
      // The row's statistics and h (statistics over other dims: per element).
      const RowStat* row_stat = groups ? nullptr : &(*hr.st)[static_cast<std::size_t>(ri)];
      const LD* hrow = groups ? nullptr : &(*hr.h)[static_cast<std::size_t>(ri * n)];
      const bool sum_dw = w_ && sums && !unsummed(k, row), sum_db = b_ && sums && !unsummed(k, row);
      for (std::int64_t j = 0; j < n; ++j) {
        const RowStat& s = row_stat ? *row_stat : stat_of(hr, l, ri, j);
        const LD dyv = dy_->data[off(row, j)];
        const LD hv = hrow ? hrow[j] : h_of(hr, l, ri, j);
        xh[j] = (centre ? hv - s.mean : hv) * s.rstd;
        const LD scale = bwd_per_col ? bwd_scale[j] : scale_at(k, row, j);
        g[j] = dyv * scale;
        gsum += g[j];
        gx += g[j] * xh[j];
        if (sum_dw) accumulate(cs.dw, cs.dw_a, pcol(row, j), dyv * xh[j]);
        if (tile) {
          const std::int64_t pos = (j / tile) * tile + row % tile;
          if (pos >= n) {
            cs.dwt_unknown[j] = 1;
          } else {
            LD yv = xh[j] * scale_at(k, row, j);
            if (b_) yv += param(k, b_, row, j) - param(k, b_, row, pos);
            cs.dwt[j] += dyv * (yv / scale_at(k, row, pos));
          }
        }
        if (sum_db) accumulate(cs.db, cs.db_a, pcol(row, j), dyv);
      }
      const LD gbar = gsum / static_cast<LD>(n), m2 = gx / static_cast<LD>(n);
      if (columns_only && !(rb_ && sums)) continue;
      double* dxr = columns_only ? nullptr : &dx[static_cast<std::size_t>(ri * n)];
      double* dresr = dres ? &(*dres)[static_cast<std::size_t>(ri * n)] : nullptr;
      const bool sum_drb = rb_ && sums;
      for (std::int64_t j = 0; j < n; ++j) {
        LD K = g[j];
        const LD gb = groups ? grp_gbar[static_cast<std::size_t>(group_of[off(row, j)])] : gbar;
        const LD mm = groups ? grp_m2[static_cast<std::size_t>(group_of[off(row, j)])] : m2;
        if (sub_mean) K -= gb;
        if (project) K -= xh[j] * mm;
        const LD dh = (row_stat ? *row_stat : stat_of(hr, l, ri, j)).rstd * K;
        if (dxr) dxr[j] = static_cast<double>(alpha * dh);
        if (dresr) dresr[j] = static_cast<double>(dh);
        if (sum_drb) accumulate(cs.drb, cs.drb_a, pcol(row, j), dh);
      }
    }
    column_sums_stage(k, l, cs, p, subset, only_cols, priming);
    return p;
  }

  // One column sum as a prediction: columns in k.zero_cols left at 0; under bf16_interval, the
  // slack of any order of RS + 1 bfloat16 additions.
  void emit_sum(const Knobs& k, std::int64_t RS, Predictions& p, const char* name, const std::vector<LD>& acc,
                const std::vector<LD>& abs_sum) const {
    const std::int64_t n = g_.cols;
    auto& o = p[name];
    o.assign(static_cast<std::size_t>(n), 0.0);
    const auto zc = k.zero_cols.find(name);
    for (std::int64_t j = 0; j < n; ++j) {
      double v = static_cast<double>(acc[j]);
      if (zc != k.zero_cols.end() && zc->second[j]) v = 0;
      o[j] = v;
    }
    if (k.colsum == ColSum::bf16_interval) {
      // Any order of R additions in bfloat16: |error| <= gamma(R) sum |terms| (Higham 4.2),
      // plus the rounding of each term to bfloat16.
      const LD u = ref::unit_roundoff(DType::bfloat16), R = static_cast<LD>(RS) + 1;
      auto& sl = p.slack[name];
      sl.resize(static_cast<std::size_t>(n));
      if (R * u >= 1) {
        // gamma(R) bounds the error only while R u < 1 (256 rows in bfloat16); beyond, a sum in
        // some order can be any value up to the sum of |terms|: no prediction (unscored, so the
        // dialect cannot claim to explain these outputs).
        std::fill(sl.begin(), sl.end(), static_cast<double>(kInf));
        return;
      }
      for (std::int64_t j = 0; j < n; ++j)
        sl[j] = static_cast<double>(R * u / (1 - R * u) * abs_sum[j] * (1 + u));
      p.grid[name] = DType::bfloat16;
    }
  }

  // Stage column sums: dweight, dbias, dresidual_bias from the accumulated terms (on a sample,
  // from the spec's sums over every row, for dialects of the reduction only); the spec's sums
  // kept for those dialects (priming).
  void column_sums_stage(const Knobs& k, const Layout& l, Columns& cs, Predictions& p, bool subset,
                         const std::vector<std::int64_t>* only_cols, bool priming) const {
    const std::int64_t n = g_.cols;
    // The column sums are over every row of the case: computed on all of them, or, on a sample,
    // the spec's sums over every row (cols_); bf16_interval's bound is that of g_.rows additions.
    const std::int64_t RS = g_.rows;
    if (!l.all_rows) {
      // Column sums need every row: on a sample they are predicted only for dialects that change
      // nothing but the reduction (from the spec's full sums), and left out otherwise (the
      // sample score is then over dx alone, still a lower bound of the full score).
      if (!cols_ || !reduction_only(k)) return;
      cs = *cols_;
    }
    if (k.dgamma_tile > 0 && w_) {
      emit_sum(k, RS, p, "dweight", cs.dwt, cs.dw_a);
      auto& sl = p.slack["dweight"];
      sl.assign(static_cast<std::size_t>(n), 0.0);
      for (std::int64_t j = 0; j < n; ++j)
        if (cs.dwt_unknown[j]) sl[j] = kInf;
      if (b_) emit_sum(k, RS, p, "dbias", cs.db, cs.db_a);
      if (rb_) emit_sum(k, RS, p, "dresidual_bias", cs.drb, cs.drb_a);
      return;
    }
    if (w_) emit_sum(k, RS, p, "dweight", cs.dw, cs.dw_a);
    if (b_) emit_sum(k, RS, p, "dbias", cs.db, cs.db_a);
    if (rb_) emit_sum(k, RS, p, "dresidual_bias", cs.drb, cs.drb_a);
    if (subset) {
      std::vector<double> none(static_cast<std::size_t>(n), kInf);
      for (auto j : *only_cols) none[static_cast<std::size_t>(j)] = 0;
      if (w_) p.slack["dweight"] = none;
      if (b_) p.slack["dbias"] = none;
    }
    if (priming) cols_ = cs;
  }

 public:
  // Whether a and b give the same values for every output of this case (then a dialect need not
  // be evaluated): the knobs that the case's direction and kind read are equal.
  bool same_semantics(const Knobs& a, const Knobs& b) const {
    if (c_.block != ref::Block::none)  // what run_block reads
      return row_stats_knobs(a) == row_stats_knobs(b) && a.offset == b.offset && a.block == b.block;
    if (c_.direction == ref::Direction::backward) {
      // Backward reads neither the bias (dbias is sum(dy) either way) nor where it is added.
      auto bwd = [](Knobs k) {
        if (k.weight == WeightMode::bias_first) k.weight = WeightMode::normal;
        k.bias_missing = false;
        return k;
      };
      return same_statistics(bwd(a), bwd(b)) && a.colsum == b.colsum && a.zero_cols == b.zero_cols &&
             a.dgamma_tile == b.dgamma_tile;
    }
    if (!same_statistics(a, b)) return false;
    return a.pts.xhat == b.pts.xhat && a.pts.scale == b.pts.scale && a.pts.mul == b.pts.mul &&
           a.res_out == b.res_out && a.rstd_out == b.rstd_out &&
           a.rstd_out_unrounded == b.rstd_out_unrounded && a.unwritten == b.unwritten &&
           a.y_interval == b.y_interval;
  }

 private:
  static bool same_statistics(const Knobs& k, const Knobs& s) {
    return row_stats_knobs(k) == row_stats_knobs(s) && k.stat_dims == s.stat_dims && k.weight == s.weight &&
           k.bias_missing == s.bias_missing && k.offset == s.offset &&
           k.weight_flat_index == s.weight_flat_index && k.pts.h == s.pts.h && k.res == s.res &&
           k.h_round_x == s.h_round_x && k.dx == s.dx && k.rows_limit == s.rows_limit && k.block == s.block &&
           k.saved_stats == s.saved_stats && k.colsum_rows == s.colsum_rows;
  }

  // Residual blocks (reference/README.md, "Residual blocks"): L layers over rows of D, FFN
  // F(v) = W2 act(W1 v + b1) + b2, each layer's output but the last rounded to dtype_x. Backward
  // is the gradient of the dialect's forward function (the intermediate roundings acting as the
  // identity, as in the reference and autograd), each norm's backward the usual
  // rstd (g - mean(g) - x-hat mean(g x-hat)) with the dialect's statistics.
  // Defined in blocks.cpp (instantiated there for double).
  Predictions run_block(const Knobs& k, const Layout& lay) const;

  const ref::Case& c_;
  ref::Geometry g_;
  const ref::Tensor *x_ = nullptr, *w_ = nullptr, *b_ = nullptr, *r_ = nullptr, *rb_ = nullptr,
                    *dy_ = nullptr;
};

}  // namespace normcheck::conf::diag
