#include "gil.h"

#include <unistd.h>

#include <algorithm>

#include "convert.h"

namespace py = pybind11;

namespace dlslime::py_bind {

namespace {

bool interpreter_finalizing() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

}  // namespace

bool python_gone() noexcept { return Py_IsInitialized() == 0 || interpreter_finalizing(); }

PyCallable::~PyCallable() {
  if (python_gone()) return;  // leaked on purpose (see the class comment)
  const PyGILState_STATE gil = PyGILState_Ensure();
  Py_DECREF(fn_);
  PyGILState_Release(gil);
}

void PyCallable::call(const std::function<py::object()>& make_arg) const noexcept {
  if (python_gone()) return;
  const PyGILState_STATE gil = PyGILState_Ensure();
  try {
    py::handle callable{fn_};  // braces: `py::handle(fn_)(...)` would declare a variable
    callable(make_arg());
  } catch (py::error_already_set& e) {
    // "Exception ignored in: <the callable>" and the traceback, through sys.unraisablehook.
    e.discard_as_unraisable(py::reinterpret_borrow<py::object>(fn_));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    PyErr_WriteUnraisable(fn_);
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "a non-standard C++ exception");
    PyErr_WriteUnraisable(fn_);
  }
  PyGILState_Release(gil);
}

// _PyOS_IsMainThread() reads the current thread state, so it is asked while the GIL is
// still held.
ReleaseGil::ReleaseGil() : main_thread_(_PyOS_IsMainThread() != 0) { state_ = PyEval_SaveThread(); }

ReleaseGil::~ReleaseGil() {
  if (!main_thread_ && interpreter_finalizing()) {
    // The process is exiting (see the class comment): never return to Python.
    for (;;) ::pause();
  }
  PyEval_RestoreThread(state_);
}

bool wait_interruptibly(std::optional<std::chrono::nanoseconds> timeout,
                        const std::function<bool(std::chrono::nanoseconds)>& wait_slice,
                        std::chrono::nanoseconds slice) {
  using clock = std::chrono::steady_clock;
  // No single wait is longer than kMaxSeconds, so that callees may add it to now().
  const std::chrono::nanoseconds longest = std::chrono::seconds(static_cast<int64_t>(kMaxSeconds));
  const auto start = clock::now();
  for (;;) {
    bool done = false;
    {
      ReleaseGil nogil;
      std::chrono::nanoseconds left = longest;
      if (timeout) left = std::max(std::chrono::nanoseconds::zero(), *timeout - (clock::now() - start));
      if (nogil.on_main_thread()) left = std::min(left, slice);
      done = wait_slice(std::min(left, longest));
    }
    if (done) return true;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (timeout && clock::now() - start >= *timeout) return false;
  }
}

}  // namespace dlslime::py_bind
