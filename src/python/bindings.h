#pragma once

#include <pybind11/pybind11.h>

// One binding file per part of the library; module.cpp calls each once.
namespace dlslime::py_bind {

void bind_core(pybind11::module_& m);        // Future, status codes, logging, exceptions
void bind_endpoint(pybind11::module_& m);    // Endpoint: the surface every transport shares
void bind_transports(pybind11::module_& m);  // available_transports(), make_endpoint()
void bind_gpu(pybind11::module_& m);         // _gpu: device buffers, GpuUnavailableError (dlslime.testing)
#ifdef DLSLIME_WITH_TCP
void bind_tcp(pybind11::module_& m);  // TcpEndpoint (derives from Endpoint)
#endif
#ifdef DLSLIME_WITH_RDMA
void bind_rdma(pybind11::module_& m);  // RDMAEndpoint (derives from Endpoint), available_nic()
#endif
#ifdef DLSLIME_WITH_NVLINK
void bind_nvlink(pybind11::module_& m);  // NVLinkEndpoint (derives from Endpoint)
#endif
#ifdef DLSLIME_WITH_ASCEND
void bind_ascend(pybind11::module_& m);  // AscendDirectEndpoint (derives from Endpoint), _npu
#endif
#ifdef DLSLIME_WITH_NANOCTRL
void bind_nanoctrl(pybind11::module_& m);  // NanoCtrl server (embedded) and client
void bind_agent(pybind11::module_& m);     // PeerAgent, PeerConnection
#endif

}  // namespace dlslime::py_bind
