#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

#include "dlslime/endpoint.h"
#ifdef DLSLIME_WITH_TCP
#include "dlslime/tcp_endpoint.h"
#endif

// Every conversion of a Python argument the bindings make, in one place (convert.cpp), so
// that each bad argument raises the documented exception and names itself: a wrong type
// raises TypeError, a value out of range ValueError (docs/api.md, "Arguments"). Binding
// functions take py::handle and call these rather than letting pybind11 cast, whose
// failures inside a function are RuntimeError("Unable to cast ...").
namespace dlslime {
class MemoryRegistry;  // core/memory_registry.h
}

namespace dlslime::py_bind {

// --- JSON: dict/list/tuple/str/bytes/int/float/bool/None <-> nlohmann::json -------------
// Deepest nesting converted in either direction, the limit NanoCtrl's server applies to
// request bodies (src/nanoctrl/request.cpp). Both conversions recurse, so an unbounded
// depth (a self-referencing dict, a 200,000-deep reply) would overflow the C stack; deeper
// values raise ValueError naming the limit. Real endpoint_info/mr_info nest 3 levels.
constexpr int kMaxJsonDepth = 64;

// `what` names the argument in errors ("peer_info", "mr_info"); the message adds the path
// inside it (peer_info["mr_info"]["kv"]["length"]).
nlohmann::json to_json(pybind11::handle obj, const char* what);
// `what` names the value in errors ("NanoCtrl's reply", "peer_endpoint_info").
pybind11::object from_json(const nlohmann::json& j, const char* what = "a JSON value");

// --- Scalars --------------------------------------------------------------------------
namespace detail {
// operator.index(v): an int or an object with __index__ (numpy integers); a bool, float
// or str raises TypeError naming `what`.
pybind11::int_ index_of(pybind11::handle v, const char* what);
bool is_negative(const pybind11::int_& i);
[[noreturn]] void throw_out_of_range(pybind11::handle v, const char* what, const std::string& lo,
                                     const std::string& hi);
}  // namespace detail

// An integer argument in [lo, hi] (default: the range of T).
template <class T>
T int_arg(pybind11::handle v, const char* what, T lo = std::numeric_limits<T>::min(),
          T hi = std::numeric_limits<T>::max()) {
  static_assert(std::is_integral_v<T> && sizeof(T) <= 8);
  const pybind11::int_ i = detail::index_of(v, what);
  if constexpr (std::is_signed_v<T>) {
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (overflow == 0 && x >= lo && x <= hi) return static_cast<T>(x);
  } else if (!detail::is_negative(i)) {
    const unsigned long long x = PyLong_AsUnsignedLongLong(i.ptr());
    if (x == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      PyErr_Clear();  // above 2**64-1: reported as out of range below
    } else if (x >= lo && x <= hi) {
      return static_cast<T>(x);
    }
  }
  detail::throw_out_of_range(v, what, fmt::to_string(lo), fmt::to_string(hi));
}

bool bool_arg(pybind11::handle v, const char* what);  // True/False only
// An op's deadline argument: upstream's timeout_ms (an int of milliseconds). None or 0: the
// endpoint's op_timeout, for recv and imm_recv its recv_timeout (OpRequest::timeout).
std::chrono::milliseconds op_timeout_arg(pybind11::handle timeout_ms);
// An op's `stream` (upstream's CUDA stream): None, a stream handle (an int, e.g.
// torch.cuda.current_stream().cuda_stream) or an object with .cuda_stream (a torch
// Stream); anything else is a TypeError. No transport orders its ops on it yet.
void check_stream_arg(pybind11::handle stream);
std::string str_arg(pybind11::handle v, const char* what);
// A notification (notify=, send_notify): bytes, bytearray or memoryview (a str is a
// TypeError: encode it); its size is checked by the endpoint (at most 4 KiB: ValueError).
// None -> nullopt where `optional`.
std::optional<std::string> notification_arg(pybind11::handle v, const char* what, bool optional);
// None -> "" (the caller's default).
std::string optional_str_arg(pybind11::handle v, const char* what);
// A list or tuple of str.
std::vector<std::string> str_list_arg(pybind11::handle v, const char* what);

// --- Arguments upstream DLSlime names differently --------------------------------------
// Upstream DLSlime (0.1.23) names some arguments differently (data_ptr for addr, assign for
// assignments, remote_info for peer_info, timeout_seconds for seconds). The bindings
// accept both names: the argument keeps our name (positional or keyword) and its default
// is missing_arg(); upstream's name is an extra keyword-only argument with the same
// default. renamed_arg() returns whichever was passed: both or neither is a TypeError
// naming the call. None stays an ordinary value (wait_for(None) means "no limit").
pybind11::handle missing_arg();
bool is_missing(pybind11::handle v);
pybind11::handle renamed_arg(pybind11::handle ours, pybind11::handle upstream, const char* call, const char* name,
                             const char* upstream_name);
// py::arg_v(name, missing_arg(), "<required>") for the argument under our name, and
// py::arg_v(upstream_name, missing_arg(), "<unset>") for upstream's.

// --- Durations in seconds --------------------------------------------------------------
// The one conversion of every timeout and interval that comes from Python: an int or a
// float (anything with __float__ but str/bytes) of seconds. NaN and negative values raise
// ValueError, other types TypeError. inf and anything above kMaxSeconds saturate to
// kMaxSeconds, about 31.7 years: "wait forever" in practice, and small enough that the
// C++ side can add it to steady_clock::now() in nanoseconds without overflowing (a
// direct cast of inf or of 1e10 s to nanoseconds overflows to a deadline in the past).
constexpr double kMaxSeconds = 1e9;
std::chrono::nanoseconds seconds_arg(pybind11::handle v, const char* what);
// The same, rounded to the nearest millisecond, for options the library keeps in ms.
std::chrono::milliseconds millis_arg(pybind11::handle v, const char* what);
// The same for a deadline that must be positive (PeerAgent's ctrl_timeout): 0 also raises
// ValueError, and a positive value under half a millisecond is 1 ms, never 0.
std::chrono::milliseconds positive_millis_arg(pybind11::handle v, const char* what);

// --- Transfers --------------------------------------------------------------------------
// (local_handle, remote_handle, target_offset, source_offset, length), one or a list;
// (addr, offset, length). Wrong shapes raise TypeError, numbers out of range ValueError.
std::vector<Assignment> to_assignments(pybind11::handle obj);
// NVLink's and Ascend's batches: items in handle form as to_assignments takes them, or
// upstream's named items (local_name, remote_name, target_offset, source_offset, length),
// looked up first (NotFoundError for a name no region has).
using RegionLookup = std::function<std::optional<int32_t>(const std::string&)>;
std::vector<Assignment> named_assignments(pybind11::handle obj, const RegionLookup& local, const RegionLookup& remote);
Chunk to_chunk(pybind11::handle obj);
// --- Memory pools ----------------------------------------------------------------------
// dlslime.MemoryPool (upstream's TcpMemoryPool; RDMAMemoryPool derives from it) is a view of
// one MemoryRegistry, the table of named regions that every endpoint built on the pool
// (TcpEndpoint(pool=...), RDMAEndpoint(pool=...)) registers into and resolves from: a
// region registered in the pool or on any of those endpoints has one handle on all of
// them, as for a PeerAgent's endpoints. Peers' entries recorded in the pool
// (register_remote_memory_region) are records only: each endpoint makes its own remote
// handles. Polymorphic, so a pool returned to Python is its most derived class.
class MemoryPoolView {
 public:
  MemoryPoolView();
  virtual ~MemoryPoolView();
  MemoryPoolView(const MemoryPoolView&) = delete;
  MemoryPoolView& operator=(const MemoryPoolView&) = delete;

