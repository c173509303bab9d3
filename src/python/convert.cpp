// Conversions of Python arguments (see convert.h): one place decides which exception a bad
// argument raises and how its message names it.
#include "convert.h"

#include <algorithm>
#include <cmath>

#include "core/memory_registry.h"
#include "core/transport_registry.h"
#include "dlslime/errors.h"
#include "gil.h"

namespace py = pybind11;
using nlohmann::json;

namespace dlslime::py_bind {

namespace detail {

py::int_ index_of(py::handle v, const char* what) {
  // bool is an int subclass, so operator.index(True) is 1: a handle or an address passed
  // as True is a caller's mistake (hostile review 16h), never the number 1.
  if (PyBool_Check(v.ptr())) throw py::type_error(fmt::format("{} must be an int, not bool", what));
  PyObject* i = PyNumber_Index(v.ptr());
  if (i == nullptr) {
    PyErr_Clear();
    throw py::type_error(fmt::format("{} must be an int, not {}", what, Py_TYPE(v.ptr())->tp_name));
  }
  return py::reinterpret_steal<py::int_>(i);
}

bool is_negative(const py::int_& i) { return i < py::int_(0); }

void throw_out_of_range(py::handle v, const char* what, const std::string& lo, const std::string& hi) {
  throw py::value_error(fmt::format("{}={} is out of range ({}..{})", what, py::str(v).cast<std::string>(), lo, hi));
}

}  // namespace detail

py::handle missing_arg() {
  // One unique object for the process, never freed (it may be a default of bound
  // functions until the interpreter is gone).
  static PyObject* const sentinel = PyObject_CallNoArgs(reinterpret_cast<PyObject*>(&PyBaseObject_Type));
  return sentinel;
}

bool is_missing(py::handle v) { return v.ptr() == missing_arg().ptr(); }

py::handle renamed_arg(py::handle ours, py::handle upstream, const char* call, const char* name,
                       const char* upstream_name) {
  if (is_missing(ours) && is_missing(upstream)) {
    throw py::type_error(fmt::format("{}() missing required argument '{}' (or '{}')", call, name, upstream_name));
  }
  if (!is_missing(ours) && !is_missing(upstream)) {
    throw py::type_error(
        fmt::format("{}() got both '{}' and '{}' (two names of one argument)", call, name, upstream_name));
  }
  return is_missing(ours) ? upstream : ours;
}

namespace {

const char* type_name(py::handle v) { return Py_TYPE(v.ptr())->tp_name; }

// Python -> JSON. `path_` names the value being converted (peer_info["mr_info"][0]); it
// grows and shrinks with the recursion, so errors can say where the bad value sits.
class ToJson {
 public:
  explicit ToJson(const char* what) : root_(what), path_(what) {}

  json convert(py::handle obj, int depth) {
    if (obj.is_none()) return nullptr;
    if (PyBool_Check(obj.ptr())) return obj.ptr() == Py_True;
    if (PyLong_Check(obj.ptr())) return integer(obj);
    if (PyFloat_Check(obj.ptr())) return PyFloat_AS_DOUBLE(obj.ptr());
    if (PyUnicode_Check(obj.ptr())) return obj.cast<std::string>();
    if (PyBytes_Check(obj.ptr())) return obj.cast<std::string>();
    const bool is_dict = PyDict_Check(obj.ptr());
    if (!is_dict && !PyList_Check(obj.ptr()) && !PyTuple_Check(obj.ptr())) {
      throw py::type_error(fmt::format("{}: cannot convert {} to JSON", path_, type_name(obj)));
    }
    if (depth >= kMaxJsonDepth) {
      throw py::value_error(fmt::format("{} is nested deeper than {} levels (a container that contains itself?)",
                                        root_, kMaxJsonDepth));
    }
    const size_t mark = path_.size();
    if (is_dict) {
      json out = json::object();
      for (auto item : py::reinterpret_borrow<py::dict>(obj)) {
        if (!PyUnicode_Check(item.first.ptr())) {
          throw py::type_error(fmt::format("{}: dict keys must be str, not {}", path_, type_name(item.first)));
        }
        auto key = item.first.cast<std::string>();
        path_ += fmt::format("[\"{}\"]", key);
        out[std::move(key)] = convert(item.second, depth + 1);
        path_.resize(mark);
      }
      return out;
    }
    json out = json::array();
    size_t i = 0;
    for (auto item : obj) {
      path_ += fmt::format("[{}]", i++);
      out.push_back(convert(item, depth + 1));
      path_.resize(mark);
    }
    return out;
  }

