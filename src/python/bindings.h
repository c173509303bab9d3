#pragma once

#include <pybind11/pybind11.h>

// One binding file per part of the library; module.cpp calls each once.
namespace dlslime::py_bind {

void bind_core(pybind11::module_& m);  // Future, status codes, logging, exceptions
void bind_tcp(pybind11::module_& m);   // TcpEndpoint
void bind_nanoctrl(pybind11::module_& m);  // NanoCtrl server (embedded) and client
void bind_agent(pybind11::module_& m);     // PeerAgent, PeerConnection

}  // namespace dlslime::py_bind