  const std::shared_ptr<MemoryRegistry>& registry() const noexcept { return registry_; }
  // Records a peer's mr_info entry under `name`; the same name with the same entry keeps
  // its handle, another entry gets a new one.
  int32_t record_remote(const std::string& name, const nlohmann::json& entry);
  nlohmann::json remote_mr_info() const;  // {name: entry}

 private:
  const std::shared_ptr<MemoryRegistry> registry_;
  mutable std::mutex mu_;
  std::map<std::string, std::pair<nlohmann::json, int32_t>> remote_;
  int32_t next_remote_ = 0;
};

// A pool argument (TypeError naming `what` for anything but a dlslime.MemoryPool).
std::shared_ptr<MemoryPoolView> pool_arg(pybind11::handle v, const char* what);
// An endpoint of `transport` (the transport registry's factory, with its options as JSON)
// over `pool`'s registry, made with the GIL released. The holder keeps the pool alive as
// long as the endpoint and destroys the endpoint without the GIL; pool_of() returns it.
std::shared_ptr<Endpoint> make_endpoint_on_pool(const std::string& transport, const nlohmann::json& options,
                                                std::shared_ptr<MemoryPoolView> pool);
// The pool an endpoint was built on by make_endpoint_on_pool; nullptr for any other.
std::shared_ptr<MemoryPoolView> pool_of(const std::shared_ptr<Endpoint>& endpoint);

#ifdef DLSLIME_WITH_TCP
// TcpEndpoint's keyword arguments as TcpOptions JSON keys (what TcpOptions::from_json and
// the tcp transport's factory take), types checked; `consumed` keywords are skipped.
nlohmann::json tcp_options_json_from_kwargs(const pybind11::kwargs& kwargs,
                                            const std::vector<std::string>& consumed = {});
// TcpOptions from the environment, then TcpEndpoint's keyword arguments (DLSlime's names,
// durations in seconds), parsed by TcpOptions::from_json. An unknown keyword or a wrong
// type raises TypeError, a bad value ValueError. `consumed` keywords are skipped (the
// caller handles them).
TcpOptions tcp_options_from_kwargs(const pybind11::kwargs& kwargs, const std::vector<std::string>& consumed = {});
#endif

}  // namespace dlslime::py_bind
