// libFuzzer target: the INITIATOR role. This endpoint has ops in flight on two dialed
// lanes; the fuzz input is what a hostile peer answers (fuzz_tcp_stream covers the target
// role: a peer's requests on an accepted connection).
//
// Per input: a fresh TcpEndpointImpl on this thread's io_context (the test constructor:
// no I/O thread, this thread polls) with two lanes adopted from socketpairs, and four ops
// submitted: a read of 6 pieces striped over both lanes (several requests per lane), a
// write striped over both lanes, a send, and a one-piece read. Every op's local memory
// is its own heap block of exactly its size. Once the request frames have been written,
// they are read off the feeder sockets and parsed, so the input can name ops, requests
// and lanes by index instead of by raw 64-bit ids. Then the input is decoded into
// records, each one answer (or garbage) on a lane, delivered and polled in turn, and at
// the end the endpoint is shut down.
//
// The oracle: the moment an op's future completes, its block is freed (in the
// continuation, which runs inline: this thread opens no CompletionScope), so any byte the
// engine places into it or reads from it afterwards is an ASan heap-use-after-free. A
// read that reports success must have placed all its bytes (nbytes == its length) and
// exactly the bytes the peer sent for each piece (every answer's payload is a pattern of
// its destination offset). After shutdown every future is done.
//
// Input format, a sequence of records; each starts with a control byte c:
//   bit 0      lane (or: take the other lane than the one the answer belongs on)
//   bits 1..3  kind
//   bit 4      batch: deliver together with the next record (one read, one handler)
//   bits 5..7  variant v
// Kinds (S = an op selector byte: S % 5 < 4 picks an op, else an op id nobody used):
//   0 READ_DATA S R [..]: an answer to request R % n of op S, on that request's lane
//     (bit 0 set: on the other lane). v <= 2 correct; 3 error status; 4 index and count
//     from two more bytes; 5 length off by a signed byte; 6 the payload cut in half;
//     7 one piece fewer than requested.
//   1 WRITE_ACK S R: on lane R % n of the lanes that carried op S (bit 0: the other one);
//     v >= 4 carries an error status and text.
//   2 SEND_ACK S: on the lane of bit 0; v >= 4 an error status and text.
//   3 GOODBYE on the lane of bit 0.
//   4 N bytes: raw bytes (v = 0), or v > 0: (N + 1) << (v + 3) zero bytes (bulk payload).
//   5 40 bytes: a raw frame header, followed by its payload (zeros) if it parses.
//   6 the previous record's bytes again, on the lane of bit 0 (duplicates).
//   7 S: the correct complete answer to op S (all its requests, or an ack per lane);
//     bit 0: every frame on the other lane; v odd: in reverse order.
// Before sending, the peer's stream is canonicalised as the engine will frame it: the
// piece lists of requests from the peer (WRITE_DATA, READ_REQUEST on a dialed lane, which
// the engine serves) are redirected from the ops' regions to a spare region that is never
// freed (otherwise a freed op block would be a false report through the target role), and
// a well-formed READ_DATA's payload is rewritten to the expected pattern.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <nlohmann/json.hpp>

#include "core/op_state.h"
#include "core/memory_registry.h"
#include "dlslime/future.h"
#include "dlslime/logging.h"
#include "fuzz_common.h"
#include "tcp/frame_codec.h"
#include "tcp/tcp_endpoint_impl.h"

using namespace dlslime;
using namespace dlslime::tcp;

