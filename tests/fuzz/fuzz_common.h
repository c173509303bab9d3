#pragma once

#include <cstdio>
#include <cstdlib>

// A broken invariant is a crash for libFuzzer (and a failing run of scripts/fuzz.sh).
// Not assert(): it must hold in every build type.
#define FUZZ_CHECK(cond)                                                             \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                           \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)
