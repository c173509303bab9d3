#pragma once

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

// dict/list/str/int/float/bool/None <-> nlohmann::json, for endpoint_info and mr_info.
namespace dlslime::py_bind {

nlohmann::json to_json(pybind11::handle obj);
pybind11::object from_json(const nlohmann::json& j);

}  // namespace dlslime::py_bind
