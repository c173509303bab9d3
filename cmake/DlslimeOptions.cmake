# Build options. Each may also come from the environment (DLSLIME_<OPTION> or the bare
# option name), so `BUILD_TESTS=OFF pip install .` works without -C flags.
function(dlslime_option name doc default)
  set(value ${default})
  if(DEFINED ENV{DLSLIME_${name}})
    set(value $ENV{DLSLIME_${name}})
  elseif(DEFINED ENV{${name}})
    set(value $ENV{${name}})
  endif()
  option(${name} "${doc}" ${value})
endfunction()

dlslime_option(BUILD_TCP "Build the TCP transport (asio)" ON)
dlslime_option(BUILD_PYTHON "Build the pybind11 module" ON)
# pip install builds only the library and the module unless asked otherwise.
if(SKBUILD)
  dlslime_option(BUILD_TESTS "Build the GoogleTest suite" OFF)
else()
  dlslime_option(BUILD_TESTS "Build the GoogleTest suite" ON)
endif()
dlslime_option(BUILD_NANOCTRL "Build the NanoCtrl control plane and PeerAgent" ON)
# libFuzzer targets (needs clang: CXX=clang++).
dlslime_option(BUILD_FUZZERS "Build the libFuzzer targets (tests/fuzz)" OFF)
# The hardware transports (src/CMakeLists.txt lists every transport; one not built is
# reported by available_transports() with the option that builds it).
# RDMA is on wherever the libibverbs headers (rdma-core's libibverbs-dev) are installed:
# the library itself is loaded at run time, and the simulated device (DLSLIME_RDMA_SIM=1)
# runs every RDMA path on hosts without a NIC.
find_path(IBVERBS_INCLUDE_DIR infiniband/verbs.h)
if(IBVERBS_INCLUDE_DIR)
  set(_dlslime_rdma_default ON)
else()
  set(_dlslime_rdma_default OFF)
endif()
dlslime_option(BUILD_RDMA "Build the RDMA transport (libibverbs; default: on when it is found)" ${_dlslime_rdma_default})
# The CUDA runtime behind the device-memory seam (src/gpu): on wherever the CUDA toolkit's
# headers are found. Only the headers are needed at build time: libcudart is loaded at run
# time, so the library still imports on hosts without a GPU or driver (docs/nvlink.md).
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  set(_dlslime_cuda_default ON)
else()
  set(_dlslime_cuda_default OFF)
endif()
dlslime_option(BUILD_CUDA "Build the CUDA runtime for GPU memory (default: on when the CUDA toolkit is found)" ${_dlslime_cuda_default})
# NVLink needs only the seam (src/gpu), so it is on wherever the CUDA runtime is built.
dlslime_option(BUILD_NVLINK "Build the NVLink transport (CUDA IPC; default: on with BUILD_CUDA)" ${BUILD_CUDA})
dlslime_option(BUILD_ASCEND "Build the Ascend direct transport and its simulated HIXL" ON)


if(NOT BUILD_TCP)
  message(WARNING "BUILD_TCP=OFF: libdlslime will have no transport at all")
endif()
