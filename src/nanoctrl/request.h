#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

// Reading and validating request bodies. Every violation becomes an ApiError with a 4xx
// status and a message naming the field, so a client always learns what to fix.
namespace dlslime::nanoctrl {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message) : std::runtime_error(message), status_(status) {}
  int status() const noexcept { return status_; }

 private:
  int status_;
};

inline ApiError bad_request(const std::string& message) { return ApiError(400, message); }

// Parses a request body: empty means {}; anything that is not a JSON object, nests deeper
// than 64 levels, or does not parse (numbers overflowing a double included) is a 400.
nlohmann::json parse_body(const std::string& body);

// What a name (alias, scope, entity type) may contain: it becomes one ':'-separated key
// component, so ':' and glob characters are excluded.
bool is_valid_name(const std::string& s, std::size_t max_len = 128);
// What an id (memory-region name, entity id) may contain: printable ASCII without spaces.
bool is_valid_id(const std::string& s, std::size_t max_len = 256);

class Fields {
 public:
  explicit Fields(const nlohmann::json& body) : body_(body) {}

  const nlohmann::json& body() const { return body_; }
  bool has(const char* name) const;  // present and not null

  std::optional<std::string> opt_string(const char* name) const;
  std::string req_string(const char* name) const;
  std::string opt_name(const char* name, const std::string& fallback = "") const;  // validated name
  std::string req_name(const char* name) const;
  std::string req_id(const char* name) const;
  std::optional<int64_t> opt_int(const char* name) const;
  std::optional<uint64_t> opt_uint(const char* name) const;
  std::optional<double> opt_number(const char* name) const;
  bool opt_bool(const char* name, bool fallback) const;
  std::optional<nlohmann::json> opt_object(const char* name) const;
  std::vector<std::string> req_name_list(const char* name) const;
  // Any JSON value except null; nullopt when absent.
  std::optional<nlohmann::json> opt_any(const char* name) const;
  // The request scope ("" = none).
  std::string scope() const;

 private:
  const nlohmann::json* find(const char* name) const;
  const nlohmann::json& body_;
};

}  // namespace dlslime::nanoctrl
