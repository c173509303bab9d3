// Stand-in for compile checks only (tests/ascend_sdk_stub/README.md): the public declaration
// of ge::AscendString (CANN metadef, graph/ascend_string.h). Its members are defined in CANN's
// libraries, out of line: that is why the plugin may use it whatever its std::string ABI.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace ge {
class AscendString {
 public:
  AscendString() = default;
  ~AscendString() = default;
  AscendString(const char* const name);
  AscendString(const char* const name, size_t length);
  const char* GetString() const;
  size_t GetLength() const;
  bool operator<(const AscendString& d) const;
  bool operator==(const AscendString& d) const;

 private:
  std::shared_ptr<std::string> name_;
};
}  // namespace ge
