#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <asio/io_context.hpp>

#include "dlslime/status.h"
#include "gpu/device_runtime.h"
#include "tcp/frame_handler.h"

// GPU memory over TCP (docs/tcp.md "GPU memory"). Host code never touches device memory:
// the bytes of a device region cross the socket through pinned host buffers ("slots"),
// filled or drained by asynchronous copies on the staging streams, whose completion is
// reported back on the endpoint's I/O thread. The host-memory path never reaches this
// file: which ops and frames need staging is decided per region (DeviceRegions).
namespace dlslime::tcp {

class TcpConnection;

// The local regions that are device memory, by handle (filled when TcpEndpoint registers
// a region the device runtime calls device memory). `any()` is one relaxed load, so the
// host path pays nothing while no device region is registered.
class DeviceRegions {
 public:
  bool any() const noexcept { return count_.load(std::memory_order_acquire) > 0; }
  void add(int32_t handle, int device);
  void remove(int32_t handle);
  // The device of region `handle`, or -1 when it is host memory.
  int device_of(int32_t handle) const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<int32_t, int> devices_;
  std::atomic<uint32_t> count_{0};
};

// One endpoint's staging: two pools of pinned buffers ("out": device -> host -> socket,
// "in": socket -> host -> device) of `slots` buffers each, one stream per direction, and a
// waiter thread that reports finished copies on the I/O thread. The pools are separate so
// that bytes arriving always drain (their slots free once the device copy is done), which
// is what lets the peer's outgoing slots free in turn: no cycle through the network.
//
// Bounded: at most `slots` buffers per direction are in use; a buffer is as large as the
// largest frame it carried (at most 64 MiB, the frame limit; chunk_size in practice).
// Thread: the I/O thread, except stats() (any thread) and the waiter.
class GpuStaging {
 public:
  enum Direction : uint8_t { kOut = 0, kIn = 1 };
  struct Slot {
    uint8_t* data = nullptr;  // pinned host memory
    uint64_t capacity = 0;
    uint64_t used = 0;  // bytes counted in the stats while busy
    gpu::Event event = nullptr;
    Direction dir = kOut;
    bool busy = false;
  };
  struct Stats {
    uint64_t in_use_bytes = 0;      // capacity of the slots in use, both directions
    uint64_t high_water_bytes = 0;  // the most ever in use at once
    uint32_t slots_per_direction = 0;
  };

  // Default and most slots per direction (TcpOptions::gpu_staging_chunks).
  static constexpr uint32_t kDefaultSlots = 4;
  static constexpr uint32_t kMaxSlots = 64;

  // `owner` guards every callback: once it has expired, finished copies run nothing.
  // `on_free` runs (posted, on the I/O thread) after a slot was released.
  GpuStaging(asio::io_context& io, gpu::Runtime& runtime, int device, uint32_t slots, std::weak_ptr<void> owner,
             std::function<void()> on_free);
  ~GpuStaging();
  GpuStaging(const GpuStaging&) = delete;
  GpuStaging& operator=(const GpuStaging&) = delete;

  gpu::Runtime& runtime() { return rt_; }

  // A free slot of `dir` with room for `bytes` (its buffer grows if needed), or nullptr
  // when all are in use. Throws GpuError if pinned memory cannot be had.
  Slot* acquire(Direction dir, uint64_t bytes);
  // Grows a held slot to `bytes` (a reservation made before the size was known).
  void ensure(Slot* slot, uint64_t bytes);
  void release(Slot* slot);  // nullptr: nothing
  // A handle whose last copy releases the slot (held by the frame that carries its bytes).
  std::shared_ptr<void> lease(Slot* slot);

  // Queues a copy on `dir`'s stream (either side host or device; never touched by host code
  // here).
  void copy(Direction dir, void* dst, const void* src, uint64_t n);
  // Runs `done(status)` on the I/O thread once the copies queued on `slot`'s stream so far
  // have finished (status: the runtime's error if one failed).
  void when_copied(Slot* slot, std::function<void(Status)> done);
  // The same for copies of `dir` that use no slot (held message bytes into GPU memory).
  void when_copied(Direction dir, std::function<void(Status)> done);
  // Blocks until every copy queued so far has finished (peer loss and shutdown, before the
  // ops whose memory they touch complete). Bounded: the copies are already queued.
  void drain();

  // An incoming slot for the `bytes` of the frame `conn` is reading (`what` names it),
  // held as its frame slot: kContinue with *slot set; kPause with none free (`conn` resumes
  // reading once one frees, and its on_header asks again); kContinue with nullptr and
  // *error set when none could be had (no pinned memory, or a device whose context failed):
  // the caller fails the frame's op alone and drains its bytes.
  RxAction stage_frame(TcpConnection& conn, uint64_t bytes, const char* what, Slot** slot, Status* error);
  // A connection that paused reading until a slot of `dir` frees; resumed then.
  void wait_for_slot(Direction dir, const std::shared_ptr<TcpConnection>& conn);
  // The incoming slot that holds the payload of the frame `conn` is reading (nullptr: none).
  Slot* frame_slot(const TcpConnection* conn) const;
  void set_frame_slot(const TcpConnection* conn, Slot* slot);
  Slot* take_frame_slot(const TcpConnection* conn);
  // The peer is gone: frees the slots held for frames being read.
  void drop_frame_slots();

  Stats stats() const;

  // Stops the waiter after the queued copies have finished; nothing runs after it.
  void shutdown();

 private:
  void wait_loop();
  // Logs and leaks what the runtime refuses to destroy (a context with a sticky error).
  void destroy_event(gpu::Event e) noexcept;
  gpu::Stream stream(Direction dir);
  void resume_waiters(Direction dir);

  asio::io_context& io_;
  gpu::Runtime& rt_;
  const int device_;
  const uint32_t slots_per_dir_;
  const std::weak_ptr<void> owner_;
  const std::function<void()> on_free_;
  std::array<gpu::Stream, 2> streams_{nullptr, nullptr};
  std::array<std::vector<std::unique_ptr<Slot>>, 2> slots_;
  std::array<std::vector<std::weak_ptr<TcpConnection>>, 2> waiting_;
  std::unordered_map<const TcpConnection*, Slot*> frame_slots_;
  std::mutex slots_mu_;  // slots_ (a lease may be dropped off the I/O thread)
  std::atomic<uint64_t> in_use_{0};
  std::atomic<uint64_t> high_water_{0};

  struct Pending {
    gpu::Event event;
    std::function<void(Status)> done;
    bool owns_event = false;  // made for this wait (no slot): destroyed after it
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  bool stop_ = false;
  std::thread waiter_;
};

// What the endpoint's parts share for device memory: the device regions (any thread) and
// the staging, made once, when the first device region is registered (then read by the
// I/O thread without a lock).
class GpuPath {
 public:
  DeviceRegions regions;
  GpuStaging* staging() const noexcept { return staging_.load(std::memory_order_acquire); }
  // Makes the staging if there is none yet (thread-safe).
  GpuStaging& make_staging(asio::io_context& io, gpu::Runtime& runtime, int device, uint32_t slots,
                           std::weak_ptr<void> owner, std::function<void()> on_free);
  // Stops the staging's waiter (shutdown); the staging stays until the endpoint goes.
  void shutdown();

 private:
  std::mutex mu_;
  std::unique_ptr<GpuStaging> owned_;
  std::atomic<GpuStaging*> staging_{nullptr};
};

}  // namespace dlslime::tcp
