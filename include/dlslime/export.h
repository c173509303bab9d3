#pragma once

// Symbols are hidden by default (CMAKE_CXX_VISIBILITY_PRESET=hidden); the public API is
// exported deliberately with DLSLIME_API.
#if defined(_WIN32)
#define DLSLIME_API __declspec(dllexport)
#else
#define DLSLIME_API __attribute__((visibility("default")))
#endif
