// One table per enum of the case vocabulary: every value with its name, in declaration order,
// written once beside the enum (case.hpp, quant.hpp, dtype.hpp). name_of(), the parsers, the
// "is not one of: ..." lists of error messages and the four codecs that read or write a case
// (case JSON, case lists, fixture attributes, the subprocess protocol) all loop over the table,
// so a new value is one row there and nowhere else.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace normcheck::ref {

template <class E>
struct Named {
  E value;
  std::string_view name;
};

// Specialized next to each enum as `static constexpr std::array rows{Named<E>{...}, ...};`,
// one row per value in declaration order (the tests check that every value has exactly one).
template <class E>
struct EnumTable;

// Every value of E, in the table's order.
template <class E>
constexpr auto values_of() {
  constexpr auto& rows = EnumTable<E>::rows;
  std::array<E, rows.size()> out{};
  for (std::size_t i = 0; i < rows.size(); ++i) out[i] = rows[i].value;
  return out;
}

// The name of a value ("?" for a value outside the table, which a valid enum never is).
template <class E>
constexpr std::string_view enum_name(E v) {
  for (const auto& r : EnumTable<E>::rows)
    if (r.value == v) return r.name;
  return "?";
}

// The value named exactly `s`.
template <class E>
constexpr std::optional<E> enum_parse(std::string_view s) {
  for (const auto& r : EnumTable<E>::rows)
    if (r.name == s) return r.value;
  return std::nullopt;
}

// "a, b, c": the names in the table's order, as error messages list them.
template <class E>
std::string enum_names_text() {
  std::string out;
  for (const auto& r : EnumTable<E>::rows) {
    if (!out.empty()) out += ", ";
    out += r.name;
  }
  return out;
}

}  // namespace normcheck::ref