 private:
  // Addresses and ids may exceed int64: non-negative ints become unsigned.
  json integer(py::handle obj) {
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
    if (overflow == 0) return x >= 0 ? json(static_cast<uint64_t>(x)) : json(static_cast<int64_t>(x));
    if (overflow > 0) {
      const unsigned long long u = PyLong_AsUnsignedLongLong(obj.ptr());
      if (!(u == static_cast<unsigned long long>(-1) && PyErr_Occurred())) return static_cast<uint64_t>(u);
      PyErr_Clear();
    }
    throw py::value_error(fmt::format("{}={} is out of range for JSON (-2**63..2**64-1)", path_,
                                      py::str(obj).cast<std::string>()));
  }

  const char* root_;
  std::string path_;
};

py::object from_json_at(const json& j, const char* what, int depth) {
  switch (j.type()) {
    case json::value_t::null: return py::none();
    case json::value_t::boolean: return py::bool_(j.get<bool>());
    case json::value_t::number_integer: return py::int_(j.get<int64_t>());
    case json::value_t::number_unsigned: return py::int_(j.get<uint64_t>());
    case json::value_t::number_float: return py::float_(j.get<double>());
    case json::value_t::string: return py::str(j.get_ref<const std::string&>());
    case json::value_t::array:
    case json::value_t::object: break;
    default: return py::none();
  }
  if (depth >= kMaxJsonDepth) {
    throw py::value_error(fmt::format("{} is nested deeper than {} levels", what, kMaxJsonDepth));
  }
  if (j.is_array()) {
    py::list out;
    for (const auto& v : j) out.append(from_json_at(v, what, depth + 1));
    return out;
  }
  py::dict out;
  for (const auto& [k, v] : j.items()) out[py::str(k)] = from_json_at(v, what, depth + 1);
  return out;
}

}  // namespace

json to_json(py::handle obj, const char* what) { return ToJson(what).convert(obj, 0); }

py::object from_json(const json& j, const char* what) { return from_json_at(j, what, 0); }

std::chrono::milliseconds op_timeout_arg(py::handle timeout_ms) {
  if (timeout_ms.is_none()) return std::chrono::milliseconds{0};
  return std::chrono::milliseconds{int_arg<uint32_t>(timeout_ms, "timeout_ms")};
}

void check_stream_arg(py::handle stream) {
  if (stream.is_none()) return;
  if (py::hasattr(stream, "cuda_stream")) {
    int_arg<uintptr_t>(py::getattr(stream, "cuda_stream"), "stream.cuda_stream");
    return;
  }
  if (PyBool_Check(stream.ptr()) || !PyIndex_Check(stream.ptr())) {
    throw py::type_error(fmt::format("stream must be None, a CUDA stream handle (int) or a stream object with "
                                     ".cuda_stream, not {}",
                                     Py_TYPE(stream.ptr())->tp_name));
  }
  int_arg<uintptr_t>(stream, "stream");
}

bool bool_arg(py::handle v, const char* what) {
  if (!PyBool_Check(v.ptr())) throw py::type_error(fmt::format("{} must be True or False, not {}", what, type_name(v)));
  return v.ptr() == Py_True;
}

std::string str_arg(py::handle v, const char* what) {
  if (!PyUnicode_Check(v.ptr())) throw py::type_error(fmt::format("{} must be a str, not {}", what, type_name(v)));
  return v.cast<std::string>();
}

std::optional<std::string> notification_arg(py::handle v, const char* what, bool optional) {
  if (optional && v.is_none()) return std::nullopt;
  if (PyBytes_Check(v.ptr())) return v.cast<std::string>();
  if (PyByteArray_Check(v.ptr()) || PyMemoryView_Check(v.ptr())) {
    PyObject* copy = PyBytes_FromObject(v.ptr());  // a non-contiguous view raises here
    if (!copy) throw py::error_already_set();
    return py::reinterpret_steal<py::bytes>(copy).cast<std::string>();
  }
  throw py::type_error(fmt::format("{} must be bytes, bytearray or memoryview{}, not {}", what,
                                   optional ? " (or None)" : "", type_name(v)));
}

std::string optional_str_arg(py::handle v, const char* what) {
  if (v.is_none()) return "";
  if (!PyUnicode_Check(v.ptr())) {
    throw py::type_error(fmt::format("{} must be a str or None, not {}", what, type_name(v)));
  }
  return v.cast<std::string>();
}

std::vector<std::string> str_list_arg(py::handle v, const char* what) {
  if (!PyList_Check(v.ptr()) && !PyTuple_Check(v.ptr())) {
    throw py::type_error(fmt::format("{} must be a list of str, not {}", what, type_name(v)));
  }
  std::vector<std::string> out;
  for (auto item : v) {
    if (!PyUnicode_Check(item.ptr())) {
      throw py::type_error(fmt::format("{} must be a list of str; it holds a {}", what, type_name(item)));
    }
    out.push_back(item.cast<std::string>());
  }
  return out;
}

namespace {

// `positive`: 0 is refused too, for a deadline where 0 would not mean "none" but fail at once.
double seconds_value(py::handle v, const char* what, bool positive = false) {
  const char* bound = positive ? "> 0" : ">= 0";
  if (PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()) || PyByteArray_Check(v.ptr()) || v.is_none()) {
    throw py::type_error(fmt::format("{} must be a number of seconds, not {}", what, type_name(v)));
  }
  const double s = PyFloat_AsDouble(v.ptr());
  if (s == -1.0 && PyErr_Occurred()) {
    // An int too large for a double (10**400) is a huge timeout, saturated below.
    const bool huge_int = PyErr_ExceptionMatches(PyExc_OverflowError) && PyLong_Check(v.ptr());
    PyErr_Clear();
    if (huge_int) {
      if (detail::is_negative(py::reinterpret_borrow<py::int_>(v))) {
        throw py::value_error(fmt::format("{}={} must be {} seconds", what, py::str(v).cast<std::string>(), bound));
      }
      return kMaxSeconds;
    }
    throw py::type_error(fmt::format("{} must be a number of seconds, not {}", what, type_name(v)));
  }
  if (std::isnan(s)) throw py::value_error(fmt::format("{} is NaN; give a number of seconds", what));
  if (s < 0 || (positive && s == 0)) throw py::value_error(fmt::format("{}={} must be {} seconds", what, s, bound));
  return std::min(s, kMaxSeconds);
}

}  // namespace

