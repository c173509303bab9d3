// core/shared_library.h: how a vendor library is found, and what the user is told when it
// is not (the RDMA and CUDA loaders build their messages from these).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/shared_library.h"

namespace dlslime {
namespace {

constexpr const char* kVar = "DLSLIME_TEST_SHARED_LIBRARY";

struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() { unsetenv(name_); }
  const char* name_;
};

TEST(SharedLibrary, TheFirstSonameThatLoadsIsOpenedAndItsSymbolsResolve) {
  ScopedEnv env(kVar, nullptr);
  SharedLibrary lib("libc", {"libdlslime-no-such-library.so.7", "libc.so.6"}, kVar);
  ASSERT_NE(lib.handle(), nullptr) << lib.error();
  EXPECT_NE(lib.path().find("libc"), std::string::npos) << lib.path();
  size_t (*len)(const char*) = nullptr;
  lib.resolve(len, "strlen");
  ASSERT_NE(len, nullptr);
  EXPECT_EQ(len("seven.."), 7u);
  EXPECT_EQ(lib.missing_error(), "");
}

TEST(SharedLibrary, AMissingLibraryNamesWhatWasTriedAndTheVariable) {
  ScopedEnv env(kVar, nullptr);
  SharedLibrary lib("libexample", {"libdlslime-no-such-library.so.7"}, kVar);
  EXPECT_EQ(lib.handle(), nullptr);
  EXPECT_NE(lib.error().find("libexample could not be loaded"), std::string::npos) << lib.error();
  EXPECT_NE(lib.error().find("libdlslime-no-such-library.so.7"), std::string::npos) << lib.error();
  EXPECT_NE(lib.error().find(kVar), std::string::npos) << lib.error();
  void (*fn)() = reinterpret_cast<void (*)()>(1);
  lib.resolve(fn, "anything");  // nothing to resolve from: null, no crash
  EXPECT_EQ(fn, nullptr);
}

TEST(SharedLibrary, AnExplicitChoiceIsTheOnlyOneTried) {
  // The variable names a file that is not there: the soname that would load is not tried.
  ScopedEnv env(kVar, "/nonexistent/libexample.so.1");
  SharedLibrary lib("libexample", {"libc.so.6"}, kVar);
  EXPECT_EQ(lib.handle(), nullptr);
  EXPECT_NE(lib.error().find("DLSLIME_TEST_SHARED_LIBRARY='/nonexistent/libexample.so.1'"), std::string::npos)
      << lib.error();
}

TEST(SharedLibrary, MissingRequiredSymbolsAreNamedAndOptionalOnesAreNot) {
  ScopedEnv env(kVar, "libc.so.6");  // the variable takes a soname too
  SharedLibrary lib("libexample", {"libdlslime-no-such-library.so.7"}, kVar);
  ASSERT_NE(lib.handle(), nullptr) << lib.error();
  void (*a)() = nullptr;
  void (*b)() = nullptr;
  void (*opt)() = reinterpret_cast<void (*)()>(1);
  size_t (*len)(const char*) = nullptr;
  lib.resolve(a, "dlslime_no_such_symbol_a");
  lib.resolve(len, "strlen");
  lib.resolve_optional(opt, "dlslime_no_such_symbol_optional");
  lib.resolve(b, "dlslime_no_such_symbol_b");
  EXPECT_EQ(a, nullptr);
  EXPECT_EQ(opt, nullptr);
  EXPECT_NE(len, nullptr);
  const std::string e = lib.missing_error();
  EXPECT_NE(e.find("lacks dlslime_no_such_symbol_a dlslime_no_such_symbol_b"), std::string::npos) << e;
  EXPECT_EQ(e.find("optional"), std::string::npos) << e;
  EXPECT_NE(e.find(kVar), std::string::npos) << e;
}

}  // namespace
}  // namespace dlslime
