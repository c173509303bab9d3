// Notifications over the library's notify (docs/ascend.md, "Notifications"). Ours are up to
// 4 KiB of any bytes; a library notify carries text fields of at most 1,024 characters
// (AscendString: no NUL). So a notification travels as one or more notifies, each
// "dlslime-n1:<seq>:<index>/<count>:<base64 of up to 720 bytes>". The notifies of one link
// arrive in order, and a sender sends one notification's fragments before the next's, so
// the receiver joins each sender's fragments as they come. A notify that is not in this
// form (a peer of another program on the same library) is received as its text.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dlslime::ascend {

std::vector<std::string> encode_notification(const std::string& bytes, uint64_t seq);
// The liveness probe an endpoint sends over its link while connected (docs/ascend.md,
// "Liveness"); a receiver drops it.
extern const char* const kPingNotify;

// Joins fragments per sending engine. Not thread-safe (the endpoint's lock).
class NotificationAssembler {
 public:
  // The whole notification once `fragment` completes one; nullopt while it is partial, or
  // when the fragment does not continue what this sender sent before (that partial one is
  // dropped, and the fragment is taken as the start of the next).
  std::optional<std::string> add(const std::string& sender, std::string fragment);

 private:
  struct Partial {
    uint64_t seq = 0;
    uint32_t next = 0;
    uint32_t count = 0;
    std::string bytes;
  };
  std::map<std::string, Partial> partial_;
};

}  // namespace dlslime::ascend
