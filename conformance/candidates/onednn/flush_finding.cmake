# The recorded finding of oneDNN (known_findings.json, docs/FINDINGS.md#onednn-bf16-flush), held
# both ways on its one-case fixture; fails if either verdict changes. Run as
#   cmake -DNORMCHECK=<bin/normcheck> -DCASES=<docs/findings/onednn-bf16-flush.json>
#         -DKNOWN=<known_findings.json> -DFLUSHED=<zeros> -DWORK_DIR=<dir> -P flush_finding.cmake
# 1. Under its declaration (NC_CAP_FLUSH_SUBNORMAL_OUTPUTS) oneDNN conforms: the case PASSES with
#    exactly FLUSHED zeros accepted as flushed subnormals (more or fewer: oneDNN's flushing changed).
# 2. With --ignore-flush-declaration and the known findings, the case FAILS as the recorded finding
#    (known_finding in the results) and the run exits 0.
# 3. The same run without the known findings exits 1: a failure that is no recorded finding fails.
cmake_minimum_required(VERSION 3.25)
file(MAKE_DIRECTORY "${WORK_DIR}")
set(fixtures "${WORK_DIR}/onednn-bf16-flush.h5")
execute_process(COMMAND "${NORMCHECK}" fixtures generate --cases "${CASES}" -o "${fixtures}" --force
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fixtures generate --cases ${CASES} exited ${rc}:\n${out}")
endif()

# The one case's verdict, its outputs' failed and flushed counts, and its known finding.
function(read_case results prefix)
  file(READ "${results}" j)
  string(JSON verdict GET "${j}" cases 0 verdict)
  string(JSON n_out LENGTH "${j}" cases 0 outputs)
  math(EXPR last "${n_out} - 1")
  set(failed 0)
  set(flushed 0)
  foreach(k RANGE ${last})
    string(JSON f ERROR_VARIABLE e GET "${j}" cases 0 outputs ${k} failed)
    if(NOT e)
      math(EXPR failed "${failed} + ${f}")
    endif()
    string(JSON f ERROR_VARIABLE e GET "${j}" cases 0 outputs ${k} flushed)
    if(NOT e)
      math(EXPR flushed "${flushed} + ${f}")
    endif()
  endforeach()
  string(JSON known ERROR_VARIABLE e GET "${j}" cases 0 known_finding finding)
  if(e)
    set(known "")
  endif()
  set(${prefix}_verdict "${verdict}" PARENT_SCOPE)
  set(${prefix}_failed "${failed}" PARENT_SCOPE)
  set(${prefix}_flushed "${flushed}" PARENT_SCOPE)
  set(${prefix}_known "${known}" PARENT_SCOPE)
endfunction()

file(READ "${KNOWN}" known_json)
string(JSON anchor GET "${known_json}" candidates builtin:onednn 0 finding)

execute_process(COMMAND "${NORMCHECK}" run --candidate builtin:onednn --fixtures "${fixtures}"
                        --json "${WORK_DIR}/declared.json" --force
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT EXISTS "${WORK_DIR}/declared.json")
  message(FATAL_ERROR "normcheck run --candidate builtin:onednn exited ${rc} without a results file:\n${out}")
endif()
read_case("${WORK_DIR}/declared.json" declared)
if(NOT rc EQUAL 0 OR NOT declared_verdict STREQUAL "PASSED" OR NOT declared_flushed EQUAL FLUSHED)
  message(FATAL_ERROR "under its declaration oneDNN was recorded as PASSED with ${FLUSHED} zeros accepted as "
                      "flushed subnormals; now ${declared_verdict} with ${declared_flushed} (exit ${rc}): update "
                      "docs/FINDINGS.md#onednn-bf16-flush and ${KNOWN}\n${out}")
endif()

execute_process(COMMAND "${NORMCHECK}" run --candidate builtin:onednn --fixtures "${fixtures}" --ignore-flush-declaration
                        --known-findings "${KNOWN}" --json "${WORK_DIR}/ignored.json" --force --no-diagnosis
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT EXISTS "${WORK_DIR}/ignored.json")
  message(FATAL_ERROR "normcheck run --ignore-flush-declaration exited ${rc} without a results file:\n${out}")
endif()
read_case("${WORK_DIR}/ignored.json" ignored)
if(NOT rc EQUAL 0 OR NOT ignored_verdict STREQUAL "FAILED" OR NOT ignored_known STREQUAL anchor
   OR NOT ignored_failed EQUAL FLUSHED)
  message(FATAL_ERROR "with --ignore-flush-declaration oneDNN was recorded as FAILED, ${FLUSHED} elements, the "
                      "known finding ${anchor}; now ${ignored_verdict}, ${ignored_failed} elements, known finding "
                      "'${ignored_known}' (exit ${rc})\n${out}")
endif()

execute_process(COMMAND "${NORMCHECK}" run --candidate builtin:onednn --fixtures "${fixtures}" --ignore-flush-declaration
                        --no-diagnosis
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "without --known-findings the flushed case must fail the run (exit 1); it exited ${rc}:\n${out}")
endif()
message("builtin:onednn on ${CASES}: declared PASSED (${declared_flushed} zeros accepted as flushed subnormals); "
        "without the declaration FAILED (${ignored_failed} elements), the known finding ${anchor}")
