#include <stdexcept>

#include "transports.hpp"

namespace normcheck::conf {

std::unique_ptr<Candidate> make_plugin_candidate(const std::string& path) {
  throw std::invalid_argument("plugin:" + path + ": plugins are not supported by this build yet");
}

}  // namespace normcheck::conf
