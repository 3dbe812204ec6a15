# normcheck_read_results(<results.json> <prefix>): every case of a results file (normcheck-results
# v1, reports/RESULTS.md), read in one pass by results_cases.py: sets <prefix>_count and, for
# case i, <prefix>_id_<i>, <prefix>_verdict_<i> (lower case) and <prefix>_why_<i> (its message,
# "" when it has none). string(JSON) would parse the whole file once per field and case: over
# the ci tier's 520 cases that was 22 s of a 49 s test. Included by the plugins' ctest scripts
# (plugin_smoke.cmake, ../ggml/tests/known_findings.cmake); PYTHON may name the interpreter
# (any python3: the reader uses the standard library only).
set(_normcheck_results_case_dir "${CMAKE_CURRENT_LIST_DIR}")
macro(normcheck_read_results results prefix)
  if(NOT PYTHON)
    find_program(PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
    if(NOT PYTHON)
      find_program(PYTHON NAMES python3 REQUIRED)
    endif()
  endif()
  execute_process(COMMAND "${PYTHON}" "${_normcheck_results_case_dir}/results_cases.py" "${results}" "${prefix}"
                          "${results}.cases.cmake"
                  RESULT_VARIABLE _nc_rc ERROR_VARIABLE _nc_err)
  if(NOT _nc_rc EQUAL 0)
    message(FATAL_ERROR "reading ${results}: ${_nc_err}")
  endif()
  include("${results}.cases.cmake")
endmacro()
