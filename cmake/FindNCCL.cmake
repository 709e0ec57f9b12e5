# Finds NCCL and defines NCCL::nccl (shared library).
# Search order: DPS_NCCL_ROOT / NCCL_ROOT / $NCCL_HOME, the pip package
# nvidia-nccl (python3 -c 'import nvidia.nccl'), the CUDA toolkit, the system.
set(_nccl_hints)
foreach(v DPS_NCCL_ROOT NCCL_ROOT)
  if(${v})
    list(APPEND _nccl_hints ${${v}})
  endif()
endforeach()
if(DEFINED ENV{NCCL_HOME})
  list(APPEND _nccl_hints $ENV{NCCL_HOME})
endif()
if(NOT _nccl_hints AND DPS_NCCL_FROM_PIP)
  # The Python that builds (scikit-build-core and FindPython set these; in an
  # isolated pip build only that one sees the build requirements).
  if(Python3_EXECUTABLE)
    set(_dps_python ${Python3_EXECUTABLE})
  elseif(Python_EXECUTABLE)
    set(_dps_python ${Python_EXECUTABLE})
  else()
    find_program(_dps_python NAMES python3 python)
  endif()
  if(_dps_python)
    execute_process(COMMAND ${_dps_python} -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])"
      OUTPUT_VARIABLE _pip_nccl OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
    if(_rc EQUAL 0 AND _pip_nccl)
      list(APPEND _nccl_hints ${_pip_nccl})
    endif()
  endif()
endif()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()

# Header and library must come from the same place: look in the hints first
# (every name per directory: pip's package has only libnccl.so.2), then the
# toolkit and the system.
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_nccl_hints}
  PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64)
if(NCCL_INCLUDE_DIR AND EXISTS ${NCCL_INCLUDE_DIR}/nccl.h)
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _v REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*NCCL_MAJOR +([0-9]+).*" "\\1" _ma "${_v}")
  string(REGEX REPLACE ".*NCCL_MINOR +([0-9]+).*" "\\1" _mi "${_v}")
  string(REGEX REPLACE ".*NCCL_PATCH +([0-9]+).*" "\\1" _pa "${_v}")
  set(NCCL_VERSION "${_ma}.${_mi}.${_pa}")
endif()
include(FindPackageHandleStandardArgs)
# NAME_MISMATCHED: this file is also included by the installed
# dpsamplingConfig.cmake, i.e. from find_package(dpsampling).
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_INCLUDE_DIR NCCL_LIBRARY
  VERSION_VAR NCCL_VERSION NAME_MISMATCHED)
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION ${NCCL_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
  if(NCCL_VERSION VERSION_LESS 2.28)
    message(FATAL_ERROR "dpsampling needs NCCL >= 2.28 (symmetric memory device API); found ${NCCL_VERSION} at ${NCCL_INCLUDE_DIR}")
  endif()
  message(STATUS "NCCL ${NCCL_VERSION}: ${NCCL_INCLUDE_DIR} ${NCCL_LIBRARY}")
endif()
