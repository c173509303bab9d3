#pragma once

#include <string>
#include <vector>

namespace dlslime {

// A vendor library (libibverbs, libcudart) opened at run time with dlopen, never linked:
// libdlslime then loads, and TCP runs, on a host that lacks it, and the transport that
// needs it says why it cannot run instead of the whole import failing. Each entry point is
// resolved once, when the library is opened, into a table of function pointers (NCCL's
// wrappers do the same), so a call costs one indirect jump and a missing symbol is found
// at the first use of the transport, not at some later call.
//
// The library is kept for the life of the process (never dlclose'd): its own state, and
// the objects made through it, outlive any one user.
class SharedLibrary {
 public:
  // Opens `what` (its name in messages, e.g. "libibverbs"): the file named by the
  // environment variable `path_variable` if that is set (a path or a soname; nothing else is
  // tried then: an explicit choice never silently falls back), else the first of `sonames`
  // (sonames or paths) that loads. On failure handle() is null and error() says what was
  // tried, what the loader said and which variable points at another copy.
  SharedLibrary(const char* what, const std::vector<std::string>& sonames, const char* path_variable);

  void* handle() const { return handle_; }
  const std::string& error() const { return error_; }
  // The file that was opened (a path when the loader reports one).
  const std::string& path() const { return path_; }

  // Resolves `symbol` into `fn`. A required one that is missing is remembered for
  // missing_error(); an optional one is left null (the feature that needs it says so).
  template <class Fn>
  void resolve(Fn*& fn, const char* symbol) {
    fn = reinterpret_cast<Fn*>(lookup(symbol, /*required=*/true));
  }
  template <class Fn>
  void resolve_optional(Fn*& fn, const char* symbol) {
    fn = reinterpret_cast<Fn*>(lookup(symbol, /*required=*/false));
  }
  // Empty when every required symbol was found; else which ones the library lacks, and
  // the variable that points at another copy.
  std::string missing_error() const;

 private:
  void* lookup(const char* symbol, bool required);

  std::string what_;
  std::string path_variable_;
  void* handle_ = nullptr;
  std::string error_;
  std::string path_;
  std::string missing_;  // required symbols not found, space-separated
};

// The directory (with a trailing '/') holding the shared object this code is part of
// (libdlslime.so; "" if unknown): the simulated devices' libraries are installed beside it.
std::string own_library_directory();

}  // namespace dlslime
