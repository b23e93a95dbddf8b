# libsluice_cuda.so: the GPU backend (src/backends/cuda/) and the copy pipeline it drives, linked
# against libtorch_cuda, libc10_cuda and the CUDA runtime of the venv's PyTorch wheel. Sluice's
# own symbols stay undefined here and resolve against the sluice binary at dlopen.
# Needs: SLUICE_TORCH_DIR (cmake/SluiceTorch.cmake).

get_filename_component(_sluice_site "${SLUICE_TORCH_DIR}" DIRECTORY)
find_path(SLUICE_CUDA_RUNTIME_INCLUDE cuda_runtime_api.h
  HINTS "${_sluice_site}/nvidia/cu13/include" "${_sluice_site}/nvidia/cuda_runtime/include"
        /usr/local/cuda/include /usr/local/cuda-13.0/include
  NO_DEFAULT_PATH)
find_library(SLUICE_CUDART NAMES cudart libcudart.so.13
  HINTS "${_sluice_site}/nvidia/cu13/lib" "${_sluice_site}/nvidia/cuda_runtime/lib"
        /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64
  NO_DEFAULT_PATH)
if(NOT SLUICE_CUDA_RUNTIME_INCLUDE OR NOT SLUICE_CUDART)
  message(WARNING "No CUDA runtime headers or library next to ${SLUICE_TORCH_DIR}: the CUDA "
                  "library (GPU models) is not built")
  return()
endif()

# Every include folder the nvidia wheels ship (cuBLAS, cuDNN, ... headers that ATen's CUDA headers
# may include).
file(GLOB _sluice_nvidia_includes LIST_DIRECTORIES true "${_sluice_site}/nvidia/*/include")

add_library(sluice_cuda SHARED
  src/backends/cuda/cuda_backend.cc
  src/backends/cuda/cuda_device.cc
  src/backends/cuda/step_graphs.cc
  src/device/copy_pipeline.cc)
target_include_directories(sluice_cuda PRIVATE include src)
target_include_directories(sluice_cuda SYSTEM PRIVATE
  "${_sluice_torch_include}" "${SLUICE_TORCH_DIR}/include/torch/csrc/api/include"
  ${SLUICE_CUDA_RUNTIME_INCLUDE} ${_sluice_nvidia_includes})
target_compile_definitions(sluice_cuda PRIVATE _GLIBCXX_USE_CXX11_ABI=1 USE_CUDA)
foreach(lib torch_cuda c10_cuda)
  target_link_libraries(sluice_cuda PRIVATE "${SLUICE_TORCH_DIR}/lib/lib${lib}.so")
endforeach()
target_link_libraries(sluice_cuda PRIVATE sluice::torch_cpu sluice::c10 ${SLUICE_CUDART}
                      fmt::fmt)
# Only the entry point is exported; libtorch's symbols and ours stay inside.
set_target_properties(sluice_cuda PROPERTIES
  CXX_VISIBILITY_PRESET hidden
  LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}"
  # libtorch_cuda must come first in the link, or the linker drops it as unneeded.
  LINK_WHAT_YOU_USE OFF)
target_link_options(sluice_cuda PRIVATE -Wl,--no-as-needed)
message(STATUS "CUDA library: libsluice_cuda.so (CUDA runtime headers in "
               "${SLUICE_CUDA_RUNTIME_INCLUDE})")
