// Capabilities as a JSON object, written from the one table (capabilities.hpp): the subprocess
// protocol's hello (PROTOCOL.md) and `normcheck candidates --json` (an ordered_json, fields in
// the table's order). The protocol's reader loops over the same table (subprocess/protocol.cpp).
#pragma once

#include <type_traits>

#include <nlohmann/json.hpp>

#include "normcheck/conformance/capabilities.hpp"

namespace normcheck::conf {

template <class Json = nlohmann::json>
Json capabilities_json(const Capabilities& caps) {
  Json j = Json::object();
  for_each_capability(caps, [&]<class T>(const CapabilityField& f, const T& v) {
    const std::string name(f.name);
    if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::string>) {
      j[name] = v;
    } else if constexpr (std::is_same_v<T, Reduction>) {
      j[name] = name_of(v);
    } else {
      Json a = Json::array();
      for (const auto& x : v) a.push_back(capability_item_name(x));
      j[name] = std::move(a);
    }
  });
  return j;
}

}  // namespace normcheck::conf
