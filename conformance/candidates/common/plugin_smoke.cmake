# The smoke test of a bundled plugin (ctest, LABELS smoke), run as
#   cmake -DNORMCHECK=<bin/normcheck> -DCANDIDATE=builtin:<name> -DWORK_DIR=<dir>
#         [-DFIXTURES=<file.h5> | -DTIER=smoke] [-DSKIP_REASON=<regex>] [-DNO_GPU_REASON=<regex>]
#         -P plugin_smoke.cmake
# It runs the candidate on FIXTURES (the project's tests pass the smoke tier that
# conformance.tiers.generate_smoke writes once for all of them), or else generates TIER's
# fixtures itself. It passes when `normcheck run` exits 0 (nothing FAILED, CRASHED, TIMEOUT or
# MISSING) and at least one case PASSED (a plugin that declines everything is not a pass).
#
# SKIP_REASON: when every case is UNSUPPORTED with a message matching it (the plugin's runtime
#   is absent, e.g. no OpenCL platform), print "NORMCHECK-SKIP" (the test's
#   SKIP_REGULAR_EXPRESSION) instead of failing.
# NO_GPU_REASON: on a machine where `nvidia-smi -L` fails (no NVIDIA GPU or driver), require
#   instead that every case is UNSUPPORTED with a message matching it: the stated-reason skip.
#   With a GPU the candidate is run for real as above.
cmake_minimum_required(VERSION 3.25)  # script mode: today's policies (quoted strings are not variables)
include(${CMAKE_CURRENT_LIST_DIR}/results_case.cmake)
if(NOT TIER)
  set(TIER smoke)
endif()
file(MAKE_DIRECTORY "${WORK_DIR}")
set(fixtures "${WORK_DIR}/${TIER}.h5")
if(FIXTURES)
  set(fixtures "${FIXTURES}")
endif()
set(results "${WORK_DIR}/results.json")

set(expect_unsupported "")
set(no_gpu FALSE)
if(DEFINED NO_GPU_REASON)
  find_program(nvidia_smi nvidia-smi)
  set(gpu_rc 1)
  if(nvidia_smi)
    execute_process(COMMAND "${nvidia_smi}" -L RESULT_VARIABLE gpu_rc OUTPUT_QUIET ERROR_QUIET)
  endif()
  if(NOT gpu_rc EQUAL 0)
    set(expect_unsupported "${NO_GPU_REASON}")
    set(no_gpu TRUE)
    message("no NVIDIA GPU here (nvidia-smi -L failed or is absent): expecting every case UNSUPPORTED")
  endif()
endif()

if(NOT FIXTURES)
  execute_process(COMMAND "${NORMCHECK}" fixtures generate --tier ${TIER} -o "${fixtures}" --force
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fixtures generate --tier ${TIER} exited ${rc}:\n${out}")
  endif()
endif()

# --allow-empty: a candidate that cannot run here declines every case, which this script checks
# against the expected reason below (the CLI alone would exit 1: nothing was checked).
execute_process(COMMAND "${NORMCHECK}" run --candidate "${CANDIDATE}" --fixtures "${fixtures}" --json "${results}"
                        --force --allow-empty
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "normcheck run --candidate ${CANDIDATE} exited ${rc} (a case FAILED, CRASHED, TIMED OUT or "
                      "is MISSING; the table above says which)")
endif()

# Every case's verdict and message, from the results file.
normcheck_read_results("${results}" case)
set(n ${case_count})
if(n EQUAL 0)
  message(FATAL_ERROR "no cases in ${results}")
endif()
math(EXPR last "${n} - 1")
set(n_passed 0)
set(n_unsupported 0)
set(first_reason "")
set(all_match_skip TRUE)
set(all_match_expected TRUE)
foreach(i RANGE ${last})
  set(id "${case_id_${i}}")
  set(verdict "${case_verdict_${i}}")
  set(why "${case_why_${i}}")
  if(verdict STREQUAL "passed")
    math(EXPR n_passed "${n_passed} + 1")
  endif()
  if(verdict STREQUAL "unsupported")
    math(EXPR n_unsupported "${n_unsupported} + 1")
  endif()
  if(NOT verdict STREQUAL "unsupported" OR NOT DEFINED SKIP_REASON OR NOT why MATCHES "${SKIP_REASON}")
    set(all_match_skip FALSE)
  endif()
  if(no_gpu AND (NOT verdict STREQUAL "unsupported" OR NOT why MATCHES "${expect_unsupported}"))
    message(FATAL_ERROR "${id}: ${verdict} ('${why}'); expected UNSUPPORTED with a reason matching "
                        "'${expect_unsupported}'")
  endif()
  if(first_reason STREQUAL "")
    set(first_reason "${why}")
  endif()
endforeach()

if(no_gpu)
  message("all ${n} cases UNSUPPORTED with a reason matching '${expect_unsupported}': ${first_reason}")
  return()
endif()
if(all_match_skip)
  message("NORMCHECK-SKIP: ${CANDIDATE} declines every case: ${first_reason}")
  return()
endif()
if(n_passed EQUAL 0)
  message(FATAL_ERROR "${CANDIDATE}: no case PASSED (${n_unsupported} of ${n} UNSUPPORTED; first reason: "
                      "'${first_reason}')")
endif()
message("${CANDIDATE}: ${n_passed} of ${n} cases PASSED, ${n_unsupported} UNSUPPORTED, none FAILED")
