// Ranking the panel on one case (../../DIAGNOSIS.md, "Ranking: a screen, then branch and
// bound"): the screen on a sample of rows, every dialect's variants scored, the walk of the
// ranking that scores entries on every row until the best are exact, the merging of dialects
// the outputs cannot tell apart; and the library's entry points (diagnosis.hpp).
//
// Accuracy: the engine is not certified. Its value for the spec itself is within a few units of
// long double (2^-64) of the exact value on ordinary rows; to remove even that, a dialect's
// prediction is taken as expected_f64 + (dialect - engine's spec): exactly the certified value
// where the fault does not change an element, and the fault's effect added to it elsewhere.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "normcheck/judge/checker_quant.hpp"
#include "engine.hpp"
#include "normcheck/judge/diagnosis.hpp"
#include "panel.hpp"
#include "scoring.hpp"

namespace normcheck::conf {

using namespace diag;

namespace {

std::string short_number(double v) {
  if (std::isinf(v)) return "inf";
  if (std::isnan(v)) return "nan";
  return fmt::format("{:.3g}", v);
}

}  // namespace

const std::vector<DialectInfo>& dialect_panel() {
  static const std::vector<DialectInfo> v = [] {
    std::vector<DialectInfo> out;
    for (const auto& d : panel()) out.push_back(d.info);
    for (const auto& d : quant_dialect_panel()) out.push_back(d);  // class H (diagnosis/quant.cpp)
    return out;
  }();
  return v;
}

double spec_score(const fix::FixtureCase& fc, const Outputs& got,
                  const std::map<std::string, OutputAllowance>& allow) {
  return score_of(fc, got, allow, nullptr, nullptr, nullptr).score;
}

std::vector<Diagnosis> diagnose(const fix::FixtureCase& fc, const Outputs& got, const DiagnoseOptions& opt) {
  return diagnose(fc, got, derive_allowances(fc.c), opt);
}

namespace {

// Gives a variant's predictions back to the engine (Engine::recycle) when they go out of scope
// (unless moved into an entry first).
struct Recycled {
  const Engine<double>& engine;
  Predictions& p;
  Recycled(const Engine<double>& e, Predictions& pr) : engine(e), p(pr) {}
  Recycled(const Recycled&) = delete;
  Recycled& operator=(const Recycled&) = delete;
  ~Recycled() { engine.recycle(std::move(p)); }
};

// An entry of the ranking: one variant of one dialect with its score.
struct Entry {
  Diagnosis d;
  Knobs k;
  std::size_t panel_index = 0;
  std::optional<std::uint64_t> hash;  // of the predictions on `lay`; computed where scores tie
  bool full = true;   // scored on every row (else a lower bound from the sample)
  bool gone = false;  // scored on every row and indistinguishable from the spec there
  Score score;
  std::optional<Predictions> pred;  // on every row, where entries are compared
  std::optional<Predictions> spred;  // on the sample (sampled cases)
  bool columns_bound = false;  // backward: the score includes the column sums on every row
  bool subset_bound = false;   // backward: it includes those of the worst_spec_columns
};

// The groups of the best entries in ranking order: each group's first entry (its best score)
// and its members.
struct Group {
  std::size_t first;
  std::vector<std::size_t> members;
};

double key(double v) { return std::isnan(v) ? kInf : v; }

// The panel ranked on one case, in stages: screen (the rows scored first), score_panel (every
// variant of every dialect on them), then walk / score_blocker until the best entries are
// exact, and report. The engine computes in double: the model's own rounding errors are those
// of a correct binary64 kernel, within the allowance even of a float64 case, and mostly cancel
// in the prediction (certified value + dialect - model's spec), where dialect and spec share
// every operation but the fault's. (Measured on the ci tier, long double ranked no better and
// took 1.2x the time.)
class Ranking {
 public:
  Ranking(const fix::FixtureCase& fc, const Outputs& got, const std::map<std::string, OutputAllowance>& allow,
          const DiagnoseOptions& opt)
      : fc_(fc), c_(fc.c), got_(got), allow_(allow), opt_(opt) {}

