// The messages between simulated HIXL engines (sim_hixl.cpp), one per SOCK_SEQPACKET
// message, so the socket keeps their boundaries. Kept apart from the engine so that the
// codec and its limits can be tested without sockets.
//
// A connection is one link: the connecting engine (requester) sends HELLO with its name,
// the listening engine (responder) answers with its registered memory as SNAPSHOT parts,
// then the requester sends TRANSFER and NOTIFY requests and the responder answers each
// (an ANSWER per message, with the request's id). Every message is a fixed 24-byte header
// and a payload whose size the header states exactly; parse() refuses anything else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dlslime::ascend::simwire {

inline constexpr uint32_t kMagic = 0x31584853;  // "SHX1": a change of the layout changes it

enum class Kind : uint8_t { kHello = 1, kSnapshot = 2, kTransfer = 3, kNotify = 4, kAnswer = 5 };

// One registered region, as SNAPSHOT carries it. type: 0 device, 1 host.
struct Region {
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t type = 0;
  uint32_t reserved = 0;
};
// One copy of a TRANSFER: local is the requester's host-visible address (its NPU memory
// already translated to the simulation's read-write view), remote the responder's own.
struct Desc {
  uint64_t local = 0;
  uint64_t remote = 0;
  uint64_t len = 0;
};
static_assert(sizeof(Region) == 24 && sizeof(Desc) == 24, "no implicit padding on the wire");

inline constexpr size_t kHeaderSize = 24;
inline constexpr size_t kMaxName = 256;       // an engine name ("ip:port")
inline constexpr size_t kMaxText = 1024;      // a notify's payload (kMaxNotifyField)
inline constexpr size_t kMaxEntries = 1024;   // regions or descs in one message; more go in parts
inline constexpr size_t kMaxMessage = kHeaderSize + kMaxEntries * sizeof(Desc);

struct Message {
  Kind kind = Kind::kHello;
  uint8_t flag = 0;      // TRANSFER: 0 READ, 1 WRITE; SNAPSHOT: 1 on the last part
  uint32_t status = 0;   // ANSWER: a HixlStatus
  uint64_t req = 0;      // TRANSFER, NOTIFY, ANSWER: the request's id
  std::string text;      // HELLO: the sender's engine name; NOTIFY: the payload
  std::vector<Region> regions;  // SNAPSHOT
  std::vector<Desc> descs;      // TRANSFER
};

std::vector<uint8_t> encode(const Message& m);
// False when `data` is not exactly one well-formed message within the limits above.
bool parse(const uint8_t* data, size_t size, Message* out);

}  // namespace dlslime::ascend::simwire
