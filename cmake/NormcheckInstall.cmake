# `cmake --install`: the normcheck CLI, the bundled plugins, the plugin header, the Python
# adapter module, the case lists and a CMake package (find_package(normcheck CONFIG)) giving
# normcheck::candidate, normcheck::normcheck and normcheck_add_conformance_test(). The layout
# under the prefix is fixed, because the CLI finds its data relative to its own path:
#   bin/normcheck
#   bin/normcheck-shard-check                       (sharded outputs files; conformance/sharding/)
#   lib/normcheck/plugins/libnormcheck_<name>.so   (builtin:<name>)
#   include/normcheck/candidate.h
#   share/normcheck/python/     (normcheck_protocol.py, numpy_candidate.py, torch_adapter.py)
#   share/normcheck/python/torch_dist/  (the torch.distributed runtime of sharded norms)
#   share/normcheck/cases/      (smoke.json, ci.json, nightly.json)
#   share/normcheck/web/        (Chart.js for the HTML reports)
#   lib/cmake/normcheck/        (the package)
include(CMakePackageConfigHelpers)

set(NORMCHECK_INSTALL_CMAKEDIR lib/cmake/normcheck)

# The plugin ABI as a target: a user's plugin links normcheck::candidate to get candidate.h.
add_library(normcheck_candidate INTERFACE)
add_library(normcheck::candidate ALIAS normcheck_candidate)
target_include_directories(normcheck_candidate INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/conformance/include>
  $<INSTALL_INTERFACE:include>)
set_target_properties(normcheck_candidate PROPERTIES EXPORT_NAME candidate)

set_target_properties(normcheck PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS normcheck normcheck_candidate EXPORT normcheckTargets
  RUNTIME DESTINATION bin
  INCLUDES DESTINATION include)
install(FILES ${PROJECT_SOURCE_DIR}/conformance/include/normcheck/candidate.h DESTINATION include/normcheck)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/conformance/python/ DESTINATION share/normcheck/python
  FILES_MATCHING PATTERN "*.py" PATTERN "README.md" PATTERN "tests" EXCLUDE PATTERN "__pycache__" EXCLUDE)
# builtin:torch's adapter (conformance/candidates/torch/) beside the protocol module it imports,
# where an installed normcheck looks for it (share/normcheck/python, or NORMCHECK_PYTHON_DIR).
install(FILES ${PROJECT_SOURCE_DIR}/conformance/candidates/torch/torch_adapter.py DESTINATION share/normcheck/python)
# Sharded norms (conformance/sharding/, conformance/candidates/torch_dist/): the check of sharded
# outputs files, and the runtime that writes them, whose files import each other from their own
# folder (dist_runtime.py puts it on the import path), with the bundled modules and plan list.
set_target_properties(normcheck-shard-check PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS normcheck-shard-check RUNTIME DESTINATION bin)
install(FILES ${PROJECT_SOURCE_DIR}/conformance/candidates/torch_dist/dist_runtime.py
              ${PROJECT_SOURCE_DIR}/conformance/candidates/torch_dist/shard_plan.py
              ${PROJECT_SOURCE_DIR}/conformance/candidates/torch_dist/sharded_norms.py
              ${PROJECT_SOURCE_DIR}/conformance/candidates/torch_dist/ci_plans.json
        DESTINATION share/normcheck/python/torch_dist)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/fixtures/cases/ DESTINATION share/normcheck/cases
  FILES_MATCHING PATTERN "*.json")
# Chart.js for the HTML reports (installed from npm by scripts/install-report-deps.sh), with
# its license texts.
foreach(_f chart.js/dist/chart.umd.js chart.js/LICENSE.md chart.js/package.json @kurkle/color/LICENSE.md)
  if(EXISTS ${NORMCHECK_REPORT_WEB_DIR}/${_f})
    get_filename_component(_d ${_f} DIRECTORY)
    install(FILES ${NORMCHECK_REPORT_WEB_DIR}/${_f} DESTINATION share/normcheck/web/${_d})
  endif()
endforeach()
get_property(_normcheck_plugins GLOBAL PROPERTY NORMCHECK_BUNDLED_PLUGINS)
if(_normcheck_plugins)
  set_target_properties(${_normcheck_plugins} PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
  install(TARGETS ${_normcheck_plugins} LIBRARY DESTINATION lib/normcheck/plugins)
endif()

install(EXPORT normcheckTargets NAMESPACE normcheck:: DESTINATION ${NORMCHECK_INSTALL_CMAKEDIR})
set(NORMCHECK_BIN_FILE bin/normcheck)
set(NORMCHECK_PYTHON_DIR share/normcheck/python)
# import normcheck (conformance/pymodule/), where it was built: the directory to put on PYTHONPATH.
get_property(NORMCHECK_PYTHON_MODULE_DIR GLOBAL PROPERTY NORMCHECK_PYTHON_INSTALL_DIR)
set(NORMCHECK_PYTHON_MODULE_BUILT OFF)
if(NORMCHECK_PYTHON_MODULE_DIR)
  set(NORMCHECK_PYTHON_MODULE_BUILT ON)
else()
  set(NORMCHECK_PYTHON_MODULE_DIR lib)  # unused: the package says the module is absent
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/normcheckConfig.cmake.in
  ${PROJECT_BINARY_DIR}/package/normcheckConfig.cmake
  INSTALL_DESTINATION ${NORMCHECK_INSTALL_CMAKEDIR}
  PATH_VARS NORMCHECK_BIN_FILE NORMCHECK_PYTHON_DIR NORMCHECK_PYTHON_MODULE_DIR)
# A minor release adds and never breaks (docs/VERSIONING.md): any 0.1.x or later 0.x within the
# same major satisfies find_package(normcheck 0.1).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/normcheckConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/package/normcheckConfig.cmake
  ${PROJECT_BINARY_DIR}/package/normcheckConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/NormcheckConformanceTest.cmake
  DESTINATION ${NORMCHECK_INSTALL_CMAKEDIR})
