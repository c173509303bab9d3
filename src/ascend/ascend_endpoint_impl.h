// AscendDirectEndpoint's implementation (ascend_endpoint.cpp, docs/ascend.md): the memory
// domain that registers each region with the engine, and the endpoint with its worker.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "ascend/hixl_engine.h"
#include "ascend/notify_codec.h"
#include "core/completion_thread.h"
#include "core/memory_registry.h"
#include "core/notification_inbox.h"
#include "core/op_limit.h"
#include "core/op_state.h"
#include "core/remote_regions.h"
#include "dlslime/ascend_endpoint.h"

namespace dlslime {
namespace ascend {

// Registers each region with the engine as it is registered in the registry (MEM_DEVICE for
// NPU memory, MEM_HOST otherwise) and deregisters it once it has drained. Its mr_info
// entry names the engine, so an op on it goes to that engine whoever connected to whom.
class AscendDomain final : public MemoryDomain {
 public:
  AscendDomain(std::shared_ptr<HixlEngine> engine, std::string engine_name);
  void region_added(int32_t handle, const LocalRegion& region) override;
  void region_removed(int32_t handle, const LocalRegion& region) override;
  nlohmann::json describe(int32_t handle, const LocalRegion& region) const override;
  bool registered(int32_t handle) const;
  bool takes(MemoryKind) const override { return true; }  // host memory and NPU memory
  // The engine and name its regions go to (AscendDirectEndpoint::init, before any region).
  void rebind(std::shared_ptr<HixlEngine> engine, std::string engine_name);

