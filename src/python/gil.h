#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include <pybind11/pybind11.h>

// Releasing the GIL, waiting from Python, and destroying library objects without the GIL
// (gil.cpp). Every binding that blocks or can take long uses these instead of
// py::gil_scoped_release.
namespace dlslime::py_bind {

// Releases the GIL for its lifetime; usable as a py::call_guard. Unlike
// py::gil_scoped_release it never takes the GIL back on a thread other than the main one
// once the interpreter is exiting (from dlslime's atexit hook on, install_exit_gate):
// CPython would end that thread with pthread_exit, whose forced unwind through this
// (noexcept) destructor calls std::terminate and aborts the process. Such a thread (a daemon thread whose wait ended at exit) parks until the
// process exits instead. The main thread is the one that finalizes; it always takes the
// GIL back.
class ReleaseGil {
 public:
  ReleaseGil();
  ~ReleaseGil();
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

  // Whether this thread runs Python's signal handlers (only the main thread does).
  bool on_main_thread() const noexcept { return main_thread_; }

 private:
  PyThreadState* state_;
  bool main_thread_;
};

// True once Python may no longer run: the interpreter is not initialized or is finalizing.
// A library thread must then neither take the GIL (CPython would end the thread with
// pthread_exit, see ReleaseGil) nor touch a Python object.
bool python_gone() noexcept;

// A Python callable that library code holds and calls from any thread (an op continuation
// on an I/O thread). Each call takes the GIL (PyGILState_Ensure: works on threads Python
// never saw and on threads that already hold it) and reports an exception the callable
// raises through sys.unraisablehook instead of propagating it. Once the interpreter is
// exiting (install_exit_gate), calls are skipped and the last release leaks
// the reference: taking the GIL during finalization would end the thread with
// pthread_exit, aborting the process. Made with the GIL held.
class PyCallable {
 public:
  explicit PyCallable(pybind11::handle fn) : fn_(fn.inc_ref().ptr()) {}
  ~PyCallable();
  PyCallable(const PyCallable&) = delete;
  PyCallable& operator=(const PyCallable&) = delete;

  // fn(arg), converting `arg` to Python with the GIL held. Never throws.
  template <class Arg>
  void operator()(const Arg& arg) const noexcept {
    call([&] { return pybind11::cast(arg); });
  }

 private:
  void call(const std::function<pybind11::object()>& make_arg) const noexcept;
  PyObject* fn_;  // a strong reference
};

// Registers the atexit hook after which no thread of ours but the main one takes the GIL
// (ReleaseGil parks, PyCallable skips the call): the hook waits, GIL released, for those
// already on their way to it, which would otherwise get it only once finalizing and be
// ended by CPython mid-frame. Called once, at import.
void install_exit_gate();

// How often a wait on the main thread takes the GIL to run signal handlers, so that
// Ctrl-C raises KeyboardInterrupt within this long.
constexpr std::chrono::milliseconds kSignalCheckInterval{50};

// Blocks until `wait_slice(d)`, which waits at most `d` and returns whether the awaited
// thing happened, returns true; returns false once `timeout` (nullopt: none) has passed.
// The GIL is released while waiting. On the main thread it waits in slices of at most
// `slice` and runs Python's signal handlers between them: an exception they raise
// (KeyboardInterrupt) propagates. Other threads cannot receive signals and wait in one go.
// Exceptions from `wait_slice` propagate.
bool wait_interruptibly(std::optional<std::chrono::nanoseconds> timeout,
                        const std::function<bool(std::chrono::nanoseconds)>& wait_slice,
                        std::chrono::nanoseconds slice = kSignalCheckInterval);

// A shared_ptr deleter that destroys the object with the GIL released when the last
// reference drops on a thread holding it (`del endpoint` from Python): shutting an
// endpoint or agent down joins threads and closes connections, which must not stall every
// other Python thread.
struct DestroyWithoutGil {
  template <class T>
  void operator()(T* p) const {
    if (Py_IsInitialized() && PyGILState_Check()) {
      ReleaseGil nogil;
      delete p;
    } else {
      delete p;
    }
  }
};

// Constructs T with the GIL released and returns it with a DestroyWithoutGil deleter: the
// holder of every bound class whose constructor or destructor does I/O.
template <class T, class... Args>
std::shared_ptr<T> make_without_gil(Args&&... args) {
  ReleaseGil nogil;
  return std::shared_ptr<T>(new T(std::forward<Args>(args)...), DestroyWithoutGil{});
}

}  // namespace dlslime::py_bind
