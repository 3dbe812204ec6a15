// The diagnosis's internals that its speed rests on (judge/diagnosis/engine.hpp, scoring.hpp):
// arrays reused from earlier predictions give the values fresh ones give, and a scoring stopped
// at a bound is a lower bound of the full score that reaches the bound.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "engine.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "scoring.hpp"
#include "test_cases.hpp"

namespace normcheck::conf {
namespace {

using diag::Engine;
using diag::Knobs;
using diag::Predictions;
using ref::DType;
using test::normal;

ref::Case block_free_case(ref::Op op, ref::Direction dir, bool residual, unsigned seed) {
  std::mt19937_64 rng(seed);
  const std::int64_t rows = 6, cols = 40;
  const auto n = static_cast<std::size_t>(rows * cols);
  ref::Case c;
  c.op = op;
  c.direction = dir;
  c.affine = op == ref::Op::layernorm ? ref::Affine::weight_bias : ref::Affine::weight;
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_residual = DType::float32;
  c.dtype_compute = DType::float32;
  c.inputs["x"] = ref::Tensor{DType::float32, {rows, cols}, normal(rng, n, 0.5, 2, DType::float32)};
  c.inputs["weight"] = ref::Tensor{DType::float32, {cols}, normal(rng, 40, 1, 0.5, DType::float32)};
  if (c.affine == ref::Affine::weight_bias)
    c.inputs["bias"] = ref::Tensor{DType::float32, {cols}, normal(rng, 40, 0, 0.5, DType::float32)};
  if (residual) {
    c.residual = ref::Residual::add;
    c.inputs["residual"] = ref::Tensor{DType::float32, {rows, cols}, normal(rng, n, 1, 1, DType::float32)};
  }
  if (dir == ref::Direction::backward)
    c.inputs["dy"] = ref::Tensor{DType::float32, {rows, cols}, normal(rng, n, 0, 1, DType::float32)};
  return c;
}

// Predictions of every output, with arrays of NaN payloads larger than any output.
Predictions poison(std::size_t n) {
  Predictions p;
  const double bad = std::bit_cast<double>(std::uint64_t{0x7ff4dead0000beefull});
  for (const char* name : {"a", "b", "c", "d", "e", "f"}) p[name].assign(n, bad);
  return p;
}

void expect_same(const Predictions& fresh, const Predictions& reused, const std::string& what) {
  ASSERT_EQ(fresh.values.size(), reused.values.size()) << what;
  for (const auto& [name, v] : fresh.values) {
    const auto it = reused.values.find(name);
    ASSERT_NE(it, reused.values.end()) << what << " " << name;
    ASSERT_EQ(v.size(), it->second.size()) << what << " " << name;
    for (std::size_t i = 0; i < v.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint64_t>(v[i]), std::bit_cast<std::uint64_t>(it->second[i]))
          << what << " " << name << "[" << i << "]";
  }
}

// Engine::recycle / take: an engine whose pool holds poisoned arrays (and the predictions of
// the runs before) predicts bit for bit what a fresh engine does, forward and backward, with a
// residual, on every row and on a sample, for rows not computed (rows_limit), and for the column
// sums alone.
TEST(DiagnosisEngine, RecycledArraysGiveTheSameValues) {
  unsigned seed = 1;
  for (auto op : {ref::Op::layernorm, ref::Op::rmsnorm})
    for (auto dir : {ref::Direction::forward, ref::Direction::backward})
      for (bool residual : {false, true}) {
        const ref::Case c = block_free_case(op, dir, residual, seed++);
        const Engine<double> fresh_engine(c);
        const Engine<double> reused(c);
        const auto all = reused.layout(nullptr);
        const std::vector<std::int64_t> rows{1, 4};
        const auto sample = reused.layout(&rows);
        Knobs spec = reused.spec();
        Knobs eps = spec;
        eps.eps = spec.eps * 1e3 + 1e-3;
        Knobs dead = spec;
        dead.rows_limit = 3;
        dead.unwritten = -7;
        for (const Knobs* k : {&spec, &eps, &dead})
          for (const diag::Layout* l : {&all, &sample}) {
            reused.recycle(poison(1000));
            reused.recycle(poison(3));
            const std::string what = std::string(op == ref::Op::layernorm ? "LN" : "RMS") +
                                     (dir == ref::Direction::forward ? " fwd" : " bwd") +
                                     (residual ? " residual" : "") + (l == &all ? " all rows" : " sample") +
                                     (k == &dead ? " rows_limit" : k == &eps ? " eps" : " spec");
            Predictions p = reused.run(*k, *l);
            expect_same(fresh_engine.run(*k, *l), p, what);
            reused.recycle(std::move(p));
            if (dir == ref::Direction::backward && l == &all)
              expect_same(fresh_engine.run(*k, *l, true), reused.run(*k, *l, true), what + " columns only");
          }
      }
}

// Scorer::score with stop_at: below the full score it stops with a partial score between the
// bound and the full score; at or above it (and by default) it is the full score.
TEST(DiagnosisEngine, ScoringStopsAtItsBound) {
  const ref::Case c = block_free_case(ref::Op::layernorm, ref::Direction::forward, true, 11);
  const fix::FixtureCase fc = test::fixture_of(c);
  const auto allow = derive_allowances(c);
  // The outputs of eps x 1000: every element departs from the spec's.
  ref::Case f = c;
  f.epsilon = c.epsilon * 1e3 + 1e-3;
  Outputs got;
  for (const auto& [name, out] : ref::evaluate(f).outputs) got[name] = out.value;
  const Engine<double> engine(c);
  const auto all = engine.layout(nullptr);
  const Predictions spec = engine.run(engine.spec(), all);
  Knobs k = engine.spec();
  k.eps = c.epsilon * 10;
  const Predictions dialect = engine.run(k, all);
  const diag::Scorer scorer(fc, got, allow);
  const diag::Score full = scorer.score(&all, &dialect, &spec);
  ASSERT_FALSE(full.partial);
  ASSERT_GT(full.score, 4.0);  // the wrong eps is seen
  ASSERT_GT(full.beyond, 1);
  const diag::Score same = scorer.score(&all, &dialect, &spec, nullptr, {}, true, full.score * 2);
  EXPECT_FALSE(same.partial);
  EXPECT_EQ(same.score, full.score);
  EXPECT_EQ(same.beyond, full.beyond);
  EXPECT_EQ(same.worst_index, full.worst_index);
  EXPECT_EQ(same.worst_output, full.worst_output);
  EXPECT_EQ(same.distinct, full.distinct);
  const double bound = full.score / 4;
  const diag::Score cut = scorer.score(&all, &dialect, &spec, nullptr, {}, true, bound);
  EXPECT_TRUE(cut.partial);
  EXPECT_GE(cut.score, bound);
  EXPECT_LE(cut.score, full.score);
  // The free function (tables of its own) agrees with the scorer.
  const diag::Score again = diag::score_of(fc, got, allow, &all, &dialect, &spec);
  EXPECT_EQ(again.score, full.score);
  EXPECT_EQ(again.beyond, full.beyond);
}

}  // namespace
}  // namespace normcheck::conf
