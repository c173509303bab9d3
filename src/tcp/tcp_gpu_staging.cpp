#include "tcp/tcp_gpu_staging.h"

#include <algorithm>

#include <asio/post.hpp>
#include <fmt/format.h>

#include "core/log.h"
#include "tcp/tcp_connection.h"

namespace dlslime::tcp {

void DeviceRegions::add(int32_t handle, int device) {
  std::lock_guard lock(mu_);
  if (devices_.emplace(handle, device).second) count_.fetch_add(1, std::memory_order_release);
}

void DeviceRegions::remove(int32_t handle) {
  std::lock_guard lock(mu_);
  if (devices_.erase(handle) > 0) count_.fetch_sub(1, std::memory_order_release);
}

int DeviceRegions::device_of(int32_t handle) const {
  if (!any()) return -1;
  std::lock_guard lock(mu_);
  auto it = devices_.find(handle);
  return it == devices_.end() ? -1 : it->second;
}

GpuStaging::GpuStaging(asio::io_context& io, gpu::Runtime& runtime, int device, uint32_t slots,
                       std::weak_ptr<void> owner, std::function<void()> on_free)
    : io_(io),
      rt_(runtime),
      device_(device < 0 ? 0 : device),
      slots_per_dir_(std::clamp<uint32_t>(slots, 1, kMaxSlots)),
      owner_(std::move(owner)),
      on_free_(std::move(on_free)) {
  waiter_ = std::thread([this] { wait_loop(); });
}

GpuStaging::~GpuStaging() {
  shutdown();
  for (auto& pool : slots_) {
    for (auto& slot : pool) {
      try {
        if (slot->data) rt_.pinned_free(slot->data);
        if (slot->event) rt_.event_destroy(slot->event);
      } catch (const std::exception& e) {
        DLSLIME_WARN("freeing a GPU staging buffer failed: {}", e.what());
      }
    }
  }
  for (gpu::Stream s : streams_) {
    try {
      if (s) rt_.stream_destroy(s);
    } catch (const std::exception& e) {
      DLSLIME_WARN("destroying a GPU staging stream failed: {}", e.what());
    }
  }
}

void GpuStaging::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stop_ && !waiter_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (waiter_.joinable() && waiter_.get_id() != std::this_thread::get_id()) waiter_.join();
}

gpu::Stream GpuStaging::stream(Direction dir) {
  if (!streams_[dir]) streams_[dir] = rt_.stream_create(device_);
  return streams_[dir];
}

GpuStaging::Slot* GpuStaging::acquire(Direction dir, uint64_t bytes) {
  std::lock_guard lock(slots_mu_);
  auto& pool = slots_[dir];
  Slot* pick = nullptr;
  // Prefer a free slot that is large enough already; else grow one; else make one.
  for (auto& s : pool) {
    if (s->busy) continue;
    if (s->capacity >= bytes) {
      pick = s.get();
      break;
    }
    if (!pick) pick = s.get();
  }
  if (!pick) {
    if (pool.size() >= slots_per_dir_) return nullptr;
    auto made = std::make_unique<Slot>();
    made->dir = dir;
    made->event = rt_.event_create(device_);  // first: a slot in the pool always has its event
    pool.push_back(std::move(made));
    pick = pool.back().get();
  }
  pick->busy = true;
  pick->used = 0;
  try {
    if (pick->capacity < bytes) {
      if (pick->data) rt_.pinned_free(pick->data);
      pick->data = nullptr;
      pick->capacity = 0;
      pick->data = static_cast<uint8_t*>(rt_.pinned_alloc(bytes));
      pick->capacity = bytes;
    }
  } catch (...) {
    pick->busy = false;
    throw;
  }
  pick->used = pick->capacity;
  const uint64_t now = in_use_.fetch_add(pick->used, std::memory_order_relaxed) + pick->used;
  uint64_t high = high_water_.load(std::memory_order_relaxed);
  while (now > high && !high_water_.compare_exchange_weak(high, now, std::memory_order_relaxed)) {
  }
  return pick;
}

void GpuStaging::ensure(Slot* slot, uint64_t bytes) {
  std::lock_guard lock(slots_mu_);
  if (slot->capacity >= bytes) return;
  if (slot->data) rt_.pinned_free(slot->data);
  slot->data = nullptr;
  slot->capacity = 0;
  in_use_.fetch_sub(slot->used, std::memory_order_relaxed);
  slot->used = 0;
  slot->data = static_cast<uint8_t*>(rt_.pinned_alloc(bytes));
  slot->capacity = slot->used = bytes;
  const uint64_t now = in_use_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  uint64_t high = high_water_.load(std::memory_order_relaxed);
  while (now > high && !high_water_.compare_exchange_weak(high, now, std::memory_order_relaxed)) {
  }
}

void GpuStaging::release(Slot* slot) {
  if (slot == nullptr) return;
  {
    std::lock_guard lock(slots_mu_);
    if (!slot->busy) return;
    slot->busy = false;
    in_use_.fetch_sub(slot->used, std::memory_order_relaxed);
    slot->used = 0;
  }
  // Posted: a lease is dropped inside a connection's write path, which must not be
  // re-entered (on_free queues frames and resumes connections).
  const Direction dir = slot->dir;
  asio::post(io_, [this, owner = owner_, dir] {
    auto keep = owner.lock();
    if (!keep) return;
    resume_waiters(dir);
    if (on_free_) on_free_();
  });
}