  std::vector<Diagnosis> run() {
    try {
      engine_.emplace(c_);
    } catch (const std::exception&) {
      return {};
    }
    spec_ = engine_->spec();
    g_ = &engine_->geometry();
    screen();
    score_panel();
    // Dialects the outputs cannot tell apart (every element within kSameWithin allowance or
    // rounding to the same value) are one diagnosis: the one earlier in the panel names it, the
    // others are listed in same_as. Compared on every row, and remembered.
    if (sampled_ && !full_spec_) full_spec_ = engine_->run(spec_, all_);
    cmp_spec_ = sampled_ ? &*full_spec_ : &spec_pred_;
    for (;;) {
      const std::size_t blocker = walk();
      if (blocker == entries_.size()) break;
      score_blocker(entries_[blocker]);
    }
    return report();
  }

 private:
  // Large forward cases are ranked on a sample of rows (the rows where the candidate departs
  // most from the spec, and rows spread over the case); the best are then scored on every row.
  void screen() {
    const ref::Geometry& g = *g_;
    all_ = engine_->layout(nullptr);
    const std::size_t numel = input(c_, "x")->data.size();
    // The sample: the rows where the outputs depart most from the spec (at most sample_rows, and
    // at most an eighth of the rows, at least one) and as many spread over the case when it has
    // 16 rows or more.
    const auto R = static_cast<std::size_t>(g.rows);
    const std::size_t worst = std::min(opt_.sample_rows, std::max<std::size_t>(1, R / 8));
    const std::size_t spread = R >= 16 ? worst : 0;
    // Backward: the column sums (and a block's parameter gradients), where the reduction faults
    // show, are predicted on a sample only for dialects that change nothing else (scored exactly,
    // every row); for the others the sample score (dx of the sampled rows) is still a lower bound.
    // Blocks are screened on a sample at any size: every dialect is a run of the FFNs.
    if ((numel > opt_.sample_above || c_.block != ref::Block::none) && worst + spread < R) {
      const auto ratios = scorer_.spec_row_ratios(g, all_, &s_spec_, &s_spec_columns_);
      if (c_.direction == ref::Direction::backward) full_spec_ = engine_->prime_columns(spec_, all_);
      std::vector<std::int64_t> order(R);
      for (std::size_t r = 0; r < R; ++r) order[r] = static_cast<std::int64_t>(r);
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(worst), order.end(),
                        [&](std::int64_t x, std::int64_t y) { return ratios[x] > ratios[y]; });
      std::vector<std::int64_t> rows(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(worst));
      for (std::size_t i = 0; i < spread; ++i)
        rows.push_back(static_cast<std::int64_t>(i * (R - 1) / std::max<std::size_t>(1, spread - 1)));
      std::sort(rows.begin(), rows.end());
      rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
      sample_ = engine_->layout(&rows);
    } else {
      s_spec_ = scorer_.score(nullptr, nullptr, nullptr).score;
    }
    // Fits (eps_other_value) look at the screened rows: the rows where the candidate departs most
    // from the spec, where a wrong eps shows (on a sample, a fit from every row would cost more
    // than the rest of the screen).
    lay_ = sample_.rows.empty() ? &all_ : &sample_;
    sampled_ = !lay_->all_rows;
    spec_pred_ = engine_->run(spec_, *lay_);
  }

  // Whether the outputs tell a dialect from the spec: its predictions differ from the spec's by
  // more than the outputs resolve somewhere (Score::distinct), or it explains the outputs (score
  // <= 1) where the spec does not. The latter is a fault whose effect is below half an allowance
  // everywhere (N - 1 for N = 768 moves a bfloat16 dx by a fraction of its ulp) that still
  // brings the elements the spec fails on within their allowance: the spec is rejected and the
  // dialect accepted by the same outputs.
  // A dialect that makes no prediction for some elements (there the spec may be the one failing)
  // is not told apart this way.
  bool explains_alone(const Score& sc) const {
    return !(std::isnan(sc.score) || sc.score > 1) && s_spec_ > 1 && sc.unpredicted == 0;
  }
  bool told_apart(const Score& sc) const { return sc.distinct || explains_alone(sc); }

  Diagnosis name_entry(const Dialect& d, const Variant& var) const {
    Diagnosis r;
    r.dialect = d.info.name;
    r.fault_class = d.info.fault_class;
    r.title = d.info.title;
    r.parameters = var.parameters;
    if (!var.title.empty()) r.title = var.title;  // a variant named by what it changes
    return r;
  }

  // Every variant of every dialect of the panel, scored on the screened rows.
  void score_panel() {
    const Ctx ctx{fc_, c_, got_, spec_, *g_, lay_->rows};
    const auto& dialects = panel();
    for (std::size_t di = 0; di < dialects.size(); ++di) {
      std::vector<Variant> vars;
      try {
        vars = dialects[di].variants(ctx);
      } catch (const std::exception&) {
        continue;
      }
      score_dialect(di, vars);
    }
  }