namespace {

constexpr int kLanes = 2;
constexpr uint64_t kChunk = 16384;
constexpr uint64_t kPeerId = 0x7EE5;
constexpr size_t kMaxAutoPayload = 256 * 1024;  // payload a raw header (kind 5) may get

// The byte the peer sends for offset `off` of op k's block; blocks start as its inverse.
uint8_t pattern(int k, uint64_t off) { return static_cast<uint8_t>((off * 151 + (off >> 8) + 37 * k) ^ 0x5A); }

struct Run {  // one read request as it arrived: pieces [index, index + count)
  int lane;
  uint32_t index;
  uint32_t count;
  uint64_t bytes;
};

struct Op {
  OpKind kind;
  std::vector<uint64_t> items;  // item lengths, back to back in the block
  uint64_t size = 0;
  uint8_t* block = nullptr;  // freed the moment the future completes
  int32_t local_handle = -1;
  int32_t remote_handle = -1;  // our handle of the peer region it targets
  int32_t peer_handle = -1;    // that region's handle on the wire
  uint64_t id = 0;             // learned from its frames
  std::vector<Run> runs;       // read: its requests, by first piece
  std::vector<std::pair<uint64_t, uint64_t>> pieces;  // read: (block offset, length) by index
  std::vector<int> lanes;      // write: lanes that carried its frames
  Future future;
  bool completed = false;
};

constexpr std::array<OpKind, 4> kKinds = {OpKind::kRead, OpKind::kWrite, OpKind::kSend, OpKind::kRead};
const std::array<std::vector<uint64_t>, 4> kItems = {
    std::vector<uint64_t>{20000, 20000, 3000, 100},  // 6 pieces, striped, 5 requests
    std::vector<uint64_t>{5000, 30000},             // striped over both lanes
    std::vector<uint64_t>{3000},                    // a message (lane 0)
    std::vector<uint64_t>{64},                      // one piece, one request
};

// The bytes this side sends on one lane, canonicalised as the engine will frame them.
struct LaneOut {
  int fd = -1;
  bool gone = false;           // the engine closed it (or the socket failed)
  std::vector<uint8_t> buf;    // not sent yet; [0, ready) is final
  size_t ready = 0;
  bool dead_stream = false;    // a header failed to parse: the engine stops reading there
  uint8_t hdr[kFrameHeaderSize];
  size_t hdr_have = 0;
  uint64_t payload_left = 0;
  uint64_t list_left = 0, list_pos = 0;  // a request's piece list being passed
  // A READ_DATA payload being rewritten: destinations (block offset, length) of op pat_op.
  int pat_op = -1;
  std::vector<std::pair<uint64_t, uint64_t>> segs;
  size_t seg = 0;
  uint64_t seg_pos = 0;
};

struct Harness {
  asio::io_context& io;
  std::shared_ptr<TcpEndpointImpl> ep;
  std::array<Op, 4> ops;
  std::array<LaneOut, kLanes> out;
  std::vector<int32_t> op_handles;  // local handles of the ops' regions
  int32_t spare_handle = -1;
  std::vector<uint8_t> captured[kLanes];  // what the engine wrote before the answers
  bool capturing = true;

  int op_of_peer_handle(int32_t h) const {
    for (int k = 0; k < 4; ++k) {
      if (ops[k].kind != OpKind::kSend && ops[k].peer_handle == h) return k;
    }
    return -1;
  }
  int op_of_id(uint64_t id) const {
    for (int k = 0; k < 4; ++k) {
      if (ops[k].id == id) return k;
    }
    return -1;
  }

  // ---- canonicalising the peer's stream (see the file comment)
  void scan(LaneOut& o) {
    size_t p = o.ready;
    while (p < o.buf.size()) {
      if (o.dead_stream) {
        p = o.buf.size();
        break;
      }
      if (o.payload_left == 0) {  // a header
        o.hdr[o.hdr_have++] = o.buf[p++];
        if (o.hdr_have < kFrameHeaderSize) continue;
        o.hdr_have = 0;
        FrameHeader h;
        if (!parse_frame_header(o.hdr, &h)) {
          o.dead_stream = true;
          continue;
        }
        o.payload_left = payload_size(h);
        o.list_left = 0;
        o.list_pos = 0;
        o.pat_op = -1;
        if (h.type == FrameType::kWriteData) o.list_left = h.offset * kPieceSize;
        if (h.type == FrameType::kReadRequest) o.list_left = h.length;
        if (h.type == FrameType::kReadData && h.status == 0) plan_pattern(o, h);
        continue;
      }
      if (o.list_left > 0) {
        if (o.list_pos % kPieceSize == 0) {  // a piece's handle: all 4 bytes, or wait for them
          if (o.buf.size() - p < 4) break;
          int32_t handle;
          std::memcpy(&handle, &o.buf[p], 4);  // little-endian, like the wire
          for (int32_t own : op_handles) {
            if (handle == own) std::memcpy(&o.buf[p], &spare_handle, 4);
          }
          p += 4;
          o.list_pos += 4;
          o.list_left -= 4;
          o.payload_left -= 4;
          continue;
        }
        ++p;
        ++o.list_pos;
        --o.list_left;
        --o.payload_left;
        continue;
      }
      if (o.pat_op >= 0 && o.seg < o.segs.size()) {
        o.buf[p] = pattern(o.pat_op, o.segs[o.seg].first + o.seg_pos);
        if (++o.seg_pos == o.segs[o.seg].second) {
          ++o.seg;
          o.seg_pos = 0;
        }
      }
      ++p;
      --o.payload_left;
    }
    o.ready = p;
  }

