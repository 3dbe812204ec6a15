# normcheck_add_conformance_test: registers ctest tests that check a kernel with normcheck.
#
#   normcheck_add_conformance_test(
#     NAME <test name>
#     CANDIDATE <plugin target> | <spec>     # a MODULE/SHARED library target of this project
#                                            # (plugin ABI, normcheck/candidate.h), or any spec
#                                            # `normcheck run` takes: plugin:PATH.so,
#                                            # "cmd:COMMAND ARGS...", builtin:NAME
#     [TIER smoke|ci|nightly]                # golden fixtures made at build time (default smoke)
#     [FIXTURES <file.h5>]                   # or reuse a fixture file you have (overrides TIER)
#     [CASES <glob>...]                      # only these cases
#     [PROPERTIES <glob>...]                 # also register <NAME>.properties: `normcheck prop`
#     [PROPERTY_TESTS <n>] [SEED <s>]        # generated tests per property (default 100), seed (1)
#     [TIMEOUT <s>] [STARTUP_TIMEOUT <s>]    # a cmd: candidate's seconds per case (default: none)
#                                            # and up to its hello (default: the larger of TIMEOUT
#                                            # and 120): give a kernel that imports a framework
#                                            # (torch, jax) a few minutes, a cold disk cache makes
#                                            # that import slow
#     [JUNIT <file>]                         # JUnit XML of the run, for the CI's test reporter
#     [JSON <file>]                          # the results file (reports/RESULTS.md)
#     [ISOLATE]                              # run the plugin in a child process: a crash is
#                                            # reported as CRASHED for its case, not a dead test
#     [ALLOW_EMPTY]                          # pass even when nothing was checked (below)
#     [EXPECT_REJECT]                        # a mutant of your own mutation tests (candidate.h
#                                            # NC_CAP_INTENDED_MUTANT): passes only if rejected
#     [LABELS <label>...])
#
# The test passes when no case is FAILED, CRASHED, TIMEOUT or MISSING (UNSUPPORTED and
# MISTRUSTED cases do not fail it) and at least one case was checked: a CASES glob that matches
# nothing, or a candidate that declines every case, fails the test ("nothing was checked")
# unless ALLOW_EMPTY is given (a kernel that runs only where a GPU is). The same holds for the
# .properties test: every property UNSUPPORTED fails it. Its output names each failing case with
# a one-line repro.
# Fixtures of a tier are generated once per build tree, by the target normcheck_fixtures_<tier>
# (part of `all`), into <build>/normcheck/<tier>.h5, and regenerated when normcheck changes.
# The tests get PYTHONPATH pointing at normcheck's Python module (normcheck_protocol), so a
# "cmd:python3 my_kernel.py" candidate can `import normcheck_protocol`.