  // The variants of dialect di: on a sample each is an entry of its own; on every row the best
  // one is, merged with an entry of identical predictions if there is one.
  void score_dialect(std::size_t di, const std::vector<Variant>& vars) {
    const Dialect& d = panel()[di];
    std::optional<Entry> best;
    std::vector<const Knobs*> run_already;  // this dialect's variants evaluated so far
    // One-pass variants (panel.cpp, one_pass_variants): the sum orders whose variance stayed >= 0
    // on every row run; the clamped twin of such an order predicts the same values.
    std::set<std::int64_t> never_below_zero;
    for (const auto& var : vars) {
      if (engine_->same_semantics(var.k, spec_)) continue;  // the spec itself on this case
      if (var.k.clamp_var && never_below_zero.count(var.k.sum_lanes)) continue;
      // A variant that reads like an earlier one on this case (rstd_rounded_*'s two rstd outputs
      // in backward, contracts that differ only in forward rounding points) predicts the same
      // values: it scores the same and cannot be better.
      if (std::any_of(run_already.begin(), run_already.end(), [&](const Knobs* k) {
            return engine_->same_semantics(var.k, *k) && var.k.unwritten == k->unwritten;
          }))
        continue;
      run_already.push_back(&var.k);
      Predictions p;
      const Recycled recycled{*engine_, p};  // p's arrays go back to the engine when this variant is done
      try {
        p = engine_->run(var.k, *lay_);
      } catch (const std::exception&) {
        continue;
      }
      if (var.k.arith == StatArith::one_pass && !var.k.clamp_var && !p.var_below_zero)
        never_below_zero.insert(var.k.sum_lanes);
      std::optional<std::uint64_t> h;
      Score sc;
      bool full = !sampled_;
      std::optional<Predictions> spred;
      if (sampled_ && full_spec_ && engine_->reduction_only(var.k)) {
        spred = p;
        // Backward, a dialect of the column reductions only: its dx is the spec's on every row
        // and its column sums are over every row already, so it is scored exactly on every row.
        Predictions pf = *full_spec_;
        for (const auto& [name, v] : p.values)
          if (name == "dweight" || name == "dbias" || name == "dresidual_bias") pf.values[name] = v;
        pf.slack = p.slack;
        pf.grid = p.grid;
        p = std::move(pf);
        sc = scorer_.score(&all_, &p, &*full_spec_, &same_all_);
        full = true;
      } else {
        // On a sample, whether the dialect differs from the spec is decided on every row. On
        // every row a variant is kept only if it beats this dialect's best so far: its scoring
        // stops once it cannot.
        const double stop_at = !sampled_ && best ? best->score.score : std::numeric_limits<double>::quiet_NaN();
        sc = scorer_.score(lay_, &p, &spec_pred_, &same_lay_, {}, !sampled_, stop_at);
        if (sc.partial) continue;  // not below best->score.score: dropped below as well
      }
      // A dialect no output of this case can tell from the spec (the spec itself among them) is
      // not a diagnosis, unless it explains the outputs where the spec does not (told_apart).
      // On a sample that is decided on every row, if it comes to that.
      if (full && !told_apart(sc)) continue;
      if (sampled_) {
        // Every variant is a candidate of its own: the best on the sample need not be the best.
        if (!full) spred = std::move(p);
        entries_.push_back(Entry{name_entry(d, var), var.k, di, std::nullopt, full, false, sc,
                                 full ? std::optional<Predictions>(std::move(p)) : std::nullopt,
                                 std::move(spred)});
        continue;
      }
      if (best && !(sc.score < best->score.score)) continue;
      // Hashes of the predictions are taken only where they are needed: two dialects whose
      // predictions are identical score identically.
      const bool tie = std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) {
        return same_score(e.score, sc);
      });
      if (tie) h = hash_of(p);
      best = Entry{name_entry(d, var), var.k, di, h, true, false, sc, std::nullopt, std::nullopt};
    }
    if (!best) return;
    auto dup = entries_.end();
    if (best->hash) {
      for (auto it = entries_.begin(); it != entries_.end() && dup == entries_.end(); ++it) {
        if (!same_score(it->score, best->score)) continue;
        if (!it->hash) it->hash = hash_of(engine_->run(it->k, *lay_));
        if (*it->hash == *best->hash) dup = it;
      }
    }
    if (dup != entries_.end()) {
      dup->d.same_as.push_back(best->d.dialect);
      return;
    }
    entries_.push_back(std::move(*best));
  }

  bool by_score(const Entry& a, const Entry& b) const {
    const double sa = key(a.score.score), sb = key(b.score.score);
    return sa != sb ? sa < sb : a.score.beyond < b.score.beyond;
  }

  // Whether entries a and b cannot be told apart by the outputs on every row (remembered).
  bool same_group(std::size_t a, std::size_t b) {
    const auto memo_key = std::minmax(a, b);
    const auto it = same_memo_.find(memo_key);
    if (it != same_memo_.end()) return it->second;
    Entry& ea = entries_[a];
    Entry& eb = entries_[b];
    if (!ea.pred) ea.pred = engine_->run(ea.k, all_);
    if (!eb.pred) eb.pred = engine_->run(eb.k, all_);
    const bool same = !distinguishable(fc_, got_, allow_, all_, &*ea.pred, &*eb.pred, *cmp_spec_);
    same_memo_[memo_key] = same;
    return same;
  }
  // Whether the sample tells entries a and b apart (remembered).
  bool apart_on_sample(std::size_t a, std::size_t b) {
    const auto memo_key = std::minmax(a, b);
    const auto it = apart_memo_.find(memo_key);
    if (it != apart_memo_.end()) return it->second;
    const Entry& ea = entries_[a];
    const Entry& eb = entries_[b];
    const bool apart =
        ea.spred && eb.spred && distinguishable(fc_, got_, allow_, *lay_, &*ea.spred, &*eb.spred, spec_pred_);
    apart_memo_[memo_key] = apart;
    return apart;
  }

  // Walks the ranking until `keep` groups are formed or an entry scored on a sample only comes
  // first: returns that entry (the blocker; entries_.size() if none). Its score is a lower
  // bound, so every entry after it is worse than it may be, and it must be scored on every row
  // before the walk can pass it.
  std::size_t walk() {
    std::vector<std::size_t> order(entries_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return by_score(entries_[a], entries_[b]); });
    groups_.clear();
    std::set<std::string> seen;  // dialects in a group already (by their best variant)
    for (std::size_t idx : order) {
      const Entry& e = entries_[idx];
      if (e.gone || seen.count(e.d.dialect)) continue;
      if (!e.full) {
        // Also scored in full: an entry that may join the best group (within one allowance of
        // its score; see the merge below), so that the best diagnosis names all its aliases.
        // Two entries told apart on the sample are told apart on every row: such an entry cannot.
        // Otherwise it is run on every row and compared with the best first (most are told
        // apart at once); only one that cannot be told apart is scored there.
        const bool may_join_best =
            !groups_.empty() && key(e.score.score) <= key(entries_[groups_.front().first].score.score) + 1.0 &&
            !apart_on_sample(groups_.front().first, idx) && same_group(groups_.front().first, idx);
        if (groups_.size() < opt_.exact_top || may_join_best) return idx;
        // Below the exact top: listed with its lower bound, not merged.
        seen.insert(e.d.dialect);
        groups_.push_back(Group{idx, {idx}});
        if (groups_.size() >= opt_.keep) break;
        continue;
      }
      seen.insert(e.d.dialect);
      bool merged = false;
      for (auto& gr : groups_) {
        if (!entries_[gr.first].full) continue;
        const double sg = key(entries_[gr.first].score.score), se = key(e.score.score);
        if (std::fabs(sg - se) > 1.0 && !(std::isinf(sg) && std::isinf(se))) continue;
        // One that explains the outputs and one that does not are told apart by them.
        if ((sg <= 1) != (se <= 1)) continue;
        if (!same_group(gr.first, idx)) continue;
        gr.members.push_back(idx);
        merged = true;
        break;
      }
      if (!merged) groups_.push_back(Group{idx, {idx}});
      if (groups_.size() >= opt_.keep) break;
    }
    return entries_.size();
  }

  // Scores the blocker on every row. Backward, where the spec's column sums fail, its column
  // sums first (a run without dx): the sample score with them is a tighter bound, and often
  // enough to pass it by (where they pass, a dialect's seldom fail by more).
  void score_blocker(Entry& e) {
    if (c_.direction == ref::Direction::backward && c_.block == ref::Block::none && !e.columns_bound &&
        !e.pred && s_spec_columns_ > 1) {
      // First the columns where the spec's sums fail most (a fraction of the work: the row
      // statistics and those columns' terms), then every column.
      if (!bound_cols_) bound_cols_ = worst_spec_columns(fc_, got_, allow_, g_->cols, kBoundColumns);
      if (!e.subset_bound && !bound_cols_->empty() && engine_->subset_bound_ok(e.k)) {
        e.subset_bound = true;
        const Predictions pc = engine_->run(e.k, all_, true, &*bound_cols_);
        const Score cs = scorer_.score(&all_, &pc, &*full_spec_);
        if (key(cs.score) > key(e.score.score)) {
          e.score.score = cs.score;
          e.score.worst_output = cs.worst_output;
          e.score.worst_index = cs.worst_index;
        }
        return;
      }
      e.columns_bound = true;
      const Predictions pc = engine_->run(e.k, all_, true);
      const Score cs = scorer_.score(&all_, &pc, &*full_spec_);
      e.score.beyond += cs.beyond;
      if (key(cs.score) > key(e.score.score)) {
        e.score.score = cs.score;
        e.score.worst_output = cs.worst_output;
        e.score.worst_index = cs.worst_index;
      }
      return;
    }
    if (!e.pred) e.pred = engine_->run(e.k, all_);
    e.score = scorer_.score(&all_, &*e.pred, &*full_spec_, &same_all_);
    e.full = true;
    if (!told_apart(e.score)) {
      e.gone = true;
      engine_->recycle(std::move(*e.pred));
      e.pred.reset();
    }
  }

  // The groups as diagnoses, each named by its member earliest in the panel.
  std::vector<Diagnosis> report() const {
    std::vector<Diagnosis> out;
    for (const auto& gr : groups_) {
      if (out.size() >= opt_.keep) break;
      // Named by the member earliest in the panel; the others in same_as.
      std::size_t name_idx = gr.first;
      for (std::size_t m : gr.members)
        if (entries_[m].panel_index < entries_[name_idx].panel_index) name_idx = m;
      Diagnosis r = entries_[name_idx].d;
      for (std::size_t m : gr.members) {
        if (m == name_idx) continue;
        r.same_as.push_back(entries_[m].d.dialect);
        const auto& more = entries_[m].d.same_as;
        r.same_as.insert(r.same_as.end(), more.begin(), more.end());
      }
      const Score& sc = entries_[gr.first].score;
      const bool full = entries_[gr.first].full;
      r.score = sc.score;
      r.spec_score = s_spec_;
      r.explains = full && r.score <= 1.0;
      r.evidence =
          full ? fmt::format("max {} tolerance units from this dialect (worst: {}[{}]), {} from the spec",
                             short_number(r.score), sc.worst_output, sc.worst_index, short_number(s_spec_))
               : fmt::format(
                     "at least {} tolerance units from this dialect (worst: {}[{}]; over {} of {} rows), {} "
                     "from the spec",
                     short_number(r.score), sc.worst_output, sc.worst_index, lay_->rows.size(), g_->rows,
                     short_number(s_spec_));
      out.push_back(std::move(r));
    }
    return out;
  }

  const fix::FixtureCase& fc_;
  const ref::Case& c_;
  const Outputs& got_;
  const std::map<std::string, OutputAllowance>& allow_;
  const DiagnoseOptions& opt_;
  Scorer scorer_{fc_, got_, allow_};  // every score of this case, sharing the outputs' tables
  std::optional<Engine<double>> engine_;
  Knobs spec_;
  const ref::Geometry* g_ = nullptr;
  Layout all_;
  Layout sample_;  // the screened rows, where the case is screened
  const Layout* lay_ = nullptr;  // the rows scored first: all_ or sample_
  bool sampled_ = false;
  double s_spec_ = 0;
  double s_spec_columns_ = kInf;  // the spec's score on the outputs not per row (column sums)
  std::optional<Predictions> full_spec_;  // the spec on every row, when a sample is scored
  Predictions spec_pred_;  // the spec on lay_
  const Predictions* cmp_spec_ = nullptr;  // the spec on every row: entries are compared there
  // The spec's own score per output, on the sample and on every row (sampled cases: against the
  // full spec), for outputs a dialect does not change.
  SpecScores same_lay_, same_all_;
  std::vector<Entry> entries_;
  std::map<std::pair<std::size_t, std::size_t>, bool> same_memo_, apart_memo_;
  std::vector<Group> groups_;
  std::optional<std::vector<std::int64_t>> bound_cols_;  // worst_spec_columns, when first needed
};

}  // namespace