std::shared_ptr<void> GpuStaging::lease(Slot* slot) {
  return std::shared_ptr<void>(slot, [this](void* s) { release(static_cast<Slot*>(s)); });
}

void GpuStaging::copy(Direction dir, void* dst, const void* src, uint64_t n) {
  if (n > 0) rt_.memcpy_async(dst, src, n, stream(dir));
}

void GpuStaging::when_copied(Slot* slot, std::function<void(Status)> done) {
  rt_.event_record(slot->event, stream(slot->dir));
  {
    std::lock_guard lock(mu_);
    pending_.push_back({slot->event, std::move(done)});
  }
  cv_.notify_one();
}

void GpuStaging::when_copied(Direction dir, std::function<void(Status)> done) {
  gpu::Event event = rt_.event_create(device_);
  try {
    rt_.event_record(event, stream(dir));
  } catch (...) {
    destroy_event(event);
    throw;
  }
  {
    std::lock_guard lock(mu_);
    pending_.push_back({event, std::move(done), true});
  }
  cv_.notify_one();
}

void GpuStaging::drain() {
  // A failure here is the device's (a sticky error, such as a faulted copy): its context
  // runs no more copies, so there is nothing left to wait for. Callers go on to fail their
  // ops, which must not be skipped by an exception.
  for (gpu::Stream s : streams_) {
    if (!s) continue;
    gpu::Event e = nullptr;
    try {
      e = rt_.event_create(device_);
      rt_.event_record(e, s);
      rt_.event_synchronize(e);
    } catch (const std::exception& ex) {
      DLSLIME_WARN("waiting for GPU staging copies failed: {}", ex.what());
    }
    destroy_event(e);
  }
}

void GpuStaging::destroy_event(gpu::Event e) noexcept {
  if (e == nullptr) return;
  try {
    rt_.event_destroy(e);
  } catch (const std::exception& ex) {  // a context with a sticky error refuses it: leaked
    DLSLIME_WARN("destroying a GPU staging event failed: {}", ex.what());
  }
}

void GpuStaging::wait_loop() {
  // Events complete in the order they were recorded on one stream; across the two streams
  // a later one may wait behind an earlier one, which delays it but cannot block it.
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
    if (pending_.empty()) return;  // stopped and nothing left
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    const bool stopping = stop_;
    lock.unlock();
    Status st = Status::ok();
    try {
      rt_.event_synchronize(p.event);
    } catch (const std::exception& e) {
      st = Status::failed(fmt::format("a GPU staging copy failed: {}", e.what()));
    }
    if (p.owns_event) destroy_event(p.event);
    if (!stopping) {
      asio::post(io_, [owner = owner_, done = std::move(p.done), st]() mutable {
        auto keep = owner.lock();
        if (keep) done(st);
      });
    }
    lock.lock();
  }
}

RxAction GpuStaging::stage_frame(TcpConnection& conn, uint64_t bytes, const char* what, Slot** slot, Status* error) {
  *slot = nullptr;
  try {
    *slot = acquire(kIn, bytes);
  } catch (const std::exception& e) {
    *error = Status::failed(fmt::format("no GPU staging memory for {}: {}", what, e.what()));
    return RxAction::kContinue;
  }
  if (!*slot) {
    wait_for_slot(kIn, conn.shared_from_this());
    return RxAction::kPause;
  }
  set_frame_slot(&conn, *slot);
  return RxAction::kContinue;
}

void GpuStaging::wait_for_slot(Direction dir, const std::shared_ptr<TcpConnection>& conn) {
  waiting_[dir].push_back(conn);
}

void GpuStaging::resume_waiters(Direction dir) {
  auto waiting = std::move(waiting_[dir]);
  waiting_[dir].clear();
  for (auto& w : waiting) {
    if (auto conn = w.lock()) conn->resume_reading();  // posts: its on_header asks again
  }
}

GpuStaging::Slot* GpuStaging::frame_slot(const TcpConnection* conn) const {
  auto it = frame_slots_.find(conn);
  return it == frame_slots_.end() ? nullptr : it->second;
}

void GpuStaging::set_frame_slot(const TcpConnection* conn, Slot* slot) { frame_slots_[conn] = slot; }

GpuStaging::Slot* GpuStaging::take_frame_slot(const TcpConnection* conn) {
  auto it = frame_slots_.find(conn);
  if (it == frame_slots_.end()) return nullptr;
  Slot* s = it->second;
  frame_slots_.erase(it);
  return s;
}

void GpuStaging::drop_frame_slots() {
  auto slots = std::move(frame_slots_);
  frame_slots_.clear();
  for (auto& [conn, slot] : slots) release(slot);
}

GpuStaging& GpuPath::make_staging(asio::io_context& io, gpu::Runtime& runtime, int device, uint32_t slots,
                                  std::weak_ptr<void> owner, std::function<void()> on_free) {
  std::lock_guard lock(mu_);
  if (!owned_) {
    owned_ = std::make_unique<GpuStaging>(io, runtime, device, slots, std::move(owner), std::move(on_free));
    staging_.store(owned_.get(), std::memory_order_release);
  }
  return *owned_;
}

void GpuPath::shutdown() {
  std::lock_guard lock(mu_);
  if (owned_) owned_->shutdown();
}

GpuStaging::Stats GpuStaging::stats() const {
  return {in_use_.load(std::memory_order_relaxed), high_water_.load(std::memory_order_relaxed), slots_per_dir_};
}

}  // namespace dlslime::tcp