std::chrono::nanoseconds seconds_arg(py::handle v, const char* what) {
  return std::chrono::nanoseconds(std::llround(seconds_value(v, what) * 1e9));
}

std::chrono::milliseconds millis_arg(py::handle v, const char* what) {
  return std::chrono::milliseconds(std::llround(seconds_value(v, what) * 1e3));
}

std::chrono::milliseconds positive_millis_arg(py::handle v, const char* what) {
  const auto ms = std::chrono::milliseconds(std::llround(seconds_value(v, what, /*positive=*/true) * 1e3));
  return std::max(ms, std::chrono::milliseconds(1));
}

std::vector<Assignment> to_assignments(py::handle obj) {
  auto one = [](py::handle t) {
    if (!py::isinstance<py::tuple>(t) && !py::isinstance<py::list>(t)) {
      throw py::type_error(
          "an assignment is a tuple (local_handle, remote_handle, target_offset, source_offset, length)");
    }
    auto seq = py::reinterpret_borrow<py::sequence>(t);
    if (seq.size() != 5) {
      throw py::type_error(fmt::format(
          "an assignment has 5 fields (local_handle, remote_handle, target_offset, source_offset, length), got {}",
          seq.size()));
    }
    return Assignment{int_arg<int32_t>(seq[0], "local_handle"), int_arg<int32_t>(seq[1], "remote_handle"),
                      int_arg<uint64_t>(seq[2], "target_offset"), int_arg<uint64_t>(seq[3], "source_offset"),
                      int_arg<uint64_t>(seq[4], "length")};
  };
  std::vector<Assignment> out;
  if (py::isinstance<py::tuple>(obj) && py::len(obj) == 5 && PyLong_Check(obj.cast<py::tuple>()[0].ptr())) {
    out.push_back(one(obj));
    return out;
  }
  if (!py::isinstance<py::list>(obj) && !py::isinstance<py::tuple>(obj)) {
    throw py::type_error(fmt::format("assignments must be a list of 5-tuples, not {}", type_name(obj)));
  }
  out.reserve(py::len(obj));
  for (auto item : obj) out.push_back(one(item));
  return out;
}

Chunk to_chunk(py::handle obj) {
  if (!py::isinstance<py::tuple>(obj) && !py::isinstance<py::list>(obj)) {
    throw py::type_error(fmt::format("a chunk is a tuple (addr, offset, length), not {}", type_name(obj)));
  }
  auto seq = py::reinterpret_borrow<py::sequence>(obj);
  if (seq.size() != 3) {
    throw py::type_error(fmt::format("a chunk has 3 fields (addr, offset, length), got {}", seq.size()));
  }
  return Chunk{int_arg<uintptr_t>(seq[0], "addr"), int_arg<uint64_t>(seq[1], "offset"),
               int_arg<uint64_t>(seq[2], "length")};
}