  void plan_pattern(LaneOut& o, const FrameHeader& h) {
    const int k = op_of_id(h.op_id);
    if (k < 0 || ops[k].kind != OpKind::kRead) return;
    const auto& pieces = ops[k].pieces;
    if (h.index >= pieces.size() || h.offset > pieces.size() - h.index) return;
    uint64_t sum = 0;
    o.segs.clear();
    for (uint64_t i = h.index; i < h.index + h.offset; ++i) {
      sum += pieces[i].second;
      o.segs.push_back(pieces[i]);
    }
    if (sum != h.length) return;
    o.pat_op = k;
    o.seg = 0;
    o.seg_pos = 0;
  }

  void queue(int lane, const uint8_t* data, size_t n) {
    LaneOut& o = out[lane];
    if (o.gone) return;
    o.buf.insert(o.buf.end(), data, data + n);
    scan(o);
  }

  // Sends what is final, polls and reads what the engine writes until nothing moves.
  void settle() {
    static uint8_t sink[1 << 16];
    int idle = 0;
    for (int round = 0; round < 100000 && idle < 3; ++round) {
      bool progress = false;
      for (int lane = 0; lane < kLanes; ++lane) {
        LaneOut& o = out[lane];
        if (o.gone || o.ready == 0) continue;
        const ssize_t n = ::send(o.fd, o.buf.data(), o.ready, MSG_NOSIGNAL);
        if (n > 0) {
          o.buf.erase(o.buf.begin(), o.buf.begin() + n);
          o.ready -= static_cast<size_t>(n);
          progress = true;
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          o.gone = true;
        }
      }
      if (io.stopped()) io.restart();
      if (io.poll() > 0) progress = true;
      for (int lane = 0; lane < kLanes; ++lane) {
        LaneOut& o = out[lane];
        if (o.gone) continue;
        for (;;) {
          const ssize_t n = ::recv(o.fd, sink, sizeof sink, 0);
          if (n > 0) {
            if (capturing) captured[lane].insert(captured[lane].end(), sink, sink + n);
            progress = true;
            continue;
          }
          if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) o.gone = true;
          break;
        }
      }
      idle = progress ? 0 : idle + 1;
    }
  }

  // ---- the requests this endpoint sent
  void learn_requests() {
    for (int lane = 0; lane < kLanes; ++lane) {
      const std::vector<uint8_t>& s = captured[lane];
      size_t p = 0;
      while (p + kFrameHeaderSize <= s.size()) {
        FrameHeader h;
        FUZZ_CHECK(parse_frame_header(&s[p], &h));
        p += kFrameHeaderSize;
        const uint64_t n = payload_size(h);
        FUZZ_CHECK(n <= s.size() - p);
        const uint8_t* payload = &s[p];
        p += n;
        if (h.type == FrameType::kSendData) {
          Op& op = ops[2];
          FUZZ_CHECK(op.id == 0 || op.id == h.op_id);
          op.id = h.op_id;
          continue;
        }
        if (h.type != FrameType::kReadRequest && h.type != FrameType::kWriteData) continue;
        const uint64_t count = h.type == FrameType::kReadRequest ? h.length / kPieceSize : h.offset;
        FUZZ_CHECK(count > 0);
        const int k = op_of_peer_handle(parse_piece(payload).handle);
        FUZZ_CHECK(k >= 0);
        Op& op = ops[k];
        FUZZ_CHECK(op.id == 0 || op.id == h.op_id);
        op.id = h.op_id;
        if (h.type == FrameType::kWriteData) {
          if (op.lanes.empty() || op.lanes.back() != lane) op.lanes.push_back(lane);
          continue;
        }
        uint64_t bytes = 0;
        if (op.pieces.size() < h.index + count) op.pieces.resize(h.index + count);
        for (uint64_t i = 0; i < count; ++i) {
          const Piece piece = parse_piece(payload + i * kPieceSize);
          FUZZ_CHECK(piece.handle == op.peer_handle);
          op.pieces[h.index + i] = {piece.offset, piece.length};  // remote offset = block offset
          bytes += piece.length;
        }
        op.runs.push_back({lane, h.index, static_cast<uint32_t>(count), bytes});
      }
      FUZZ_CHECK(p == s.size());  // whole frames only: the requests were written out
    }
    for (Op& op : ops) {
      FUZZ_CHECK(op.id != 0);
      if (op.kind == OpKind::kRead) {
        std::sort(op.runs.begin(), op.runs.end(), [](const Run& a, const Run& b) { return a.index < b.index; });
        uint64_t total = 0;
        for (const Run& r : op.runs) total += r.bytes;
        FUZZ_CHECK(total == op.size);
      }
    }
  }

