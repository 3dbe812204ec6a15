# normcheck_gtest(<target> PREFIX <prefix> [TIMEOUT <seconds>]): registers a GoogleTest
# executable's tests with ctest, labelled smoke.
#
# The plain build registers every test case on its own (gtest_discover_tests: `ctest -R
# judge.Checker` picks cases, a failure names its case). The sanitizer build registers the
# executable once, as `<prefix><target>` (`judge.judge_test`), running all its cases in one process: an instrumented
# process spends 0.1-0.3 s starting (relocations, the sanitizers' registration of globals), so
# 308 processes of one case each cost 143 s of the sanitizer run's test time where 19 whole
# executables cost 97 s, the same cases passing (scripts/README.md, "CI time"). gtest's output
# names a failing case either way.
function(normcheck_gtest target)
  cmake_parse_arguments(arg "" "PREFIX;TIMEOUT" "" ${ARGN})
  if(NOT arg_PREFIX)
    message(FATAL_ERROR "normcheck_gtest(${target}): PREFIX is required")
  endif()
  if(NORMCHECK_SANITIZE)
    add_test(NAME ${arg_PREFIX}${target} COMMAND ${target})
    set_tests_properties(${arg_PREFIX}${target} PROPERTIES LABELS smoke TIMEOUT 600)
  else()
    set(timeout_property)
    if(arg_TIMEOUT)
      set(timeout_property TIMEOUT ${arg_TIMEOUT})
    endif()
    gtest_discover_tests(${target} TEST_PREFIX ${arg_PREFIX} PROPERTIES LABELS smoke ${timeout_property}
                         DISCOVERY_TIMEOUT 60)
  endif()
endfunction()