function(normcheck_add_conformance_test)
  cmake_parse_arguments(PARSE_ARGV 0 NC "ISOLATE;ALLOW_EMPTY;EXPECT_REJECT" "NAME;CANDIDATE;TIER;FIXTURES;JUNIT;JSON;PROPERTY_TESTS;SEED;TIMEOUT;STARTUP_TIMEOUT"
                        "CASES;PROPERTIES;LABELS")
  if(NC_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "normcheck_add_conformance_test: unknown arguments: ${NC_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT NC_NAME OR NOT NC_CANDIDATE)
    message(FATAL_ERROR "normcheck_add_conformance_test: NAME and CANDIDATE are required")
  endif()
  if(NOT TARGET normcheck::normcheck)
    message(FATAL_ERROR "normcheck_add_conformance_test: no normcheck::normcheck target; call "
                        "find_package(normcheck CONFIG REQUIRED) first")
  endif()
  if(NOT NC_TIER)
    set(NC_TIER smoke)
  endif()
  if(NOT NC_TIER MATCHES "^[A-Za-z0-9_-]+$")
    message(FATAL_ERROR "normcheck_add_conformance_test(${NC_NAME}): TIER '${NC_TIER}' is not a tier name")
  endif()

  if(TARGET ${NC_CANDIDATE})
    get_target_property(_type ${NC_CANDIDATE} TYPE)
    if(NOT _type STREQUAL "MODULE_LIBRARY" AND NOT _type STREQUAL "SHARED_LIBRARY")
      message(FATAL_ERROR "normcheck_add_conformance_test(${NC_NAME}): target ${NC_CANDIDATE} is a "
                          "${_type}; a plugin candidate is a MODULE or SHARED library")
    endif()
    set(_spec "plugin:$<TARGET_FILE:${NC_CANDIDATE}>")
  elseif(NC_CANDIDATE MATCHES "^(builtin|plugin|cmd):")
    set(_spec "${NC_CANDIDATE}")
  else()
    message(FATAL_ERROR "normcheck_add_conformance_test(${NC_NAME}): CANDIDATE '${NC_CANDIDATE}' is "
                        "neither a target of this project nor a spec (builtin:, plugin:, cmd:)")
  endif()

  if(NC_FIXTURES)
    get_filename_component(_fixtures "${NC_FIXTURES}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  else()
    set(_fixtures "${CMAKE_BINARY_DIR}/normcheck/${NC_TIER}.h5")
    if(NOT TARGET normcheck_fixtures_${NC_TIER})
      file(MAKE_DIRECTORY "${CMAKE_BINARY_DIR}/normcheck")
      add_custom_command(OUTPUT "${_fixtures}"
        COMMAND normcheck::normcheck fixtures generate --tier ${NC_TIER} -o "${_fixtures}" --force
        DEPENDS "$<TARGET_FILE:normcheck::normcheck>"
        COMMENT "normcheck: golden fixtures of the ${NC_TIER} tier"
        VERBATIM)
      add_custom_target(normcheck_fixtures_${NC_TIER} ALL DEPENDS "${_fixtures}")
    endif()
  endif()

  set(_timeouts)
  foreach(_t IN ITEMS TIMEOUT STARTUP_TIMEOUT)
    if(DEFINED NC_${_t})
      if(NOT NC_${_t} MATCHES "^[0-9]+(\\.[0-9]+)?$")
        message(FATAL_ERROR "normcheck_add_conformance_test(${NC_NAME}): ${_t} '${NC_${_t}}' is not a number of seconds")
      endif()
      string(TOLOWER "${_t}" _opt)
      string(REPLACE "_" "-" _opt "${_opt}")
      list(APPEND _timeouts --${_opt} ${NC_${_t}})
    endif()
  endforeach()
  set(_args run --candidate "${_spec}" --fixtures "${_fixtures}" --force ${_timeouts})
  foreach(_glob IN LISTS NC_CASES)
    list(APPEND _args --cases "${_glob}")
  endforeach()
  if(NC_JUNIT)
    get_filename_component(_junit "${NC_JUNIT}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_BINARY_DIR}")
    get_filename_component(_dir "${_junit}" DIRECTORY)
    file(MAKE_DIRECTORY "${_dir}")
    list(APPEND _args --junit "${_junit}")
  endif()
  if(NC_JSON)
    get_filename_component(_json "${NC_JSON}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_BINARY_DIR}")
    get_filename_component(_dir "${_json}" DIRECTORY)
    file(MAKE_DIRECTORY "${_dir}")
    list(APPEND _args --json "${_json}")
  endif()
  if(NC_ISOLATE)
    list(APPEND _args --isolate)
  endif()
  if(NC_ALLOW_EMPTY)
    list(APPEND _args --allow-empty)
  endif()
  if(NC_EXPECT_REJECT)
    list(APPEND _args --expect-reject)
  endif()
  add_test(NAME ${NC_NAME} COMMAND normcheck::normcheck ${_args})
  set(_tests ${NC_NAME})

  if(NC_PROPERTIES)
    if(NOT NC_PROPERTY_TESTS)
      set(NC_PROPERTY_TESTS 100)
    endif()
    if(NOT NC_SEED)
      set(NC_SEED 1)
    endif()
    set(_pargs prop --candidate "${_spec}" --tests ${NC_PROPERTY_TESTS} --seed ${NC_SEED} ${_timeouts})
    foreach(_glob IN LISTS NC_PROPERTIES)
      list(APPEND _pargs --properties "${_glob}")
    endforeach()
    if(NC_ALLOW_EMPTY)
      list(APPEND _pargs --allow-empty)
    endif()
    add_test(NAME ${NC_NAME}.properties COMMAND normcheck::normcheck ${_pargs})
    list(APPEND _tests ${NC_NAME}.properties)
  endif()

  set(_pythonpath "${NORMCHECK_PYTHON_DIR}")
  if(DEFINED ENV{PYTHONPATH} AND NOT "$ENV{PYTHONPATH}" STREQUAL "")
    string(APPEND _pythonpath ":$ENV{PYTHONPATH}")
  endif()
  set_tests_properties(${_tests} PROPERTIES
    LABELS "normcheck;${NC_LABELS}"
    ENVIRONMENT "PYTHONPATH=${_pythonpath}")
endfunction()
