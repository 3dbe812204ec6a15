// The certified reference: evaluate a case exactly and round every output correctly.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "normcheck/reference/case.hpp"

namespace normcheck::ref {

struct Options {
  // Ziv loop: working precision starts at `start_bits` and doubles up to `max_bits`; an element
  // whose rounding is still undecided there is reported with certified = 0.
  int start_bits = 96;
  int max_bits = 2048;
  // Decide most elements with double-double arithmetic and a proved error bound, and use MPFR
  // only where that leaves the rounding open. false: MPFR for every element (for testing).
  bool fast_path = true;
};

// One output tensor. `value` holds the correctly rounded values in the output's dtype,
// `f64` the exact value rounded to binary64, `certified` 1 where both roundings are decided.
//
// Quantized outputs (q, and the E8M0/E4M3 block scales) are codes: `codes` names their format
// (quant_code_dtype: "float8_e4m3fn", "int8", "nvfp4_e2m1", "e8m0", ...), `value.data` holds
// each code as an exact integer (0..255; int8 -127..127; NVFP4 one 0..15 code per element,
// unpacked) and `value.dtype` is float64 only as a placeholder. For q, `f64` is the exact
// pre-quantization value in code units (the real norm output times the scale's multiplier, to
// within 2^-52 relative: y's binary64 value times the multiplier, rounded) and `ties` is 1 where that exact value lies on a code boundary to within
// its binary64 rounding: a correct kernel with any error at all there may give either code.
// MX and NVFP4 block scales have `ties` too: 1 where the exact amax of their block lies on a
// step of the scale function to within one float32 ulp (a power of two for the MX floor rule).
struct Output {
  Tensor value;
  std::vector<double> f64;
  std::vector<std::uint8_t> certified;
  std::string codes;                 // "" for a floating-point output
  std::vector<std::uint8_t> ties;    // q and block scales of a quant case; empty otherwise
};

struct Stats {
  std::int64_t elements = 0;      // output elements produced
  std::int64_t fast = 0;          // decided by the double-double path
  std::int64_t slow = 0;          // decided by MPFR
  std::int64_t uncertified = 0;   // undecided at max_bits
  int max_bits_used = 0;
};

struct Result {
  std::map<std::string, Output> outputs;  // y, mean, rstd, residual_out / dx, dweight, ...
  Stats stats;
};

// Throws CaseError for an invalid case.
Result evaluate(const Case& c, const Options& opt = {});

// The same result, into `out`, reusing the buffers of the outputs `out` already holds (from an
// earlier case): a caller that evaluates case after case (fixture generation) then pays neither
// the page faults nor the zero-filling of fresh output buffers, 17 bytes an element. The values
// do not depend on what the buffers held.
void evaluate_into(const Case& c, const Options& opt, Result& out);

// The norm part of a quantized case (c.quant set; README.md "Quantized outputs", step 1): the
// same case without `quant` and its `scale` input, with the residual sum rounded where the
// contract says so and y in the dtype the contract quantizes (dtype_out, or float32). Its y is
// the value p a kernel hands to the scale; the judge derives p's allowance from it.
Case quant_norm_case(const Case& c);

// Frees the calling thread's MPFR caches (constants such as pi that erf fills). A thread that
// evaluated cases calls it before it ends; otherwise the caches leak with the thread.
void release_thread_caches();

}  // namespace normcheck::ref
