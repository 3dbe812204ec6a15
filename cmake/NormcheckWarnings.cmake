# normcheck_target_options(<target>): the project's warning set, -Werror under NORMCHECK_WERROR,
# and the sanitizers under NORMCHECK_SANITIZE. Every target of the project calls it.
function(normcheck_target_options target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion
                                           -Wno-sign-conversion -Wnon-virtual-dtor)
  if(NORMCHECK_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(NORMCHECK_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
                                             -fno-sanitize-recover=undefined)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()
