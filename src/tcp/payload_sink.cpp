#include "tcp/payload_sink.h"

#include <algorithm>

namespace dlslime::tcp {

void PayloadSink::advance(uint64_t n) {
  // n may span several segments (a direct read fills them in one readv).
  while (dst != nullptr) {
    const uint64_t step = std::min(n, dst_left);
    dst += step;
    dst_left -= step;
    n -= step;
    if (dst_left > 0) break;
    if (more_count == 0) {
      dst = nullptr;  // full: anything more is dropped
      break;
    }
    place(more->addr, more->length);
    ++more;
    --more_count;
  }
}

}  // namespace dlslime::tcp