 private:
  struct Mem {
    MemHandle handle = nullptr;
    MemType type = MemType::kHost;
  };
  mutable std::mutex mu_;
  std::shared_ptr<HixlEngine> engine_;
  std::string engine_name_;
  std::unordered_map<int32_t, Mem> mems_;
};

}  // namespace ascend

class AscendEndpointImpl final : public RegionRevoker,
                                 public OpCanceller,
                                 public std::enable_shared_from_this<AscendEndpointImpl> {
 public:
  AscendEndpointImpl(AscendOptions options, std::shared_ptr<MemoryRegistry> regions);
  ~AscendEndpointImpl();
  void start();  // attaches the domain and starts the worker

  nlohmann::json endpoint_info() const;
  void connect(const nlohmann::json& peer_info);
  bool is_connected() const;
  bool is_shut_down() const {
    std::lock_guard lock(mu_);
    return closed_;
  }
  // strict: throw on an unusable entry; else keep it, so that its ops fail with the reason.
  int32_t add_remote(const std::string& name, const nlohmann::json& entry, bool strict);
  nlohmann::json mr_info() const;
  nlohmann::json mr_info_of(const std::string& name) const;
  Future submit(OpRequest request);
  void shutdown();
  void join_thread() { thread_.join(); }
  std::optional<int32_t> remote_handle(const std::string& name) const;
  std::string engine_name() const {
    std::lock_guard lock(mu_);
    return name_;
  }
  void init(const std::string& host, int port);
  ascend::HixlEngine::Capability library_caps() const { return caps_; }

  const AscendOptions options;
  const std::shared_ptr<MemoryRegistry> regions;

  // RegionRevoker
  void revoke_region(const RegionLifetime& lifetime) override;
  bool on_own_thread() const override;
  // OpCanceller: a waiting recv_notify is withdrawn; a transfer the library has started
  // cannot be taken back alone (only by disconnecting its link), so read and write decline.
  bool cancel_op(OpState& op, uint64_t op_id) override;

 private:
  using Clock = std::chrono::steady_clock;

  // How this endpoint addresses a peer's region: the engine that owns it and its first byte
  // in that engine's process. `seq` orders it against the links (Link::made_at).
  struct RemoteKey {
    std::string engine;
    uintptr_t addr = 0;
    uint64_t seq = 0;
  };
  // The link to one engine, made and remade by the worker only (read elsewhere under mu_).
  struct Link {
    bool up = false;
    bool broken = false;
    bool ever_up = false;    // it was made once: failing to remake it means the peer is gone
    bool gone = false;       // the peer's engine stopped answering (a failed probe or relink)
    uint64_t made_at = 0;    // remote_seq_ when it was made: regions added later need a relink
    uint32_t in_flight = 0;  // transfers started on it and not yet ended
    std::string why_down;    // why it was last disconnected, for the ops it failed
    Status unreachable;      // the last failed (re)link, answered again until retry_at
    Clock::time_point retry_at;
  };
  // The items of an op that go to one engine: one transfer.
  struct Part {
    std::string engine;
    ascend::TransferOp dir = ascend::TransferOp::kWrite;
    std::vector<ascend::TransferOpDesc> descs;
    ascend::TransferReq req = nullptr;
    bool started = false;
    uint64_t newest_region = 0;  // the RemoteKey::seq of its newest region
    bool finished = false;
  };
  struct Op {
    std::shared_ptr<OpState> state;
    OpKind kind = OpKind::kWrite;
    RegionUses uses;
    std::vector<Part> parts;
    std::string notification;  // kSendNotify
    uint64_t nbytes = 0;
    bool started = false;  // every part started, or the op failed before all did
    Status error;          // the first failure; the op's status once its parts ended
    Clock::time_point deadline;
    OpLimit limit;
  };
  struct Ended {
    std::shared_ptr<OpState> state;
    Status status;
    uint64_t nbytes = 0;
  };
  // A connect() waiting for the worker to make its link.
  struct ConnectJob {
    std::string engine;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::string error;
  };

  void run();
  void wake();
  // retry_now: connect() asks again even right after a failed attempt.
  std::optional<Status> ensure_link(const std::string& engine, uint64_t newest_region, bool retry_now = false);
  void break_link(const std::string& engine, const std::string& why);
  void start_op(Op& op, std::vector<Ended>& ended);
  std::optional<Status> send_notification(const Op& op);
  // Probes the link to `engine` with a notify the peer drops; false (and the link marked
  // gone, waiting recv_notifys failed) when the peer's engine does not take it.
  bool probe(const std::string& engine, std::vector<Ended>& ended);
  Status part_failed(const Op& op, const Part& p, uint32_t rc, std::vector<Ended>& ended);
  void collect_notifications(std::vector<Ended>& ended);

  std::shared_ptr<ascend::HixlEngine> hixl() const {
    std::lock_guard lock(mu_);
    return engine_;
  }
  // Starts a new engine named host:port (port 0: a free one).
  std::shared_ptr<ascend::HixlEngine> start_engine(const std::string& host, int port, std::string* name);

  std::shared_ptr<ascend::HixlEngine> engine_;  // replaced only by init(), before any use
  ascend::HixlEngine::Capability caps_;
  std::string name_;  // "host:port"; mu_
  std::shared_ptr<ascend::AscendDomain> domain_;

  mutable std::mutex mu_;
  bool closed_ = false;
  bool worker_done_ = false;
  std::string peer_;  // the engine connected last: where send_notify goes
  std::unordered_map<std::string, Link> links_;
  uint64_t remote_seq_ = 0;
  std::deque<Op> incoming_;
  std::vector<std::shared_ptr<ConnectJob>> connect_jobs_;
  std::vector<const RegionLifetime*> revoking_;  // being revoked (revoke_region)
  std::vector<const RegionLifetime*> revoked_;   // of those, the ones no op holds any more
  std::condition_variable drained_cv_;
  NotificationInbox inbox_;
  ascend::NotificationAssembler assembler_;  // mu_
  uint64_t notify_seq_ = 0;                  // worker

  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  uint64_t wakes_ = 0;

  RemoteRegions<RemoteKey> remote_;
  CompletionThread thread_;
};

}  // namespace dlslime
