# normcheck_results_case(<json> <i> <id_var> <verdict_var> <why_var>): case <i> of a results file
# (normcheck-results v1, reports/RESULTS.md) read into the three variables: its case_id, its
# verdict in lower case, and its message ("" when it has none). Included by the plugins' ctest
# scripts (plugin_smoke.cmake, ../ggml/tests/known_findings.cmake).
macro(normcheck_results_case json i id_var verdict_var why_var)
  string(JSON ${id_var} GET "${${json}}" cases ${${i}} case_id)
  string(JSON ${verdict_var} GET "${${json}}" cases ${${i}} verdict)
  string(TOLOWER "${${verdict_var}}" ${verdict_var})
  string(JSON ${why_var} ERROR_VARIABLE _nc_no_message GET "${${json}}" cases ${${i}} message)
  if(_nc_no_message)
    set(${why_var} "")
  endif()
endmacro()
