// Text helpers shared by the subcommands (declared in commands.hpp).
#include <cctype>
#include <filesystem>
#include <string>
#include <system_error>

#include "commands.hpp"

namespace normcheck::cli {

std::string quote(const std::string& s) {
  if (s.find_first_of(" \t'\"\\$`*?[]{}()<>|;&!#~") == std::string::npos && !s.empty()) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string slug(const std::string& s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.') ? c : '_';
  return out;
}

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("normcheck") : p.string();
}

}  // namespace normcheck::cli
