# Finds the libtorch inside the venv's PyTorch wheel (SLUICE_PYTHON's `torch` package) and defines
# sluice::torch_cpu: libtorch_cpu + libc10 with their headers, all a CPU build of Sluice links.
#
# The wheel on PyPI is a CUDA build. find_package(Torch) on it needs the CUDA toolkit and cuDNN at
# configure time and hands out TORCH_LIBRARIES with libtorch_cuda, which would load cuBLAS, cuDNN
# and NCCL into a CPU server; so the CPU build names the two libraries it uses instead.
# Sets: SLUICE_TORCH_DIR (site-packages/torch), SLUICE_TORCH_VERSION, SLUICE_TORCH_CUDA_VERSION
# ("" for a CPU-only wheel), SLUICE_TORCH_HAS_CUDA, SLUICE_TORCH_CMAKE_PREFIX (for
# find_package(Torch) in a CUDA build).

execute_process(
  COMMAND ${SLUICE_PYTHON} -c
    "import os, torch, torch.utils; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(torch.version.cuda or ''); print(int(torch.compiled_with_cxx11_abi())); print(torch.utils.cmake_prefix_path)"
  OUTPUT_VARIABLE _sluice_torch_out
  ERROR_VARIABLE _sluice_torch_err
  RESULT_VARIABLE _sluice_torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _sluice_torch_rc EQUAL 0)
  message(FATAL_ERROR "Sluice needs PyTorch in ${SLUICE_PYTHON} (run scripts/install-deps.sh, "
                      "which makes .venv from requirements.txt): ${_sluice_torch_err}")
endif()
string(REPLACE "\n" ";" _sluice_torch_out "${_sluice_torch_out}")
list(GET _sluice_torch_out 0 SLUICE_TORCH_DIR)
list(GET _sluice_torch_out 1 SLUICE_TORCH_VERSION)
list(GET _sluice_torch_out 2 SLUICE_TORCH_CUDA_VERSION)
list(GET _sluice_torch_out 3 _sluice_torch_abi)
list(GET _sluice_torch_out 4 SLUICE_TORCH_CMAKE_PREFIX)

if(NOT EXISTS "${SLUICE_TORCH_CMAKE_PREFIX}/Torch/TorchConfig.cmake"
   OR NOT EXISTS "${SLUICE_TORCH_DIR}/include/torch/script.h")
  message(FATAL_ERROR "${SLUICE_TORCH_DIR} holds no libtorch headers or CMake files")
endif()
# Debian's Boost, yaml-cpp and spdlog use the C++11 ABI of std::string; a libtorch built with the
# old one could not share a std::string with them.
if(NOT _sluice_torch_abi EQUAL 1)
  message(FATAL_ERROR "libtorch ${SLUICE_TORCH_VERSION} uses the pre-C++11 std::string ABI")
endif()

set(SLUICE_TORCH_HAS_CUDA OFF)
if(EXISTS "${SLUICE_TORCH_DIR}/lib/libtorch_cuda.so")
  set(SLUICE_TORCH_HAS_CUDA ON)
endif()

foreach(lib torch_cpu c10)
  add_library(sluice::${lib} SHARED IMPORTED)
  set_target_properties(sluice::${lib} PROPERTIES
    IMPORTED_LOCATION "${SLUICE_TORCH_DIR}/lib/lib${lib}.so")
endforeach()
# torch/include also carries libtorch's private copy of fmt (v12), which would shadow Debian's fmt
# (9, the one spdlog is built with) for every file that includes both. The build sees libtorch's
# headers through a folder of links to everything in torch/include but fmt.
set(_sluice_torch_include "${CMAKE_BINARY_DIR}/torch-include")
file(REMOVE_RECURSE "${_sluice_torch_include}")
file(MAKE_DIRECTORY "${_sluice_torch_include}")
file(GLOB _sluice_torch_entries RELATIVE "${SLUICE_TORCH_DIR}/include" "${SLUICE_TORCH_DIR}/include/*")
foreach(entry ${_sluice_torch_entries})
  if(NOT entry STREQUAL "fmt")
    file(CREATE_LINK "${SLUICE_TORCH_DIR}/include/${entry}" "${_sluice_torch_include}/${entry}"
         SYMBOLIC)
  endif()
endforeach()

add_library(sluice_torch_cpu INTERFACE)
add_library(sluice::torch ALIAS sluice_torch_cpu)
target_link_libraries(sluice_torch_cpu INTERFACE sluice::torch_cpu sluice::c10)
# SYSTEM: libtorch's headers are not ours to warn about.
target_include_directories(sluice_torch_cpu SYSTEM INTERFACE
  "${_sluice_torch_include}" "${SLUICE_TORCH_DIR}/include/torch/csrc/api/include")
target_compile_definitions(sluice_torch_cpu INTERFACE _GLIBCXX_USE_CXX11_ABI=1)

if(SLUICE_TORCH_HAS_CUDA)
  message(STATUS "libtorch ${SLUICE_TORCH_VERSION} (a CUDA ${SLUICE_TORCH_CUDA_VERSION} build) in "
                 "${SLUICE_TORCH_DIR}; the CPU build links libtorch_cpu and libc10 only")
else()
  message(STATUS "libtorch ${SLUICE_TORCH_VERSION} (CPU only) in ${SLUICE_TORCH_DIR}")
endif()

# sluice::torch_openmp: for code that calls at::parallel_for, a header template that runs
# serially unless its caller is compiled with OpenMP. It links the OpenMP runtime libtorch itself
# loads (the wheel's own libgomp.so.1), so one runtime and one thread pool serve both.
add_library(sluice_torch_openmp INTERFACE)
add_library(sluice::torch_openmp ALIAS sluice_torch_openmp)
target_compile_options(sluice_torch_openmp INTERFACE -fopenmp)
if(EXISTS "${SLUICE_TORCH_DIR}/lib/libgomp.so.1")
  target_link_libraries(sluice_torch_openmp INTERFACE "${SLUICE_TORCH_DIR}/lib/libgomp.so.1")
else()
  find_package(OpenMP REQUIRED COMPONENTS CXX)
  target_link_libraries(sluice_torch_openmp INTERFACE OpenMP::OpenMP_CXX)
endif()
