#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dlslime/export.h"
#include "dlslime/future.h"
#include "dlslime/status.h"

namespace dlslime {

// One item of a one-sided batch, in DLSlime's order: `target_offset` is always the byte
// offset in the REMOTE region and `source_offset` the offset in the LOCAL region, for read
// and write alike. write: local[source_offset:+length] -> remote[target_offset:+length];
// read: remote[target_offset:+length] -> local[source_offset:+length].
struct Assignment {
  int32_t local_handle = -1;
  int32_t remote_handle = -1;
  uint64_t target_offset = 0;
  uint64_t source_offset = 0;
  uint64_t length = 0;
};

// A two-sided buffer: the bytes [addr+offset, addr+offset+length).
struct Chunk {
  uintptr_t addr = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// kSendNotify/kRecvNotify: notifications (docs/api.md "Notifications"), which every
// transport carries on its own channel.
enum class OpKind : uint8_t { kRead, kWrite, kWriteWithImm, kSend, kRecv, kImmRecv, kSendNotify, kRecvNotify };
DLSLIME_API const char* op_kind_name(OpKind kind) noexcept;

// Everything a transport needs to start one operation. read/write/send/recv and the imm
// ops are thin wrappers that fill one of these in and call Endpoint::submit.
struct OpRequest {
  OpKind kind = OpKind::kWrite;
  std::vector<Assignment> assignments;  // read, write, write_with_imm
  Chunk chunk;                          // send, recv
  uint32_t imm_data = 0;                // write_with_imm
  // read, write, write_with_imm, send: this op's deadline, counted from submit. Zero: the
  // endpoint's op_timeout (which may be "none"). Either way the op fails with kTimeout
  // once it passes, and its message names the limit that applied. Longer or shorter than
  // op_timeout alike; at most kMaxOpTimeout. recv, imm_recv: how long it waits for its
  // message or immediate, from submit; zero: the endpoint's recv deadline (TCP and RDMA
  // recv_timeout, none by default). Then it fails with kTimeout and the connection lives
  // (review F11: a target that only waits must not wait for ever on a silent peer).
  std::chrono::milliseconds timeout{0};
  // recv: the message must fill the buffer exactly (upstream DLSlime's exact_size). A
  // shorter one is consumed by this recv and fails it (kFailed, naming both sizes;
  // nbytes 0; the buffer may hold some or all of its bytes), and the sender's send fails
  // with the same status, so that the sender learns the message was refused, as for a
  // message longer than the buffer (kMessageTooLarge). Ignored by other ops.
  bool exact_size = false;
  // write: a notification the peer's recv_notify receives once every byte of this write is
  // in place there; kSendNotify: the notification itself. At most kMaxNotificationBytes
  // (InvalidArgumentError past that); ignored by other ops.
  std::optional<std::string> notification;

  static constexpr std::chrono::milliseconds kMaxOpTimeout{365LL * 24 * 3600 * 1000};  // a year
  static constexpr size_t kMaxNotificationBytes = 4096;
};

// The status every transport fails a recv(exact_size) with when its message (`message_bytes`)
// is shorter than the buffer (`buffer_bytes`): kFailed, naming both sizes.
DLSLIME_API Status exact_size_mismatch(uint64_t message_bytes, uint64_t buffer_bytes);

// What a transport can do, as data (NIXL/Mooncake style). Endpoint::submit rejects an op
// the capabilities exclude with NotImplementedError before the transport sees it.
struct Capabilities {
  const char* transport = "";
  bool read = false;
  bool write = false;
  bool send_recv = false;
  bool write_with_imm = false;
  bool imm_recv = false;
  bool notify = false;  // send_notify, recv_notify and write(..., notification)
  bool host_memory = false;
  bool device_memory = false;

  // Whether an op of this kind is among them (send and recv share send_recv, the two
  // notification ops share notify).
  DLSLIME_API bool supports(OpKind kind) const noexcept;
};

// The one interface every transport implements. Point to point: an endpoint talks to one
// peer, whose endpoint_info() it is given in connect(). Thread-safe: any thread may submit.
class DLSLIME_API Endpoint {
 public:
  virtual ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // What a peer needs to connect to this endpoint and to address its regions:
  // transport-specific keys plus "mr_info" {name: {...}}. Take it again after registering
  // more regions to publish them.
  virtual nlohmann::json endpoint_info() const = 0;
  // Connects to the peer described by its endpoint_info(). Symmetric: both sides call it,
  // in either order. Throws ConnectionError if the peer cannot be reached or refuses.
  virtual void connect(const nlohmann::json& peer_info) = 0;
  virtual bool is_connected() const = 0;

