# The kernel headers' layering (docs/design.md, "Layers"): nothing that the
# nccl backend compiles includes the onesided backend's kernel interface
# (kernels/onesided_kernels.h, kernels/onesided_setup.h), directly or through
# another header, and every kernel file takes its shared device code from
# kernels/device.cuh. Follows the #include "..." lines of the sources as the
# compiler's search path finds them (the includer's folder, src/, src/core/,
# include/). Run: cmake -DSRC=<source dir> -P kernel_headers.cmake
cmake_minimum_required(VERSION 3.24)
if(NOT SRC)
  message(FATAL_ERROR "kernel_headers: pass -DSRC=<source dir>")
endif()
set(_search "${SRC}/src" "${SRC}/src/core" "${SRC}/include")

# The files `file` includes with #include "...", resolved to paths (those
# found in the tree; system headers are not followed).
function(_includes file out)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]+\"[^\"]+\"")
  get_filename_component(dir "${file}" DIRECTORY)
  set(found)
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([^\"]+)\".*" "\\1" name "${line}")
    foreach(base "${dir}" ${_search})
      if(EXISTS "${base}/${name}")
        get_filename_component(p "${base}/${name}" REALPATH)
        list(APPEND found "${p}")
        break()
      endif()
    endforeach()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# Every file `root` reaches through #include "..." lines.
function(_closure root out)
  set(seen)
  set(queue "${root}")
  while(queue)
    list(POP_FRONT queue f)
    if(f IN_LIST seen)
      continue()
    endif()
    list(APPEND seen "${f}")
    _includes("${f}" inc)
    list(APPEND queue ${inc})
  endwhile()
  set(${out} "${seen}" PARENT_SCOPE)
endfunction()

set(errors 0)
file(GLOB nccl_roots "${SRC}/src/core/*.c" "${SRC}/src/core/*.h"
     "${SRC}/src/backends/nccl_backend.c" "${SRC}/src/backends/nccl_collectives.c"
     "${SRC}/src/kernels/nccl_kernels.h" "${SRC}/src/kernels/swap_permute.cu"
     "${SRC}/src/kernels/verify_pack.cu" "${SRC}/src/kernels/records.h"
     "${SRC}/src/kernels/select_kernels.h" "${SRC}/src/kernels/sample_kernels.h"
     "${SRC}/src/kernels/select.cu" "${SRC}/src/kernels/sample.cu")
foreach(root IN LISTS nccl_roots)
  _closure("${root}" files)
  foreach(f IN LISTS files)
    if(f MATCHES "/kernels/onesided_(kernels|setup)\\.h$")
      file(RELATIVE_PATH r "${SRC}" "${root}")
      file(RELATIVE_PATH i "${SRC}" "${f}")
      message(SEND_ERROR "kernel_headers: ${r} includes ${i} (the onesided backend's kernel interface)")
      math(EXPR errors "${errors} + 1")
    endif()
  endforeach()
endforeach()

file(GLOB cu_files "${SRC}/src/kernels/*.cu")
get_filename_component(device "${SRC}/src/kernels/device.cuh" REALPATH)
foreach(cu IN LISTS cu_files)
  _includes("${cu}" inc)
  if(NOT device IN_LIST inc)
    file(RELATIVE_PATH r "${SRC}" "${cu}")
    message(SEND_ERROR "kernel_headers: ${r} does not include kernels/device.cuh")
    math(EXPR errors "${errors} + 1")
  endif()
endforeach()

if(errors GREATER 0)
  message(FATAL_ERROR "kernel_headers: ${errors} layering error(s)")
endif()
list(LENGTH nccl_roots nr)
list(LENGTH cu_files nc)
message(STATUS "kernel_headers: ${nr} files of the nccl path reach no onesided kernel header; "
               "${nc} kernel files include kernels/device.cuh")
