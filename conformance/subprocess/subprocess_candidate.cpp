#include <stdexcept>

#include "transports.hpp"

namespace normcheck::conf {

std::unique_ptr<Candidate> make_subprocess_candidate(const std::vector<std::string>& argv,
                                                     const std::string& name, double) {
  (void)argv;
  throw std::invalid_argument(name + ": subprocess candidates are not supported by this build yet");
}

}  // namespace normcheck::conf
