# cmake -DBUILD_DIR=... -DEXAMPLE_DIR=... -DWORK_DIR=... -DC_COMPILER=... [-DPKG_CONFIG=...] -P run_embed_test.cmake
# Needs librattn.so built in BUILD_DIR (target rattn_lib).
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "$ ${ARGV}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGV}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} --component rattn_library)
foreach(f include/rattn.h include/rattn.hpp lib/librattn.so lib/cmake/rattn/rattnConfig.cmake lib/pkgconfig/rattn.pc)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install did not produce ${prefix}/${f}")
  endif()
endforeach()

# 1. find_package(rattn) through the CMake package.
run(${CMAKE_COMMAND} -S ${EXAMPLE_DIR} -B ${WORK_DIR}/build -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=${C_COMPILER})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/rattn_embed)

# 2. pkg-config: compile the same program by hand.
if(PKG_CONFIG)
  set(ENV{PKG_CONFIG_PATH} ${prefix}/lib/pkgconfig)
  execute_process(COMMAND ${PKG_CONFIG} --cflags --libs rattn OUTPUT_VARIABLE flags RESULT_VARIABLE rc
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config rattn failed")
  endif()
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run(${C_COMPILER} -std=c99 -O2 -Wall -Wextra -Werror ${EXAMPLE_DIR}/embed.c -o ${WORK_DIR}/embed_pc ${flags}
      -Wl,-rpath,${prefix}/lib -lm)
  run(${WORK_DIR}/embed_pc --tokens 4096 --steps 8)
endif()
