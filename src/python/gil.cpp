#include "gil.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

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

namespace {

// Threads of ours on their way to the GIL (ReleaseGil on a thread other than the main one,
// PyCallable). CPython ends a thread that takes the GIL once the interpreter is finalizing
// (pthread_exit, whose forced unwind through our noexcept frames aborts the process), and
// checking the finalizing flag first is not enough: a thread that passed the check may
// still be waiting for the GIL when finalization begins, and get it when the main thread
// releases it during teardown (destroying an endpoint). So the atexit hook (which runs
// before finalization) closes this gate and waits, GIL released, for the threads between
// the check and the GIL; after it, none starts.
struct ExitGate {
  std::mutex mu;
  std::condition_variable cv;
  int entering = 0;      // guarded by mu
  bool exiting = false;  // guarded by mu
};
ExitGate& exit_gate() {
  static auto* g = new ExitGate;  // never destroyed: I/O threads may outlive static destructors
  return *g;
}

// Runs take_gil() unless the interpreter is exiting; false (nothing taken) if it is.
template <class TakeGil>
bool take_gil_unless_exiting(TakeGil&& take_gil) noexcept {
  auto& g = exit_gate();
  {
    std::lock_guard lock(g.mu);
    if (g.exiting || python_gone()) return false;
    ++g.entering;
  }
  take_gil();
  {
    std::lock_guard lock(g.mu);
    --g.entering;
  }
  g.cv.notify_all();
  return true;
}

bool enter_python(PyGILState_STATE& gil) noexcept {
  return take_gil_unless_exiting([&] { gil = PyGILState_Ensure(); });
}

}  // namespace

void install_exit_gate() {
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    auto& g = exit_gate();
    {
      std::lock_guard lock(g.mu);
      g.exiting = true;
    }
    ReleaseGil nogil;  // on the main thread: it always takes the GIL back
    std::unique_lock lock(g.mu);
    g.cv.wait(lock, [&] { return g.entering == 0; });
  }));
}

PyCallable::~PyCallable() {
  PyGILState_STATE gil;
  if (!enter_python(gil)) return;  // leaked on purpose (see the class comment)
  Py_DECREF(fn_);
  PyGILState_Release(gil);
}

void PyCallable::call(const std::function<py::object()>& make_arg) const noexcept {
  PyGILState_STATE gil;
  if (!enter_python(gil)) return;
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
  if (main_thread_) {
    PyEval_RestoreThread(state_);
    return;
  }
  if (!take_gil_unless_exiting([&] { PyEval_RestoreThread(state_); })) {
    // The process is exiting (see the class comment): never return to Python.
    for (;;) ::pause();
  }
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
