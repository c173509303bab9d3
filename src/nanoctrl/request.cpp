#include "nanoctrl/request.h"

#include <fmt/format.h>

namespace dlslime::nanoctrl {

namespace {

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
         c == '.' || c == '@';
}

const char* type_name(const nlohmann::json& v) { return v.type_name(); }

// JSON nested deeper than this is refused before parsing: recursion over the value (dump,
// destruction) must stay well inside a thread's stack.
constexpr int kMaxJsonDepth = 64;

bool too_deep(const std::string& body) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

}  // namespace

nlohmann::json parse_body(const std::string& body) {
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) return nlohmann::json::object();
  if (too_deep(body)) {
    throw ApiError(400, fmt::format("request body is nested deeper than {} levels", kMaxJsonDepth));
  }
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Parse again for the position of the error. Not only parse_error: a number that
    // overflows a double (1e400) is out_of_range, and bad input all the same (was a 500).
    try {
      nlohmann::json again = nlohmann::json::parse(body);
      (void)again;
    } catch (const nlohmann::json::exception& e) {
      throw ApiError(400, std::string("malformed JSON body: ") + e.what());
    }
    throw ApiError(400, "malformed JSON body");
  }
  if (!j.is_object()) throw ApiError(400, std::string("request body must be a JSON object, got ") + j.type_name());
  return j;
}

bool is_valid_name(const std::string& s, std::size_t max_len) {
  if (s.empty() || s.size() > max_len) return false;
  for (char c : s) {
    if (!name_char(c)) return false;
  }
  return true;
}

bool is_valid_id(const std::string& s, std::size_t max_len) {
  if (s.empty() || s.size() > max_len) return false;
  for (unsigned char c : s) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

const nlohmann::json* Fields::find(const char* name) const {
  auto it = body_.find(name);
  if (it == body_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool Fields::has(const char* name) const { return find(name) != nullptr; }

std::optional<std::string> Fields::opt_string(const char* name) const {
  const auto* v = find(name);
  if (!v) return std::nullopt;
  if (!v->is_string()) {
    throw bad_request("field '" + std::string(name) + "' must be a string, got " + type_name(*v));
  }
  return v->get<std::string>();
}

std::string Fields::req_string(const char* name) const {
  auto v = opt_string(name);
  if (!v) throw bad_request("field '" + std::string(name) + "' (string) is required");
  return *v;
}

std::string Fields::opt_name(const char* name, const std::string& fallback) const {
  auto v = opt_string(name);
  if (!v || v->empty()) return fallback;
  if (!is_valid_name(*v)) {
    throw bad_request("field '" + std::string(name) + "' = '" + v->substr(0, 200) +
                      "' is not a valid name (1-128 characters of A-Z a-z 0-9 _ - . @)");
  }
  return *v;
}

std::string Fields::req_name(const char* name) const {
  auto v = opt_name(name);
  if (v.empty()) throw bad_request("field '" + std::string(name) + "' (string) is required");
  return v;
}

std::string Fields::req_id(const char* name) const {
  auto v = req_string(name);
  if (!is_valid_id(v)) {
    throw bad_request("field '" + std::string(name) + "' = '" + v.substr(0, 200) +
                      "' is not a valid id (1-256 printable ASCII characters, no spaces)");
  }
  return v;
}

std::optional<int64_t> Fields::opt_int(const char* name) const {
  const auto* v = find(name);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) {
    if (v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      throw bad_request("field '" + std::string(name) + "' is out of range");
    }
    return static_cast<int64_t>(v->get<uint64_t>());
  }
  if (!v->is_number_integer()) {
    throw bad_request("field '" + std::string(name) + "' must be an integer, got " + type_name(*v));
  }
  return v->get<int64_t>();
}

std::optional<uint64_t> Fields::opt_uint(const char* name) const {
  const auto* v = find(name);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) return v->get<uint64_t>();
  if (v->is_number_integer() && v->get<int64_t>() >= 0) return static_cast<uint64_t>(v->get<int64_t>());
  throw bad_request("field '" + std::string(name) + "' must be a non-negative integer");
}

std::optional<double> Fields::opt_number(const char* name) const {
  const auto* v = find(name);
  if (!v) return std::nullopt;
  if (!v->is_number()) {
    throw bad_request("field '" + std::string(name) + "' must be a number, got " + type_name(*v));
  }
  return v->get<double>();
}

bool Fields::opt_bool(const char* name, bool fallback) const {
  const auto* v = find(name);
  if (!v) return fallback;
  if (!v->is_boolean()) {
    throw bad_request("field '" + std::string(name) + "' must be a boolean, got " + type_name(*v));
  }
  return v->get<bool>();
}

std::optional<nlohmann::json> Fields::opt_object(const char* name) const {
  const auto* v = find(name);
  if (!v) return std::nullopt;
  if (!v->is_object()) {
    throw bad_request("field '" + std::string(name) + "' must be an object, got " + type_name(*v));
  }
  return *v;
}

std::vector<std::string> Fields::req_name_list(const char* name) const {
  const auto* v = find(name);
  if (!v) throw bad_request("field '" + std::string(name) + "' (list of names) is required");
  if (!v->is_array()) {
    throw bad_request("field '" + std::string(name) + "' must be a list of names, got " + type_name(*v));
  }
  if (v->size() > 4096) throw bad_request("field '" + std::string(name) + "' has more than 4096 entries");
  std::vector<std::string> out;
  for (const auto& item : *v) {
    if (!item.is_string() || !is_valid_name(item.get<std::string>())) {
      throw bad_request("field '" + std::string(name) + "' must hold valid names (1-128 characters of " +
                        "A-Z a-z 0-9 _ - . @), got " + item.dump().substr(0, 200));
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

std::optional<nlohmann::json> Fields::opt_any(const char* name) const {
  const auto* v = find(name);
  if (!v) return std::nullopt;
  return *v;
}

std::string Fields::scope() const {
  auto v = opt_string("scope");
  if (!v || v->empty()) return "";
  if (!is_valid_name(*v)) {
    throw bad_request("field 'scope' = '" + v->substr(0, 200) +
                      "' is not a valid scope (1-128 characters of A-Z a-z 0-9 _ - . @)");
  }
  return *v;
}

}  // namespace dlslime::nanoctrl