#ifdef DLSLIME_WITH_TCP
namespace {

// How each TcpEndpoint keyword reaches TcpOptions::from_json, the one parser of TCP's
// options: Python takes durations in seconds where the JSON keys are milliseconds, and
// keeps DLSlime's shorter names. Here only the Python type is checked (TypeError naming
// the keyword); from_json checks each value against its field and range (ValueError).
enum class TcpKwarg { kInteger, kSeconds, kText, kToken, kBool };
struct TcpKwargKey {
  const char* python;
  const char* json;
  TcpKwarg kind;
};
constexpr TcpKwargKey kTcpKwargs[] = {
    {"lanes", "lanes", TcpKwarg::kInteger},
    {"chunk_size", "chunk_size", TcpKwarg::kInteger},
    {"connect_timeout", "connect_timeout_ms", TcpKwarg::kSeconds},
    {"timeout", "op_timeout_ms", TcpKwarg::kSeconds},
    {"op_timeout", "op_timeout_ms", TcpKwarg::kSeconds},
    {"recv_timeout", "recv_timeout_ms", TcpKwarg::kSeconds},
    {"sndbuf", "sndbuf", TcpKwarg::kInteger},
    {"rcvbuf", "rcvbuf", TcpKwarg::kInteger},
    {"advertise_host", "advertise_host", TcpKwarg::kText},
    {"advertise_interface", "advertise_interface", TcpKwarg::kText},
    {"port_range", "port_range", TcpKwarg::kText},
    {"keepalive_idle", "keepalive_idle_s", TcpKwarg::kInteger},
    {"keepalive_interval", "keepalive_interval_s", TcpKwarg::kInteger},
    {"keepalive_count", "keepalive_count", TcpKwarg::kInteger},
    {"max_inflight_ops", "max_inflight_ops", TcpKwarg::kInteger},
    {"max_batch_items", "max_batch_items", TcpKwarg::kInteger},
    {"unexpected_buffer_bytes", "unexpected_buffer_bytes", TcpKwarg::kInteger},
    {"gpu_staging_chunks", "gpu_staging_chunks", TcpKwarg::kInteger},
    {"token", "token", TcpKwarg::kToken},
    {"same_host", "same_host", TcpKwarg::kBool},
};

// Any int a JSON integer holds; from_json checks it against the field's width and range.
json integer_json(py::handle v, const char* what) {
  const py::int_ i = detail::index_of(v, what);
  if (detail::is_negative(i)) return int_arg<int64_t>(i, what);
  return int_arg<uint64_t>(i, what);
}

}  // namespace

json tcp_options_json_from_kwargs(const py::kwargs& kwargs, const std::vector<std::string>& consumed) {
  json options = json::object();
  for (auto item : kwargs) {
    const auto key = item.first.cast<std::string>();
    if (std::find(consumed.begin(), consumed.end(), key) != consumed.end()) continue;
    const auto* known = std::find_if(std::begin(kTcpKwargs), std::end(kTcpKwargs),
                                     [&](const TcpKwargKey& k) { return key == k.python; });
    if (known == std::end(kTcpKwargs)) {
      throw py::type_error(fmt::format("got an unexpected keyword argument '{}'", key));
    }
    py::handle v = item.second;
    const char* k = known->python;
    switch (known->kind) {
      case TcpKwarg::kInteger: options[known->json] = integer_json(v, k); break;
      case TcpKwarg::kSeconds: options[known->json] = millis_arg(v, k).count(); break;
      case TcpKwarg::kText: options[known->json] = optional_str_arg(v, k); break;
      case TcpKwarg::kBool:
        if (!py::isinstance<py::bool_>(v)) throw py::type_error(fmt::format("{} must be a bool, not {}", k, type_name(v)));
        options[known->json] = v.cast<bool>();
        break;
      case TcpKwarg::kToken:
        // None keeps DLSLIME_TCP_TOKEN; "" turns authentication off; str or bytes set it.
        if (!v.is_none() && !py::isinstance<py::str>(v) && !py::isinstance<py::bytes>(v)) {
          throw py::type_error(fmt::format("token must be str, bytes or None, not {}", type_name(v)));
        }
        if (!v.is_none()) options[known->json] = v.cast<std::string>();
        break;
    }
  }
  return options;
}