  // Registers [addr+offset, addr+offset+length) under `name`; returns the local handle.
  // Registering an existing name again replaces that region and returns a new handle.
  virtual int32_t register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset,
                                         uint64_t length) = 0;
  // Makes a remote handle from one entry of the peer's endpoint_info()["mr_info"].
  virtual int32_t register_remote_memory_region(const std::string& name, const nlohmann::json& mr_info_entry) = 0;
  // Throws NotFoundError if no local region has this name or handle.
  //
  // Lifetime contract (every transport): new operations and new peer requests naming the
  // region fail (UNKNOWN_HANDLE) from the moment this is called, and it returns only once
  // nothing in flight refers to the region's memory (an op's local buffers, a peer's write
  // being placed, a read answer being sent), so the memory may be freed as soon as it
  // returns. Transfers still running after the drain timeout (5 s) are revoked: their ops
  // fail and the connections carrying them close. Called from a completion callback (an
  // I/O thread, which waiting would deadlock) it revokes at once. Throws TimeoutError,
  // and the memory must not be freed, only if a use outlives its revocation. Registering
  // an existing name for other bytes drains the replaced region the same way.
  virtual void unregister_memory_region(const std::string& name) = 0;
  virtual void unregister_memory_region(int32_t handle) = 0;
  virtual nlohmann::json mr_info() const = 0;
  // mr_info()'s entry for one region, or null when there is none. The default takes the
  // whole table; the built-in transports look the one name up (a PeerAgent publishing one
  // region asks every connection's endpoint).
  virtual nlohmann::json mr_info_of(const std::string& name) const;

  // Starts one operation. Malformed requests throw InvalidArgumentError; failures while
  // the op runs (bounds, handles, peer loss, deadline) complete the future with a status.
  Future submit(OpRequest request);

  // `timeout`: OpRequest::timeout (zero: the endpoint's op_timeout); `exact_size`:
  // OpRequest::exact_size.
  Future read(std::vector<Assignment> assignments, std::chrono::milliseconds timeout = {});
  // `notification`: OpRequest::notification. The future completes once the write is done
  // and its notification has reached the peer (docs/api.md "Notifications").
  Future write(std::vector<Assignment> assignments, std::chrono::milliseconds timeout = {},
               std::optional<std::string> notification = std::nullopt);
  Future write_with_imm(std::vector<Assignment> assignments, uint32_t imm_data = 0,
                        std::chrono::milliseconds timeout = {});
  Future send(const Chunk& chunk, std::chrono::milliseconds timeout = {});
  Future recv(const Chunk& chunk, bool exact_size = false, std::chrono::milliseconds timeout = {});
  Future imm_recv(std::chrono::milliseconds timeout = {});
  // Notifications (every transport; docs/api.md "Notifications"). send_notify delivers
  // `notification` (at most OpRequest::kMaxNotificationBytes) after every write submitted
  // to this peer before it has completed; it completes once the peer holds it (or refused
  // it: a full inbox). recv_notify completes with the peer's oldest notification not yet
  // received (Future::notification()), waiting at most `timeout` (zero: recv_timeout).
  Future send_notify(std::string notification, std::chrono::milliseconds timeout = {});
  Future recv_notify(std::chrono::milliseconds timeout = {});

  virtual Capabilities capabilities() const = 0;
  // Idempotent. Pending ops complete with kCancelled; later ops fail the same way. A
  // connect() in progress returns at once (ConnectionError).
  //
  // Op contract: a future completes exactly once, after the transport has dropped every
  // reference to the op's memory; its callbacks (Future::on_complete) run after the
  // transport's bookkeeping, on the completing I/O thread. A peer's answer that does not
  // match its op (wrong kind, a second answer, a lane that owes none) fails the
  // connection and its ops with PROTOCOL_ERROR; it never completes an op early.
  virtual void shutdown() = 0;

 protected:
  Endpoint();
  virtual Future do_submit(OpRequest request) = 0;
  // True in a fork() child of the process that made this endpoint: its threads are not
  // here and its kernel objects are the parent's, so it may be neither used nor torn
  // down. submit() raises ConnectionError there (require_own_process()); transports
  // refuse the rest with the same call, and leak instead of shutting down.
  bool inherited_from_parent() const noexcept;
  void require_own_process() const;
  // What a call that needs a live endpoint (registering memory) raises after shutdown():
  // InvalidArgumentError (Python: ValueError, as for a closed file), naming `call`.
  [[noreturn]] void refuse_after_shutdown(const char* call) const;
  // shutdown()'s first step: in a fork() child, holds `impl` (the parent's threads and
  // kernel objects) for the rest of the process, never destroyed, and returns true, so
  // nothing is touched; false in the process that made the endpoint.
  bool leave_if_inherited(std::shared_ptr<const void> impl) const;
  // A transport whose channel carries notifications calls this in its constructor, with
  // a way to submit to it that stays safe after this object is gone (a weak pointer to
  // its state). submit() then orders notifications after the writes before them here,
  // in core, and hands `submit_notify` only kSendNotify requests, in order. A transport
  // that does not call it (a wrapper forwarding to another endpoint) gets every request
  // as is, and orders them itself.
  void order_notifications(std::function<Future(OpRequest)> submit_notify);

 private:
  unsigned long fork_generation_;
  std::shared_ptr<class NotifyFence> fence_;  // see order_notifications()
};

}  // namespace dlslime