  // ---- frames of the answers
  static void put_header(std::vector<uint8_t>& v, const FrameHeader& h) {
    uint8_t raw[kFrameHeaderSize];
    encode_frame_header(h, raw);
    v.insert(v.end(), raw, raw + kFrameHeaderSize);
  }
  static FrameHeader header(FrameType type, uint64_t op_id, int32_t status = 0, uint64_t length = 0) {
    FrameHeader h;
    h.type = type;
    h.op_id = op_id;
    h.status = status;
    h.length = length;
    return h;
  }
  // An acknowledgement or answer with an error status and a short text.
  static void put_error(std::vector<uint8_t>& v, FrameHeader h, int32_t status, size_t text) {
    static const char kText[] = "refused by the hostile peer, who has a long story to tell you";
    h.status = status;
    h.length = std::min(text, sizeof kText - 1);
    put_header(v, h);
    v.insert(v.end(), kText, kText + h.length);
  }
  void put_read_answer(std::vector<uint8_t>& v, uint64_t op_id, uint32_t index, uint32_t count, uint64_t length,
                       uint64_t payload) {
    FrameHeader h = header(FrameType::kReadData, op_id, 0, length);
    h.index = index;
    h.offset = count;
    put_header(v, h);
    v.resize(v.size() + payload, 0);  // canonicalised into the pattern by scan()
  }
};

struct Fixture {
  Fixture() {
    set_log_level("off");
    spare = static_cast<uint8_t*>(std::malloc(4096));
    std::memset(spare, 0xEE, 4096);
    options.lanes = kLanes;
    options.chunk_size = kChunk;
    options.op_timeout = std::chrono::milliseconds(0);  // no timers: deterministic
    options.unexpected_buffer_bytes = 64 * 1024;
  }
  asio::io_context io;
  TcpOptions options;
  uint8_t* spare;  // the region the peer's own requests may use; never freed
};

Fixture& fixture() {
  static Fixture* f = new Fixture();
  return *f;
}

// Reads input bytes; past the end, zeros.
struct Input {
  const uint8_t* data;
  size_t size;
  size_t pos = 0;
  bool empty() const { return pos >= size; }
  uint8_t byte() { return pos < size ? data[pos++] : 0; }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Fixture& fx = fixture();
  auto regions = std::make_shared<MemoryRegistry>();
  Harness hx{fx.io, std::make_shared<TcpEndpointImpl>(fx.io, fx.options, regions)};
  TcpEndpointImpl& ep = *hx.ep;
  hx.spare_handle = regions->add("spare", reinterpret_cast<uintptr_t>(fx.spare), 0, 4096);

  for (int lane = 0; lane < kLanes; ++lane) {
    int sv[2];
    FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    FUZZ_CHECK(::fcntl(sv[1], F_SETFL, ::fcntl(sv[1], F_GETFL) | O_NONBLOCK) == 0);
    hx.out[lane].fd = sv[1];
    asio::ip::tcp::socket socket(fx.io);
    std::error_code ec;
    socket.assign(asio::ip::tcp::v4(), sv[0], ec);
    FUZZ_CHECK(!ec);
    ep.adopt_dialed_for_test(std::move(socket), kPeerId);
  }