namespace {

// The failing outputs alone, where no dialect explains the whole case: a fault may show in some
// outputs while another is right (residual_out right, y and rstd computed without the residual),
// and the right output then disqualifies the dialect on the case. The dialects that explain the
// failing outputs, each naming them in `output`. The statistics outputs (mean, rstd) are scored
// even when right: every kernel the panel models computes y from them, so a dialect that changes
// them must explain them too (a fitted larger eps "explained" a float16 y truncated toward zero
// on y alone, while the right rstd said eps was the case's).
std::vector<Diagnosis> failing_outputs(const fix::FixtureCase& fc, const Outputs& got,
                                       const std::map<std::string, OutputAllowance>& allow,
                                       const DiagnoseOptions& opt) {
  fix::FixtureCase failing{fc.id, fc.category, fc.description, fc.c, {}};
  std::string names;
  for (const auto& [name, exp] : fc.expected) {
    if (!got.count(name)) continue;
    const fix::FixtureCase one{fc.id, fc.category, fc.description, fc.c, {{name, exp}}};
    const bool right = !(spec_score(one, got, allow) > 1);
    if (right && name != "mean" && name != "rstd") continue;
    failing.expected.emplace(name, exp);
    if (!right) names += (names.empty() ? "" : ", ") + name;
  }
  if (failing.expected.empty() || failing.expected.size() == fc.expected.size()) return {};
  auto d = Ranking(failing, got, allow, opt).run();
  std::vector<Diagnosis> out;
  for (auto& e : d) {
    if (!e.explains) break;
    e.output = names;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

std::vector<Diagnosis> diagnose(const fix::FixtureCase& fc, const Outputs& got,
                                const std::map<std::string, OutputAllowance>& allow,
                                const DiagnoseOptions& opt) {
  const ref::Case& c = fc.c;
  const auto x = c.inputs.find("x");
  if (x == c.inputs.end() || x->second.data.size() > opt.max_elements) return {};
  // An output of the wrong shape or dtype is that, not a fault of the panel (checker.hpp,
  // diagnosable).
  for (const auto& [name, exp] : fc.expected) {
    const auto g = got.find(name);
    if (g != got.end() && (g->second.shape != exp.value.shape || g->second.dtype != exp.value.dtype)) return {};
  }
  // A diagnosis never changes a case's verdict: whatever goes wrong in it gives no diagnosis.
  try {
    auto d = Ranking(fc, got, allow, opt).run();
    if ((d.empty() || !d.front().explains) && fc.expected.size() > 1) {
      auto per = failing_outputs(fc, got, allow, opt);
      if (!per.empty()) {
        per.insert(per.end(), std::make_move_iterator(d.begin()), std::make_move_iterator(d.end()));
        if (per.size() > opt.keep) per.resize(opt.keep);
        return per;
      }
    }
    return d;
  } catch (const std::exception&) {
    return {};
  }
}

// An unexplained case names its closest dialect only when that scores at most this fraction of the
// spec's score.
constexpr double kClearMargin = 0.5;

std::string describe_diagnosis(const std::vector<Diagnosis>& d) {
  if (d.empty())
    return "diagnosis: the panel does not cover this case (no dialect applies, or more "
           "than 2^24 elements)";
  const Diagnosis& b = d.front();
  std::string params;
  for (const auto& [k, v] : b.parameters)
    params += fmt::format("{}{} = {}", params.empty() ? "" : ", ", k, fmt::format("{:.6g}", v));
  if (!params.empty()) params = " (" + params + ")";
  // Unexplained: the closest dialect is named only where it is clearly closer than the spec (half
  // its score or less); otherwise naming one would suggest a cause the outputs do not support.
  if (!b.explains && !(b.score <= kClearMargin * b.spec_score))
    return fmt::format(
        "diagnosis: no known fault explains these outputs (the closest dialect, at {} tolerance units, is "
        "not clearly closer than the spec's {})",
        short_number(b.score), short_number(b.spec_score));
  if (!b.explains)
    return fmt::format("diagnosis: no dialect explains the outputs; closest: {} [{}] {}{}: {}", b.dialect,
                       b.fault_class, b.title, params, b.evidence);
  if (!b.output.empty())
    return fmt::format("diagnosis: {} explained by {} [{}] {}{} (the other outputs are right): {}", b.output,
                       b.dialect, b.fault_class, b.title, params, b.evidence);
  return fmt::format("diagnosis: explained by {} [{}] {}{}: {}", b.dialect, b.fault_class, b.title, params,
                     b.evidence);
}

}  // namespace normcheck::conf
