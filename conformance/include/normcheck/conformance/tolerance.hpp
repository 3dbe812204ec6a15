// Moved to the judge library (conformance/judge/, normcheck::judge): include
// "normcheck/judge/tolerance.hpp". This header is kept, with the candidate interface it used to bring
// along, so that code written against the old path still builds; it goes with the move of the
// candidates to conformance/candidates/.
#pragma once

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/judge/tolerance.hpp"