  for (int k = 0; k < 4; ++k) {
    Op& op = hx.ops[k];
    op.kind = kKinds[k];
    op.items = kItems[k];
    for (uint64_t n : op.items) op.size += n;
    op.block = static_cast<uint8_t*>(std::malloc(op.size));
    for (uint64_t i = 0; i < op.size; ++i) op.block[i] = static_cast<uint8_t>(~pattern(k, i));
    OpRequest req;
    req.kind = op.kind;
    if (op.kind == OpKind::kSend) {
      req.chunk = {reinterpret_cast<uintptr_t>(op.block), 0, op.size};
    } else {
      const std::string name = "op" + std::to_string(k);
      op.local_handle = regions->add(name, reinterpret_cast<uintptr_t>(op.block), 0, op.size);
      hx.op_handles.push_back(op.local_handle);
      op.peer_handle = 100 + k;
      op.remote_handle = ep.remote_regions.add("peer" + name, 1 << 20, op.peer_handle);
      uint64_t off = 0;
      for (uint64_t n : op.items) {
        Assignment a;
        a.local_handle = op.local_handle;
        a.remote_handle = op.remote_handle;
        a.source_offset = off;
        a.target_offset = off;  // so a request's piece offsets are block offsets
        a.length = n;
        req.assignments.push_back(a);
        off += n;
      }
    }
    op.future = ep.submit(std::move(req));
    FUZZ_CHECK(op.future.valid());
    op.future.state()->on_complete([&op, k](const OpState& s) {
      FUZZ_CHECK(!op.completed);
      op.completed = true;
      if (op.kind == OpKind::kRead && s.status().is_ok()) {
        FUZZ_CHECK(s.nbytes() == op.size);
        for (uint64_t i = 0; i < op.size; ++i) FUZZ_CHECK(op.block[i] == pattern(k, i));
      }
      // From here on the op's memory belongs to the application again: it frees it.
      std::free(op.block);
    });
  }

  hx.settle();
  hx.capturing = false;
  for (const Op& op : hx.ops) FUZZ_CHECK(!op.completed);  // nothing answered yet
  hx.learn_requests();

