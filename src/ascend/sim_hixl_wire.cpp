// The messages between simulated HIXL engines (sim_hixl_wire.h).
#include "ascend/sim_hixl_wire.h"

#include <cstring>

#include "ascend/hixl_engine.h"

namespace dlslime::ascend::simwire {
namespace {

struct Header {
  uint32_t magic = kMagic;
  uint8_t kind = 0;
  uint8_t flag = 0;
  uint16_t reserved = 0;  // explicit: no byte of a message is left uninitialized
  uint32_t count = 0;     // entries (SNAPSHOT, TRANSFER) or text bytes (HELLO, NOTIFY)
  uint32_t status = 0;
  uint64_t req = 0;
};
static_assert(sizeof(Header) == kHeaderSize, "no implicit padding on the wire");

bool answer_status_known(uint32_t s) {
  return s == kHixlSuccess || s == kHixlParamInvalid || s == kHixlResourceExhausted || s == kHixlFailed ||
         s == kHixlUnsupported;
}

}  // namespace

std::vector<uint8_t> encode(const Message& m) {
  Header h;
  h.kind = static_cast<uint8_t>(m.kind);
  h.flag = m.flag;
  h.status = m.status;
  h.req = m.req;
  const void* payload = nullptr;
  size_t bytes = 0;
  switch (m.kind) {
    case Kind::kHello:
    case Kind::kNotify:
      h.count = static_cast<uint32_t>(m.text.size());
      payload = m.text.data();
      bytes = m.text.size();
      break;
    case Kind::kSnapshot:
      h.count = static_cast<uint32_t>(m.regions.size());
      payload = m.regions.data();
      bytes = m.regions.size() * sizeof(Region);
      break;
    case Kind::kTransfer:
      h.count = static_cast<uint32_t>(m.descs.size());
      payload = m.descs.data();
      bytes = m.descs.size() * sizeof(Desc);
      break;
    case Kind::kAnswer:
      break;
  }
  std::vector<uint8_t> out(sizeof(h) + bytes);
  std::memcpy(out.data(), &h, sizeof(h));
  if (bytes > 0) std::memcpy(out.data() + sizeof(h), payload, bytes);
  return out;
}

bool parse(const uint8_t* data, size_t size, Message* out) {
  Header h;
  if (size < sizeof(h) || size > kMaxMessage) return false;
  std::memcpy(&h, data, sizeof(h));
  if (h.magic != kMagic || h.reserved != 0) return false;
  const uint8_t* payload = data + sizeof(h);
  const size_t bytes = size - sizeof(h);
  Message m;
  m.kind = static_cast<Kind>(h.kind);
  m.flag = h.flag;
  m.status = h.status;
  m.req = h.req;
  switch (m.kind) {
    case Kind::kHello:
      if (h.count == 0 || h.count > kMaxName || bytes != h.count || h.flag != 0) return false;
      m.text.assign(reinterpret_cast<const char*>(payload), bytes);
      break;
    case Kind::kNotify:
      if (h.count > kMaxText || bytes != h.count || h.flag != 0) return false;
      m.text.assign(reinterpret_cast<const char*>(payload), bytes);
      break;
    case Kind::kSnapshot:
      if (h.count > kMaxEntries || bytes != h.count * sizeof(Region) || h.flag > 1) return false;
      m.regions.resize(h.count);
      if (bytes > 0) std::memcpy(m.regions.data(), payload, bytes);
      for (const Region& r : m.regions) {
        if (r.type > 1 || r.reserved != 0 || r.len == 0 || r.addr + r.len < r.addr) return false;
      }
      break;
    case Kind::kTransfer:
      if (h.count == 0 || h.count > kMaxEntries || bytes != h.count * sizeof(Desc) || h.flag > 1) return false;
      m.descs.resize(h.count);
      std::memcpy(m.descs.data(), payload, bytes);
      for (const Desc& d : m.descs) {
        if (d.len == 0 || d.local + d.len < d.local || d.remote + d.len < d.remote) return false;
      }
      break;
    case Kind::kAnswer:
      if (h.count != 0 || bytes != 0 || h.flag != 0 || !answer_status_known(h.status)) return false;
      break;
    default:
      return false;
  }
  *out = std::move(m);
  return true;
}

}  // namespace dlslime::ascend::simwire