TcpOptions tcp_options_from_kwargs(const py::kwargs& kwargs, const std::vector<std::string>& consumed) {
  return TcpOptions::from_json(tcp_options_json_from_kwargs(kwargs, consumed), TcpOptions::from_env());
}
#endif  // DLSLIME_WITH_TCP

// --- Memory pools ----------------------------------------------------------------------

MemoryPoolView::MemoryPoolView() : registry_(std::make_shared<MemoryRegistry>()) {}
MemoryPoolView::~MemoryPoolView() = default;

int32_t MemoryPoolView::record_remote(const std::string& name, const json& entry) {
  std::lock_guard lock(mu_);
  auto it = remote_.find(name);
  if (it != remote_.end() && it->second.first == entry) return it->second.second;
  const int32_t handle = next_remote_++;
  remote_[name] = {entry, handle};
  return handle;
}

json MemoryPoolView::remote_mr_info() const {
  std::lock_guard lock(mu_);
  json out = json::object();
  for (const auto& [name, record] : remote_) out[name] = record.first;
  return out;
}

std::shared_ptr<MemoryPoolView> pool_arg(py::handle v, const char* what) {
  if (!py::isinstance<MemoryPoolView>(v)) {
    throw py::type_error(fmt::format("{} must be a dlslime.MemoryPool (TcpMemoryPool, RDMAMemoryPool), not {}", what,
                                     type_name(v)));
  }
  return v.cast<std::shared_ptr<MemoryPoolView>>();
}

namespace {

// The deleter of an endpoint built on a pool: it owns the library's endpoint (whose own
// deleter it must keep) and the pool, and drops the endpoint without the GIL.
struct PooledEndpoint {
  std::shared_ptr<std::shared_ptr<Endpoint>> owner;
  std::shared_ptr<MemoryPoolView> pool;
  void operator()(Endpoint*) {
    auto* last = new std::shared_ptr<Endpoint>(std::move(*owner));
    DestroyWithoutGil{}(last);
  }
};

}  // namespace

std::shared_ptr<Endpoint> make_endpoint_on_pool(const std::string& transport, const json& options,
                                                std::shared_ptr<MemoryPoolView> pool) {
  std::shared_ptr<Endpoint> ep;
  {
    ReleaseGil release;  // opens devices, binds, starts I/O threads
    ep = TransportRegistry::instance().make(transport, options, pool->registry());
  }
  Endpoint* raw = ep.get();
  return std::shared_ptr<Endpoint>(raw, PooledEndpoint{std::make_shared<std::shared_ptr<Endpoint>>(std::move(ep)),
                                                       std::move(pool)});
}

std::shared_ptr<MemoryPoolView> pool_of(const std::shared_ptr<Endpoint>& endpoint) {
  const auto* d = std::get_deleter<PooledEndpoint>(endpoint);
  return d != nullptr ? d->pool : nullptr;
}

std::vector<Assignment> named_assignments(py::handle obj, const RegionLookup& local_lookup,
                                         const RegionLookup& remote_lookup) {
  auto named = [](py::handle t) {
    return (py::isinstance<py::tuple>(t) || py::isinstance<py::list>(t)) && py::len(t) == 5 &&
           PyUnicode_Check(py::reinterpret_borrow<py::sequence>(t)[0].ptr());
  };
  auto convert = [&](py::handle t) -> py::object {
    if (!named(t)) return py::reinterpret_borrow<py::object>(t);
    auto seq = py::reinterpret_borrow<py::sequence>(t);
    const std::string local = str_arg(seq[0], "local_name");
    const std::string remote = str_arg(seq[1], "remote_name");
    const auto lh = local_lookup(local);
    if (!lh) throw NotFoundError(fmt::format("no local memory region named '{}'", local));
    const auto rh = remote_lookup(remote);
    if (!rh) throw NotFoundError(fmt::format("no remote memory region named '{}' (connect, or register it)", remote));
    return py::make_tuple(*lh, *rh, seq[2], seq[3], seq[4]);
  };
  if (named(obj)) return to_assignments(py::make_tuple(convert(obj)));
  if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
    py::list items;
    bool single = py::isinstance<py::tuple>(obj) && py::len(obj) == 5 &&
                  PyLong_Check(obj.cast<py::tuple>()[0].ptr());
    if (single) return to_assignments(obj);
    for (auto item : obj) items.append(convert(item));
    return to_assignments(items);
  }
  return to_assignments(obj);  // its TypeError
}

}  // namespace dlslime::py_bind
