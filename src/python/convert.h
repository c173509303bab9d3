#pragma once

#include <vector>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

#include "dlslime/endpoint.h"
#include "dlslime/tcp_endpoint.h"

// Conversions shared by the binding files.
namespace dlslime::py_bind {

// dict/list/str/int/float/bool/None <-> nlohmann::json, for endpoint_info and mr_info
// (bind_core.cpp).
nlohmann::json to_json(pybind11::handle obj);
pybind11::object from_json(const nlohmann::json& j);

// (local_handle, remote_handle, target_offset, source_offset, length), one or a list;
// (addr, offset, length). Wrong shapes raise TypeError, negative numbers ValueError
// (bind_tcp.cpp).
std::vector<Assignment> to_assignments(pybind11::handle obj);
Chunk to_chunk(pybind11::handle obj);
// TcpOptions from the environment, then keyword arguments; an unknown keyword raises
// TypeError. `consumed` keywords are skipped (the caller handles them).
TcpOptions tcp_options_from_kwargs(const pybind11::kwargs& kwargs, const std::vector<std::string>& consumed = {});

}  // namespace dlslime::py_bind
