# Finds LibTorch: Debian's libtorch-dev (1.13, CPU), a downloaded LibTorch
# zip, or a pip-installed torch (docs/gpu.md), and sets what depends on it:
#   DDP_TORCH_CUDA         LibTorch itself has CUDA (its torch_cuda library),
#                          whether or not this machine has a GPU
#   DDP_NCCL_INCLUDE_DIR   where nccl.h is, for c10d's ProcessGroupNCCL.hpp
#   CMAKE_CXX_STANDARD     17, or 20 where the LibTorch needs it (2.14 on)
#
# Which LibTorch: Torch_ROOT, Torch_DIR or CMAKE_PREFIX_PATH (a wheel's
# torch.utils.cmake_prefix_path), else the system's. TorchConfig finds c10
# and kineto with find_library(... PATHS <its prefix>/lib), which searches
# /usr/lib first: with Debian's libtorch-dev installed, a wheel's 2.x headers
# would link Debian's 1.13 libc10 (a mixed build that crashes at run time).
# Searching the chosen LibTorch's own prefix first (Torch_ROOT, which CMake
# searches in the package's own find_library calls) prevents it; the check
# below refuses any mix that remains.

if(NOT Torch_ROOT)
  set(_ddp_torch_configs)
  if(Torch_DIR)
    list(APPEND _ddp_torch_configs "${Torch_DIR}")
  endif()
  foreach(_p IN LISTS CMAKE_PREFIX_PATH)
    list(APPEND _ddp_torch_configs "${_p}/Torch" "${_p}/share/cmake/Torch")
  endforeach()
  foreach(_d IN LISTS _ddp_torch_configs)
    if(EXISTS "${_d}/TorchConfig.cmake")
      get_filename_component(Torch_ROOT "${_d}/../../.." ABSOLUTE)  # <prefix>/share/cmake/Torch
      break()
    endif()
  endforeach()
endif()

find_package(Torch REQUIRED)

foreach(_lib IN LISTS TORCH_LIBRARIES TORCH_LIBRARY c10_LIBRARY C10_CUDA_LIBRARY)
  if(IS_ABSOLUTE "${_lib}" AND _lib MATCHES "/lib(torch|torch_cpu|torch_cuda|c10|c10_cuda|kineto)\\.so")
    string(FIND "${_lib}" "${TORCH_INSTALL_PREFIX}/" _at)
    if(NOT _at EQUAL 0)
      message(FATAL_ERROR "libddp: LibTorch at ${TORCH_INSTALL_PREFIX} (version ${Torch_VERSION}), but ${_lib} "
        "comes from another LibTorch: a mixed build. Configure with -DTorch_ROOT=${TORCH_INSTALL_PREFIX} "
        "(a pip wheel: the torch package folder) in a fresh build folder.")
    endif()
  endif()
endforeach()

# Installed programs find a LibTorch outside the system's library folders (a
# pip wheel's torch/lib, a zip's lib) where they were linked against it.
get_filename_component(_ddp_torch_libdir "${TORCH_LIBRARY}" DIRECTORY)
if(_ddp_torch_libdir AND NOT _ddp_torch_libdir MATCHES "^/(usr/)?lib")
  list(APPEND CMAKE_INSTALL_RPATH "${_ddp_torch_libdir}")
endif()

# LibTorch 2.14 and later refuse C++17 (#error C++20 or later compatible
# compiler is required).
set(DDP_TORCH_VERSION "${Torch_VERSION}")
if(NOT DDP_TORCH_VERSION)
  set(DDP_TORCH_VERSION 0)
endif()
if(DDP_TORCH_VERSION VERSION_GREATER_EQUAL 2.14)
  set(CMAKE_CXX_STANDARD 20)
endif()

# CUDA as LibTorch reports it: its torch_cuda library, not this machine's GPU.
set(DDP_TORCH_CUDA OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(DDP_TORCH_CUDA ON)
endif()

# nccl.h: a wheel carries the NCCL its c10d was built with (nvidia/nccl,
# beside torch/ in site-packages); else the CUDA toolkit's.
unset(DDP_NCCL_INCLUDE_DIR)  # find_path searches only for an unset variable
if(DDP_TORCH_CUDA)
  find_path(DDP_NCCL_INCLUDE_DIR nccl.h
    HINTS "${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include" ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include
    NO_CACHE)
  if(NOT DDP_NCCL_INCLUDE_DIR)
    message(FATAL_ERROR "libddp: LibTorch ${DDP_TORCH_VERSION} has CUDA, but no nccl.h was found (the wheel's "
      "nvidia/nccl/include or the CUDA toolkit's include/); install NCCL's headers (nvidia-nccl-cu13 or libnccl-dev)")
  endif()
endif()
message(STATUS "libddp: LibTorch ${DDP_TORCH_VERSION} at ${TORCH_INSTALL_PREFIX}, C++${CMAKE_CXX_STANDARD}, "
  "CUDA ${DDP_TORCH_CUDA} ${DDP_NCCL_INCLUDE_DIR}")

# A PyPI wheel's libtorch.so exports a copy of std::filesystem of its own
# (linked in statically where it was built). A program whose first needed
# library is libtorch binds its std::filesystem calls to that copy, which
# crashes with this system's libstdc++ (remove_all jumps to a null pointer).
# Naming libstdc++ first makes the system's copy the one every call finds.
# Applied to 2.x only: Debian's 1.13 exports none.
set(DDP_STDCXX_FIRST_LINK_OPTION "")
if(DDP_TORCH_VERSION VERSION_GREATER_EQUAL 2)
  set(DDP_STDCXX_FIRST_LINK_OPTION "LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state")
endif()
