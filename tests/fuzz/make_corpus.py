#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/seed-*).

The wire format is encoded by hand from docs/tcp.md (not with the library's codec), so the
seeds also check the documented protocol. Run it again after changing a seed; the files
are checked in. Crash reproducers found later go to corpus/<target>/crash-* by hand
(scripts/fuzz.sh replays every file in the directory)."""

import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

WRITE_DATA, WRITE_ACK, READ_REQUEST, READ_DATA, SEND_DATA, SEND_ACK, GOODBYE = range(1, 8)
LAST = 1


def frame(ftype, flags=0, status=0, op_id=1, handle=0, index=0, offset=0, length=0, magic=0x5D1E):
    return struct.pack("<HBBiQiIQQ", magic, ftype, flags, status, op_id, handle, index, offset, length)


def read_request(pieces, op_id=1, index=0):
    """READ_REQUEST: the header (index tags the first piece; length = 24 per piece) and one
    descriptor per (handle, offset, length) piece: handle i32, reserved u32, offset u64, length u64."""
    body = b"".join(struct.pack("<iIQQ", h, 0, off, n) for h, off, n in pieces)
    return frame(READ_REQUEST, op_id=op_id, index=index, length=len(body)) + body


def write_data(pieces, data=None, flags=LAST, op_id=1, index=0, count=None, length=None):
    """WRITE_DATA: the header (offset = the number of pieces N, length = 24*N + D, index tags
    the first piece, handle unused), N descriptors like a read request's, then the D data
    bytes of the pieces back to back (by default a byte ramp of the pieces' total size).
    `count` and `length` override the header's N and length for malformed frames."""
    body = b"".join(struct.pack("<iIQQ", h, 0, off, n) for h, off, n in pieces)
    if data is None:
        data = bytes(i & 0xFF for i in range(sum(n for _, _, n in pieces)))
    n = len(pieces) if count is None else count
    total = len(body) + len(data) if length is None else length
    return frame(WRITE_DATA, flags, op_id=op_id, index=index, offset=n, length=total) + body + data


def hello(version=2, flags=0, lane=0, lanes=1, sender=0x1234, target=0, magic=b"DLSLIMEH"):
    return (magic + struct.pack("<HHHHQQ", version, flags, lane, lanes, sender, target)).ljust(64, b"\0")


def reply(version=2, status=0, reason_len=0, endpoint=0x99, magic=b"DLSLIMER"):
    return (magic + struct.pack("<HHIQ", version, status, reason_len, endpoint)).ljust(32, b"\0")


CLEANED = set()


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if target not in CLEANED:  # seeds no longer written here go; crash reproducers stay
        CLEANED.add(target)
        for old in os.listdir(d):
            if old.startswith("seed-"):
                os.remove(os.path.join(d, old))
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def frames():
    t = "fuzz_frame_header"
    # WRITE_DATA headers: offset = the number of pieces N (1..1024), length = 24*N + D.
    write(t, "write-data", frame(WRITE_DATA, LAST, offset=1, length=24 + 4096))
    write(t, "write-data-pieces", frame(WRITE_DATA, 0, index=3, offset=5, length=5 * 24 + 100))
    write(t, "write-data-empty-pieces", frame(WRITE_DATA, LAST, offset=2, length=2 * 24))  # D = 0
    write(t, "write-data-max", frame(WRITE_DATA, LAST, offset=1024, length=1024 * 24 + (64 << 20)))
    write(t, "write-data-zero-pieces", frame(WRITE_DATA, LAST, offset=0, length=0))
    write(t, "write-data-1025-pieces", frame(WRITE_DATA, LAST, offset=1025, length=1025 * 24))
    write(t, "write-data-short-list", frame(WRITE_DATA, LAST, offset=2, length=47))  # length < 24*N
    write(t, "write-data-oversized", frame(WRITE_DATA, LAST, offset=1, length=24 + (64 << 20) + 1))
    write(t, "write-ack-ok", frame(WRITE_ACK))
    write(t, "write-ack-error", frame(WRITE_ACK, status=404, length=60))
    write(t, "read-request", frame(READ_REQUEST, index=2, length=2 * 24))  # header of a 2-piece list
    write(t, "read-request-max", frame(READ_REQUEST, index=7, length=1024 * 24))
    write(t, "read-request-bad-length", frame(READ_REQUEST, length=25))  # not whole pieces
    write(t, "read-data", frame(READ_DATA, index=2, offset=2, length=1 << 20))  # offset = pieces answered
    write(t, "read-data-error", frame(READ_DATA, status=405, offset=3, length=1024))
    write(t, "send-data", frame(SEND_DATA, LAST, offset=100, length=100))
    write(t, "send-ack", frame(SEND_ACK, status=408, length=10))
    write(t, "goodbye", frame(GOODBYE))
    write(t, "bad-magic", frame(WRITE_DATA, offset=1, length=24, magic=0xFFFF))
    write(t, "bad-type", frame(9))
    write(t, "bad-flags", frame(WRITE_DATA, flags=0x80, offset=1, length=24))
    write(t, "huge-length", frame(SEND_DATA, length=2**64 - 1))


def handshakes():
    t = "fuzz_handshake"
    write(t, "hello", b"\0" + hello())
    write(t, "hello-lane3of4", b"\0" + hello(lane=3, lanes=4, target=0x99))
    write(t, "hello-v3", b"\0" + hello(version=3))
    write(t, "hello-token-flag", b"\0" + hello(flags=1))
    write(t, "hello-unknown-flag", b"\0" + hello(flags=2))
    write(t, "hello-bad-lane", b"\0" + hello(lane=4, lanes=4))
    write(t, "hello-no-sender", b"\0" + hello(sender=0))
    write(t, "reply-ok", b"\1" + reply())
    write(t, "reply-refused", b"\1" + reply(status=413, reason_len=40))
    write(t, "reply-long-reason", b"\1" + reply(status=411, reason_len=513))
    write(t, "reply-bad-magic", b"\1" + reply(magic=b"DLSLIMEX"))
    # Auth messages (src/tcp/auth.h): challenge = magic, nonce, acceptor id, MAC; proof = magic, MAC.
    write(t, "challenge", b"\2" + b"DLSLIMEC" + bytes(range(16)) + struct.pack("<Q", 7) + b"\xab" * 32)
    write(t, "challenge-bad-magic", b"\2" + b"DLSLIMER" + bytes(56))
    write(t, "proof", b"\3" + b"DLSLIMEP" + b"\xcd" * 32 + bytes(24))
    write(t, "proof-short", b"\3" + b"DLSLIMEP" + b"\xcd" * 5)


def streams():
    t = "fuzz_tcp_stream"
    # Regions at the target: handle 0 (4096 B), 1 (64 B), 2 (unregistered), 3 (1 B).
    payload = bytes(range(256)) * 16
    write(t, "write-ok", write_data([(0, 0, 4096)], payload, op_id=1))
    write(t, "write-two-frames", write_data([(1, 0, 32)], payload[:32], flags=0, op_id=2) +
          write_data([(1, 32, 32)], payload[:32], op_id=2, index=1))
    write(t, "write-out-of-bounds", write_data([(1, 60, 8)], b"x" * 8, op_id=3))
    write(t, "write-stale-handle", write_data([(2, 0, 4)], b"abcd", op_id=4))
    write(t, "write-offset-overflow", write_data([(0, 2**64 - 4, 8)], b"y" * 8, op_id=5))
    write(t, "write-multi-piece", write_data([(0, 0, 1), (0, 10, 7), (1, 0, 64), (3, 0, 1), (0, 4000, 96)], op_id=40) +
          write_data([(0, 100, 0), (3, 1, 0)], op_id=41))  # empty pieces, one at a region's end
    write(t, "write-max-pieces", write_data([(i % 2, (i * 3) % 64, 1) for i in range(1024)], op_id=42))
    # The 2nd piece is out of bounds: nothing of the frame is placed; then a valid write.
    write(t, "write-bad-piece", write_data([(0, 0, 16), (1, 60, 8), (0, 100, 4)], op_id=43) +
          write_data([(0, 0, 4)], b"good", op_id=44))
    write(t, "write-bad-piece-index", write_data([(0, 0, 4), (2, 0, 4), (3, 0, 2)], op_id=45, index=10))
    # The lengths do not add up to the data: 16 wanted, 10 come; 4 wanted, 8 come; a sum that
    # wraps around 2^64 to the data size.
    write(t, "write-mismatched-list", write_data([(0, 0, 8), (0, 8, 8)], b"m" * 10, op_id=46) +
          write_data([(1, 0, 4)], b"n" * 8, op_id=47) + write_data([(0, 0, 2**64 - 1), (0, 0, 2)], b"w", op_id=48) +
          write_data([(3, 0, 1)], b"!", op_id=49))
    write(t, "write-abandoned", write_data([(2, 0, 4)], b"lost", flags=0, op_id=50) +
          write_data([(0, 8, 4)], b"next", op_id=51))
    write(t, "write-zero-pieces", write_data([], count=0) + write_data([(0, 0, 1)], op_id=52))
    write(t, "write-1025-pieces", write_data([(0, 0, 1)] * 1025, op_id=53))
    write(t, "write-short-list", write_data([(0, 0, 0)] * 2, length=47, op_id=54) + bytes(47))
    write(t, "read-ok", read_request([(0, 100, 3000), (3, 0, 1)], op_id=6, index=0) +
          read_request([(1, 0, 64)], op_id=6, index=2))
    write(t, "read-out-of-bounds", read_request([(0, 0, 16), (3, 1, 1), (1, 0, 8)], op_id=7) +
          read_request([(0, 2**64 - 4, 8)], op_id=7, index=3))
    write(t, "read-bad-handle", read_request([(0, 0, 8), (2, 0, 4)], op_id=12) +
          read_request([(-1, 0, 1)], op_id=13))
    write(t, "read-bad-list-length", frame(READ_REQUEST, op_id=14, length=25) + bytes(25))
    write(t, "read-empty-list", frame(READ_REQUEST, op_id=15, length=0) + read_request([(0, 0, 1)], op_id=16))
    write(t, "send-message", frame(SEND_DATA, 0, op_id=8, offset=0, length=10) + b"0123456789" +
          frame(SEND_DATA, LAST, op_id=8, offset=10, length=5) + b"abcde")
    write(t, "send-big-direct", frame(SEND_DATA, LAST, op_id=9, offset=0, length=17000) + b"m" * 17000)
    # The fuzz endpoint holds 64 KiB of unmatched messages: the second header pauses reading.
    write(t, "send-flow-control", frame(SEND_DATA, LAST, op_id=10, offset=0, length=30000) + b"f" * 30000 +
          frame(SEND_DATA, LAST, op_id=11, offset=0, length=40000) + b"g" * 100)
    write(t, "send-abandoned", frame(SEND_DATA, 0, op_id=20, length=4) + b"half" +
          frame(SEND_DATA, LAST, op_id=21, length=4) + b"next")
    write(t, "send-bad-offset", frame(SEND_DATA, 0, op_id=22, offset=4, length=4) + b"oops")
    write(t, "acks-for-unknown-ops", frame(WRITE_ACK, op_id=99) + frame(SEND_ACK, status=404, op_id=98, length=3) +
          b"err" + frame(READ_DATA, op_id=97, offset=1, length=5) + b"stray" +
          frame(READ_DATA, status=404, op_id=96, offset=1, length=2) + b"no")
    write(t, "goodbye", write_data([(3, 0, 1)], b"z", op_id=30) + frame(GOODBYE))
    write(t, "garbage-after-frame", read_request([(0, 0, 8)], op_id=31) + b"\xde\xad\xbe\xef" * 10)
    write(t, "truncated", write_data([(0, 0, 100)], b"short", op_id=32, length=24 + 100))
    write(t, "truncated-list", write_data([(0, 0, 8), (1, 0, 8)], b"", op_id=33, length=2 * 24 + 16)[:40 + 30])


def initiator():
    """fuzz_tcp_initiator: records of the harness's own format (tests/fuzz/fuzz_tcp_initiator.cpp):
    a control byte (bit 0 lane, bits 1-3 kind, bit 4 batch, bits 5-7 variant) and its bytes.
    Ops by index: 0 = a read of 6 pieces in 5 requests over both lanes (requests 0-4 by first
    piece; request 3 is one 16 KiB piece on lane 1, request 4 two pieces), 1 = a write over both
    lanes, 2 = a send, 3 = a one-piece read."""
    t = "fuzz_tcp_initiator"
    # record kinds
    K_READ_DATA, K_WRITE_ACK, K_SEND_ACK, K_GOODBYE, K_RAW, K_RAW_HEADER, K_AGAIN, K_ANSWER = range(8)

    def rec(kind, *args, lane=0, batch=False, v=0):
        return bytes([lane | kind << 1 | (0x10 if batch else 0) | v << 5, *args])

    def answer(op, **kw):  # the complete, correct answer to one op
        return rec(K_ANSWER, op, **kw)

    def run(req, **kw):  # one correct answer to request `req` of op 0, on its lane
        return rec(K_READ_DATA, 0, req, **kw)

    def raw(data, lane=0):
        return b"".join(rec(K_RAW, len(data[i:i + 255]), lane=lane) + data[i:i + 255] for i in range(0, len(data), 255))

    everything = answer(0) + answer(1) + answer(2) + answer(3)
    write(t, "all-ok", everything)
    write(t, "all-ok-one-delivery", answer(0, batch=True) + answer(1, batch=True) + answer(2, batch=True) + answer(3))
    write(t, "all-ok-reverse", answer(0, v=1) + answer(1, v=1) + answer(3, v=1) + answer(2))
    write(t, "answers-on-wrong-lanes", answer(0, lane=1) + answer(1, lane=1) + answer(3, lane=1) + answer(2))
    write(t, "errors", rec(K_READ_DATA, 0, 3, v=3) + rec(K_WRITE_ACK, 1, 0, v=4) + rec(K_SEND_ACK, 2, v=4) +
          rec(K_READ_DATA, 3, 0, v=3) + everything)
    write(t, "bad-lengths", rec(K_READ_DATA, 0, 1, 7, v=5) + rec(K_READ_DATA, 3, 0, 0xFF, v=5) + everything)
    write(t, "pieces-never-requested", rec(K_READ_DATA, 0, 0, 2, 3, v=4) + rec(K_READ_DATA, 3, 0, 1, 1, v=4) +
          rec(K_READ_DATA, 0, 4, v=7) + rec(K_READ_DATA, 4, 0) + everything)
    write(t, "unknown-op-ids", rec(K_READ_DATA, 4, 0) + rec(K_WRITE_ACK, 9, 0) + rec(K_SEND_ACK, 4, v=4) +
          rec(K_RAW_HEADER, *frame(WRITE_ACK, op_id=2**64 - 1)) + everything)
    write(t, "goodbye-mid-answer", run(3, v=6) + rec(K_GOODBYE, lane=1) + rec(K_GOODBYE))
    write(t, "garbage", run(0) + raw(b"\xde\xad\xbe\xef" * 16, lane=1) + everything)
    write(t, "truncated-answer", run(3, v=6) + answer(3))
    write(t, "peer-requests-on-dialed-lanes", raw(read_request([(0, 0, 64), (1, 0, 16)], op_id=77)) +
          raw(write_data([(1, 0, 8), (0, 8, 8)], op_id=78), lane=1) +
          raw(frame(SEND_DATA, LAST, op_id=79, length=5) + b"hello") + everything)
    write(t, "write-ack-twice-one-lane", rec(K_WRITE_ACK, 1, 0) + rec(K_AGAIN) + rec(K_AGAIN, lane=1) + everything)
    write(t, "send-ack-for-write", rec(K_SEND_ACK, 1) + rec(K_SEND_ACK, 3) + everything)
    # Reproducers of the bugs of issue 10 item 2 (they fail on the code before its fix).
    # A write acknowledgement completes a read: success with no byte placed (nbytes check).
    write(t, "write-ack-completes-read", rec(K_WRITE_ACK, 0, 0) + answer(0))
    # ... or fails it: the read's memory is freed, then its answers are placed into it (ASan).
    write(t, "write-ack-error-then-read-data", rec(K_WRITE_ACK, 0, 5, v=4) + answer(0))
    # The same while an answer is half-way in on lane 1: its rest goes to freed memory.
    write(t, "write-ack-mid-answer", run(3, v=6) + rec(K_WRITE_ACK, 0, 0, v=4) + raw(bytes(300), lane=1))
    # Requests 0-3 answered, then request 0 twice more on lane 1: the read reports success
    # though pieces 4-5 never came (nbytes / content check).
    write(t, "read-data-duplicates-success", run(0) + run(1) + run(2) + run(3) + rec(K_AGAIN, lane=1) +
          run(0, lane=1))
    # A duplicate (an error answer) completes the read while request 3's answer is arriving
    # on lane 1; the rest of that answer is scattered through freed memory (ASan).
    write(t, "read-data-duplicate-mid-answer", run(0) + run(1) + run(2) + run(4) + run(3, v=6) +
          run(0, v=3) + raw(bytes(300), lane=1))
    # The same with only the header of request 3's answer in (op 0 has id 1; request 3 is
    # one 16 KiB piece): the engine reads the payload straight into the read's memory
    # (readv), which is freed when the next bytes come.
    write(t, "read-data-duplicate-mid-direct-read", run(0) + run(1) + run(2) + run(4) +
          raw(frame(READ_DATA, op_id=1, index=3, offset=1, length=16384), lane=1) + run(0, v=3) +
          rec(K_RAW, 15, lane=1, v=7))  # 16 KiB of filler: the rest of that answer


def nanoctrl():
    t = "fuzz_nanoctrl_request"
    routes = ["start_peer_agent", "heartbeat", "query", "get_peer_agent", "cleanup", "set_topology",
              "get_topology", "register_mr", "get_mr_info", "unregister_mr", "register", "unregister",
              "get_entity_info", "list_entities", "mailbox_post", "mailbox_recv", "metrics"]
    R = {name: i for i, name in enumerate(routes)}

    def rec(route, body, path_agent=0):
        sel = R[route] + 17 * path_agent
        text = body if isinstance(body, str) else json.dumps(body)
        return bytes([sel]) + text.encode()

    def seq(*records):
        return b"\xff".join(records)

    reg_a = rec("start_peer_agent", {"alias": "a", "address": "10.0.0.1", "endpoint_info": {"transport": "tcp"}})
    reg_b = rec("start_peer_agent", {"alias": "b", "scope": "s1"})
    write(t, "register", reg_a)
    write(t, "register-auto", rec("start_peer_agent", {"name_prefix": "agent", "metadata": {"k": [1, 2]}}))
    write(t, "lifecycle", seq(
        reg_a, rec("heartbeat", {"agent_name": "a"}), rec("query", {}), rec("get_peer_agent", {"name": "a"}),
        rec("register_mr", {"agent_name": "a", "mr_name": "kv:0", "mr_info": {"handle": 0, "length": 64}}),
        rec("register_mr", {"agent_name": "a", "mr_name": "flat", "addr": 4096, "length": 16, "rkey": 1}),
        rec("get_mr_info", {"dst": "a", "mr_name": "kv:0"}), rec("unregister_mr", {"agent_name": "a", "mr_name": "flat"}),
        rec("cleanup", {"agent_name": "a"})))
    write(t, "topology", seq(
        reg_a, rec("start_peer_agent", {"alias": "b"}),
        rec("set_topology", {"target_peers": ["b", "c"], "symmetric": True, "min_bw": 1.5}, path_agent=0),
        rec("get_topology", {}, path_agent=0), rec("get_topology", {"scope": "s1"}, path_agent=2),
        rec("cleanup", {"name": "b"})))
    write(t, "mailbox", seq(
        reg_a, rec("mailbox_post", {"to": "a", "message": {"x": 1}, "from": "b"}),
        rec("mailbox_post", {"to": "a", "message": "hi"}), rec("mailbox_recv", {"alias": "a", "timeout": 1, "max": 5}),
        rec("mailbox_recv", {"agent_name": "a", "max": 1000})))
    write(t, "entities", seq(
        rec("register", {"entity_id": "svc/0", "kind": "kv", "endpoint": "h:1", "metadata": {}, "resource": [1]}),
        rec("heartbeat", {"entity_id": "svc/0", "entity_type": "service"}),
        rec("get_entity_info", {"entity_id": "svc/0"}), rec("list_entities", {"kind": "kv"}),
        rec("unregister", {"entity_id": "svc/0"}), rec("metrics", "")))
    write(t, "scoped", seq(reg_b, rec("query", {"scope": "s1"}), rec("get_peer_agent", {"name": "b", "scope": "s1"})))
    write(t, "bad-bodies", seq(
        rec("start_peer_agent", "[1,2]"), rec("heartbeat", "{\"entity_id\": 5}"), rec("query", "{"),
        rec("register_mr", {"agent_name": "a"}), rec("start_peer_agent", {"alias": "bad:name"}),
        rec("mailbox_recv", {"alias": "a", "max": -1, "timeout": -5}), rec("start_peer_agent", "[" * 70 + "]" * 70),
        rec("set_topology", {"target_peers": "b"}, path_agent=3), rec("query", "   ")))


if __name__ == "__main__":
    frames()
    handshakes()
    streams()
    initiator()
    nanoctrl()
