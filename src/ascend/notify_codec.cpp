#include "ascend/notify_codec.h"

#include <charconv>

#include <fmt/format.h>

#include "core/log.h"

namespace dlslime::ascend {

namespace {

constexpr std::string_view kPrefix = "dlslime-n1:";
constexpr size_t kFragmentBytes = 720;  // 960 base64 characters: with the header, < 1,024
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out.push_back(kAlphabet[(v >> s) & 63]);
  }
  if (const size_t rest = in.size() - i; rest > 0) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (rest == 2 ? uint8_t(in[i + 1]) << 8 : 0);
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::optional<std::string> unbase64(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    const int pad = last ? (in[i + 3] == '=') + (in[i + 2] == '=') : 0;
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const int d = k >= 4 - pad ? 0 : value(in[i + k]);
      if (d < 0) return std::nullopt;
      v = (v << 6) | uint32_t(d);
    }
    out.push_back(char(v >> 16));
    if (pad < 2) out.push_back(char((v >> 8) & 0xff));
    if (pad < 1) out.push_back(char(v & 0xff));
  }
  return out;
}

template <class T>
bool parse(std::string_view& s, char end, T& out) {
  const size_t at = s.find(end);
  if (at == std::string_view::npos) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + at, out);
  if (ec != std::errc() || p != s.data() + at || at == 0) return false;
  s.remove_prefix(at + 1);
  return true;
}

}  // namespace

const char* const kPingNotify = "dlslime-n1:ping";

std::vector<std::string> encode_notification(const std::string& bytes, uint64_t seq) {
  const size_t count = bytes.empty() ? 1 : (bytes.size() + kFragmentBytes - 1) / kFragmentBytes;
  std::vector<std::string> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const std::string_view piece = std::string_view(bytes).substr(i * kFragmentBytes, kFragmentBytes);
    out.push_back(fmt::format("{}{}:{}/{}:{}", kPrefix, seq, i, count, base64(piece)));
  }
  return out;
}

std::optional<std::string> NotificationAssembler::add(const std::string& sender, std::string fragment) {
  if (fragment == kPingNotify) return std::nullopt;
  std::string_view s = fragment;
  uint64_t seq = 0;
  uint32_t index = 0, count = 0;
  std::optional<std::string> piece;
  if (s.substr(0, kPrefix.size()) == kPrefix) {
    s.remove_prefix(kPrefix.size());
    if (parse(s, ':', seq) && parse(s, '/', index) && parse(s, ':', count) && index < count && count <= 64) {
      piece = unbase64(s);
    }
  }
  if (!piece) {
    partial_.erase(sender);
    return fragment;  // another program's notify: its text
  }
  Partial& p = partial_[sender];
  if (index == 0) {
    if (p.next != 0) DLSLIME_WARN("Ascend: engine '{}' left notification {} unfinished", sender, p.seq);
    p = Partial{seq, 0, count, {}};
  } else if (p.seq != seq || p.next != index || p.count != count) {
    DLSLIME_WARN("Ascend: engine '{}' sent fragment {}/{} of notification {} out of order; dropped", sender, index,
                 count, seq);
    partial_.erase(sender);
    return std::nullopt;
  }
  p.bytes += *piece;
  if (++p.next < p.count) return std::nullopt;
  std::string whole = std::move(p.bytes);
  partial_.erase(sender);
  return whole;
}

}  // namespace dlslime::ascend