  Input in{data, size};
  std::vector<uint8_t> pending[kLanes];  // a batch being built
  std::vector<uint8_t> last;             // the previous record's bytes (kind 6)
  auto select = [&](uint8_t s) -> int { return s % 5 < 4 ? s % 5 : -1; };
  auto id_of = [&](int k, uint8_t s) -> uint64_t { return k >= 0 ? hx.ops[k].id : 1000 + s; };
  while (!in.empty()) {
    const uint8_t c = in.byte();
    const int bit = c & 1;
    const int kind = (c >> 1) & 7;
    const bool batch = (c & 0x10) != 0;
    const int v = c >> 5;
    std::vector<uint8_t> rec;
    int lane = bit;
    switch (kind) {
      case 0: {  // READ_DATA
        const uint8_t s = in.byte(), r = in.byte();
        const int k = select(s);
        const uint64_t id = id_of(k, s);
        const Op* op = k >= 0 ? &hx.ops[k] : nullptr;
        if (op == nullptr || op->runs.empty()) {  // an answer for an op that asked nothing
          hx.put_read_answer(rec, id, r, 1 + v, 16, 16);
          break;
        }
        const Run& run = op->runs[r % op->runs.size()];
        lane = run.lane ^ bit;
        FrameHeader h = Harness::header(FrameType::kReadData, id);
        h.index = run.index;
        h.offset = run.count;
        if (v <= 2) {
          hx.put_read_answer(rec, id, run.index, run.count, run.bytes, run.bytes);
        } else if (v == 3) {
          Harness::put_error(rec, h, 400 + r % 20, r % 64);
        } else if (v == 4) {
          const uint32_t index = in.byte(), count = in.byte();
          uint64_t length = 0;
          for (uint64_t i = index; i < index + count && i < op->pieces.size(); ++i) length += op->pieces[i].second;
          hx.put_read_answer(rec, id, index, count, length, length);
        } else if (v == 5) {
          const auto delta = static_cast<int8_t>(in.byte());
          const uint64_t length = run.bytes + delta;
          hx.put_read_answer(rec, id, run.index, run.count, length, std::min<uint64_t>(length, kMaxAutoPayload));
        } else if (v == 6) {
          hx.put_read_answer(rec, id, run.index, run.count, run.bytes, run.bytes / 2);
        } else {
          const uint32_t count = run.count - 1;
          uint64_t length = 0;
          for (uint32_t i = run.index; i < run.index + count; ++i) length += op->pieces[i].second;
          hx.put_read_answer(rec, id, run.index, count, length, length);
        }
        break;
      }
      case 1: {  // WRITE_ACK
        const uint8_t s = in.byte(), r = in.byte();
        const int k = select(s);
        if (k >= 0 && !hx.ops[k].lanes.empty()) lane = hx.ops[k].lanes[r % hx.ops[k].lanes.size()] ^ bit;
        const FrameHeader h = Harness::header(FrameType::kWriteAck, id_of(k, s));
        if (v >= 4) {
          Harness::put_error(rec, h, 400 + r % 20, r % 64);
        } else {
          Harness::put_header(rec, h);
        }
        break;
      }
      case 2: {  // SEND_ACK
        const uint8_t s = in.byte();
        const FrameHeader h = Harness::header(FrameType::kSendAck, id_of(select(s), s));
        if (v >= 4) {
          Harness::put_error(rec, h, 400 + s % 20, s % 64);
        } else {
          Harness::put_header(rec, h);
        }
        break;
      }
      case 3: Harness::put_header(rec, Harness::header(FrameType::kGoodbye, 0)); break;
      case 4: {  // raw bytes, or filler
        const size_t want = in.byte();
        if (v > 0) {
          rec.assign((want + 1) << (v + 3), 0);
          break;
        }
        const size_t n = std::min(want, size - std::min(size, in.pos));
        rec.assign(data + in.pos, data + in.pos + n);
        in.pos += n;
        break;
      }
      case 5: {  // a raw header and a payload of zeros
        uint8_t raw[kFrameHeaderSize];
        for (uint8_t& b : raw) b = in.byte();
        rec.assign(raw, raw + kFrameHeaderSize);
        FrameHeader h;
        if (parse_frame_header(raw, &h)) rec.resize(rec.size() + std::min<uint64_t>(payload_size(h), kMaxAutoPayload), 0);
        break;
      }
      case 6: rec = last; break;  // the previous record again, on the lane of bit 0
      case 7: {  // the complete, correct answer to one op
        const uint8_t s = in.byte();
        const int k = select(s);
        if (k < 0) break;
        const Op& op = hx.ops[k];
        std::vector<std::pair<int, std::vector<uint8_t>>> frames;  // (lane, bytes)
        if (op.kind == OpKind::kRead) {
          for (const Run& run : op.runs) {
            frames.push_back({run.lane ^ bit, {}});
            hx.put_read_answer(frames.back().second, op.id, run.index, run.count, run.bytes, run.bytes);
          }
        } else if (op.kind == OpKind::kWrite) {
          for (int l : op.lanes) {
            frames.push_back({l ^ bit, {}});
            Harness::put_header(frames.back().second, Harness::header(FrameType::kWriteAck, op.id));
          }
        } else {
          frames.push_back({bit, {}});
          Harness::put_header(frames.back().second, Harness::header(FrameType::kSendAck, op.id));
        }
        if (v & 1) std::reverse(frames.begin(), frames.end());
        for (auto& [l, bytes] : frames) pending[l].insert(pending[l].end(), bytes.begin(), bytes.end());
        last = frames.empty() ? std::vector<uint8_t>{} : frames.back().second;
        rec.clear();
        lane = -1;
        break;
      }
    }
    if (lane >= 0) {
      pending[lane].insert(pending[lane].end(), rec.begin(), rec.end());
      last = std::move(rec);
    }
    if (batch) continue;
    for (int l = 0; l < kLanes; ++l) {
      hx.queue(l, pending[l].data(), pending[l].size());
      pending[l].clear();
    }
    hx.settle();
  }
  for (int l = 0; l < kLanes; ++l) hx.queue(l, pending[l].data(), pending[l].size());
  hx.settle();

  ep.shutdown();
  hx.settle();
  for (const Op& op : hx.ops) FUZZ_CHECK(op.completed);  // shutdown ends every op
  for (LaneOut& o : hx.out) {
    ::close(o.fd);
    o.gone = true;
  }
  hx.ep.reset();
  hx.settle();  // handlers still holding the endpoint run (and release it)
  return 0;
}
