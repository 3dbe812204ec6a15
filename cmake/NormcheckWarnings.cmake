# normcheck_target_options(<target>): the project's warning set, -Werror under NORMCHECK_WERROR,
# and the sanitizers under NORMCHECK_SANITIZE. Every target of the project calls it.
function(normcheck_target_options target)
  # C and C++ sources only: nvcc (CUDA sources) takes host-compiler flags differently.
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:C,CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>
    $<$<COMPILE_LANGUAGE:CXX>:-Wnon-virtual-dtor>)
  if(NORMCHECK_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:C,CXX>:-Werror>)
  endif()
  if(NORMCHECK_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
                                             -fno-sanitize-recover=undefined)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
    # Executables (the CLI, the test programs) at -O0: their code parses arguments and states
    # tests; the numerical code they run is in the libraries and plugins, which keep -O1. An
    # instrumented unit compiles 2-3x faster at -O0 (scripts/README.md, "CI time"), and the
    # sanitizers check -O0 code at least as closely.
    # Executables also link as position-dependent (-no-pie): the loader then has no relative
    # relocations of their own to apply at each start, which took the instrumented CLI (120 MB)
    # from 0.37 s to 0.22 s per start; the smoke tests start it 359 times, besides the test
    # programs (scripts/README.md, "CI time"). Plugins and other shared modules stay position
    # independent.
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "EXECUTABLE")
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:C,CXX>:-O0>)
      target_link_options(${target} PRIVATE -no-pie)
    endif()
  endif()
endfunction()
