# Runs a real library's candidate over a fixture file and holds it to its recorded findings, run as
#   cmake -DNORMCHECK=<bin/normcheck> -DCANDIDATE=builtin:<name> -DKNOWN=<known_findings.json>
#         -DWORK_DIR=<dir> (-DTIER=<tier> | -DFIXTURES=<file.h5>) [-DSKIP_REASON=<regex>]
#         -P known_findings.cmake
# KNOWN lists, per candidate, the cases whose verdict is a recorded finding (docs/FINDINGS.md):
# {"candidates": {"builtin:ggml-cpu": [{"case": ID, "verdict": "CRASHED", "finding": ANCHOR}]}}.
# It passes when every case that FAILED, CRASHED, TIMED OUT or is MISSING is listed with that
# verdict, and every listed case of the run has its listed verdict: an unrecorded failure fails
# the test, and so does a recorded finding that no longer shows (ggml fixed, or the mapping
# changed: update the file). SKIP_REASON: every case UNSUPPORTED, some with a reason matching it
# (ggml not installed, no Vulkan device), prints NORMCHECK-SKIP instead.
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/../../common/results_case.cmake)
file(MAKE_DIRECTORY "${WORK_DIR}")
if(NOT FIXTURES)
  set(FIXTURES "${WORK_DIR}/${TIER}.h5")
  execute_process(COMMAND "${NORMCHECK}" fixtures generate --tier ${TIER} -o "${FIXTURES}" --force
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fixtures generate --tier ${TIER} exited ${rc}:\n${out}")
  endif()
endif()
string(REGEX REPLACE "[^A-Za-z0-9]+" "_" slug "${CANDIDATE}")
set(results "${WORK_DIR}/${slug}.json")
execute_process(COMMAND "${NORMCHECK}" run --candidate "${CANDIDATE}" --fixtures "${FIXTURES}" --json "${results}" --force
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT EXISTS "${results}")
  message(FATAL_ERROR "normcheck run --candidate ${CANDIDATE} exited ${rc} without a results file:\n${out}")
endif()

file(READ "${KNOWN}" known_json)
string(JSON n_known ERROR_VARIABLE no_entry LENGTH "${known_json}" candidates "${CANDIDATE}")
if(no_entry)
  set(n_known 0)
endif()
set(known_ids "")
if(n_known GREATER 0)
  math(EXPR last_known "${n_known} - 1")
  foreach(k RANGE ${last_known})
    string(JSON id GET "${known_json}" candidates "${CANDIDATE}" ${k} case)
    string(JSON v GET "${known_json}" candidates "${CANDIDATE}" ${k} verdict)
    string(TOLOWER "${v}" v)
    list(APPEND known_ids "${id}")
    set("known_${id}" "${v}")
  endforeach()
endif()

file(READ "${results}" json)
string(JSON n LENGTH "${json}" cases)
math(EXPR last "${n} - 1")
set(problems "")
set(n_known_seen 0)
set(n_passed 0)
set(all_unsupported TRUE)
set(skip_reason_seen FALSE)
set(first_reason "")
foreach(i RANGE ${last})
  normcheck_results_case(json i id verdict why)
  # Cases the declared capabilities exclude are declined before the plugin's init is asked, with
  # their own reason: a skip is every case UNSUPPORTED and the runtime's reason among them.
  if(NOT verdict STREQUAL "unsupported")
    set(all_unsupported FALSE)
  elseif(DEFINED SKIP_REASON AND why MATCHES "${SKIP_REASON}")
    set(skip_reason_seen TRUE)
    set(first_reason "${why}")
  endif()
  if(verdict STREQUAL "passed")
    math(EXPR n_passed "${n_passed} + 1")
  endif()
  set(failure FALSE)
  if(verdict MATCHES "^(failed|crashed|timeout|missing)$")
    set(failure TRUE)
  endif()
  if(DEFINED "known_${id}")
    if(verdict STREQUAL "${known_${id}}")
      math(EXPR n_known_seen "${n_known_seen} + 1")
    else()
      string(APPEND problems "  ${id}: ${verdict}, recorded as ${known_${id}} (update ${KNOWN})\n")
    endif()
  elseif(failure)
    string(APPEND problems "  ${id}: ${verdict}, not a recorded finding\n")
  endif()
endforeach()

if(all_unsupported AND skip_reason_seen)
  message("NORMCHECK-SKIP: ${CANDIDATE} declines every case: ${first_reason}")
  return()
endif()
string(REGEX MATCH "\ncandidate [^\n]*\n[^\n]*" table "${out}")
message("${table}")
if(problems)
  message("${out}")
  message(FATAL_ERROR "${CANDIDATE} on ${FIXTURES}: verdicts that are not its recorded findings:\n${problems}")
endif()
if(n_passed EQUAL 0)
  message(FATAL_ERROR "${CANDIDATE}: no case PASSED")
endif()
message("${CANDIDATE}: ${n_passed} of ${n} cases PASSED; ${n_known_seen} recorded findings as recorded "
        "(${KNOWN}); nothing else failed")
