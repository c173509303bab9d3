#include "tcp/tcp_connection.h"

#include <sys/socket.h>

#include <cerrno>

#include <algorithm>
#include <cstring>
#include <utility>

#include <asio/post.hpp>
#include <asio/read.hpp>
#include <fmt/format.h>

#include "core/log.h"

namespace dlslime::tcp {

TcpConnection::TcpConnection(asio::ip::tcp::socket socket, FrameHandler* handler, Role role, uint16_t lane,
                             std::shared_ptr<AnswerBudget> budget)
    : budget_(budget ? std::move(budget) : std::make_shared<AnswerBudget>()),
      socket_(std::move(socket)),
      handler_(handler),
      role_(role),
      lane_(lane),
      rbuf_(new uint8_t[kStagingSize]) {}

template <class F>
void TcpConnection::guarded(F&& fn) noexcept {
  try {
    fn();
  } catch (const std::exception& e) {
    DLSLIME_ERROR("lane {}: internal error while handling I/O: {}", lane_, e.what());
    close(Status::failed(fmt::format("lane {} closed after an internal error: {}", lane_, e.what())));
  }
}

bool TcpConnection::holds(const RegionLifetime* lifetime) const {
  if (segment_uses_.holds(lifetime)) return true;
  return std::any_of(queue_.begin(), queue_.end(), [&](const WriteItem& item) { return item.uses().holds(lifetime); });
}

std::string TcpConnection::peer_address() const {
  std::error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  if (ec) return "?";
  return fmt::format("{}:{}", ep.address().to_string(), ep.port());
}

void TcpConnection::start() {
  std::error_code ec;
  socket_.non_blocking(true, ec);  // do_write calls sendmsg itself
  if (ec) return close(io_error(ec, "setting up the socket"));
  schedule_read();
}

Status TcpConnection::io_error(const std::error_code& ec, const char* what) const {
  if (ec == asio::error::eof) return Status::peer_closed("the peer closed the connection");
  return Status::peer_closed(fmt::format("connection lost while {}: {}", what, ec.message()));
}

void TcpConnection::consume(const uint8_t* src, size_t n) {
  if (sink_.collect || sink_.prefix > 0) {  // process() stops at the end of a prefix
    rx_text_.append(reinterpret_cast<const char*>(src), n);
    return;
  }
  while (n > 0 && sink_.dst) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, sink_.dst_left));
    std::memcpy(sink_.dst, src, take);
    sink_.advance(take);
    src += take;
    n -= take;
  }
}

void TcpConnection::finish_frame() {
  have_header_ = false;
  sink_ready_ = false;
  segment_uses_.clear();  // the payload is placed (or was dropped)
  const FrameHeader h = hdr_;
  const PayloadSink sink = sink_;
  sink_ = {};
  std::string text;
  text.swap(rx_text_);
  handler_->on_frame(*this, h, sink, text);
}

void TcpConnection::take_prefix() {
  sink_.prefix = 0;
  handler_->on_prefix(*this, hdr_, rx_text_, sink_);
  rx_text_.clear();
}

void TcpConnection::stall_for_answers() {
  answers_full_ = true;
  budget_->stalled.push_back(weak_from_this());
}

void TcpConnection::resume_answers() {
  if (!answers_full_ || closed_) return;
  answers_full_ = false;
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    self->guarded([&] {
      if (!self->closed_) self->process();
    });
  });
}

void TcpConnection::process() {
  while (!closed_) {
    if (!have_header_) {
      if (rend_ - rbeg_ < kFrameHeaderSize) break;
      if (budget_->full()) {  // resumed once the peer has read enough of them
        if (!answers_full_) stall_for_answers();
        break;
      }
      if (Status st = parse_frame_header(rbuf_.get() + rbeg_, &hdr_); !st) {
        close(st);
        return;
      }
      rbeg_ += kFrameHeaderSize;
      have_header_ = true;
    }
    if (!sink_ready_) {
      sink_ = {};
      paused_ = handler_->on_header(*this, hdr_, sink_) == RxAction::kPause;
      if (paused_) break;
      if (closed_) return;
      sink_ready_ = true;
      remaining_ = payload_size(hdr_);
      if (sink_.prefix == 0) expect_large_ = false;  // its payload follows: a direct read if large
    }
    if (remaining_ > 0) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, rend_ - rbeg_));
      const bool in_prefix = sink_.prefix > 0;
      if (in_prefix) n = std::min<size_t>(n, sink_.prefix - rx_text_.size());
      consume(rbuf_.get() + rbeg_, n);
      rbeg_ += n;
      remaining_ -= n;
      if (in_prefix && rx_text_.size() == sink_.prefix) {
        take_prefix();
        if (closed_) return;
        continue;
      }
      if (remaining_ > 0) break;
    }
    finish_frame();
  }
  if (!closed_) schedule_read();
}

void TcpConnection::schedule_read() {
  if (reading_ || closed_) return;
  if (rbeg_ == rend_) rbeg_ = rend_ = 0;
  // Stalled (flow control, or too many answers queued): frames are not processed, but
  // the staging buffer keeps filling while it has room, so a peer that leaves is still
  // noticed (its EOF) instead of holding the pairing until the stall ends.
  const bool stalled = paused_ || answers_full_;
  if (!stalled && have_header_ && sink_ready_ && sink_.dst && remaining_ >= kDirectReadMin) {
    const uint64_t direct = gather_direct();
    if (direct >= kDirectReadMin && direct >= kDirectSegmentMin * direct_bufs_.size()) {
      read_direct(direct);
      return;
    }
  }
  set_low_watermark(1);
  if (rbeg_ > 0 && kStagingSize - rend_ < kFrameHeaderSize * 4) {
    std::memmove(rbuf_.get(), rbuf_.get() + rbeg_, rend_ - rbeg_);
    rend_ -= rbeg_;
    rbeg_ = 0;
  }
  // After a large payload, read just the next header and piece list; small frames get the
  // whole staging buffer again.
  if (stalled && rend_ == kStagingSize) return;  // full: resume_reading() or do_write() restarts
  size_t want = kStagingSize - rend_;
  if (!stalled && expect_large_) {
    if (!have_header_ && rend_ - rbeg_ < kFrameHeaderSize) {
      want = kFrameHeaderSize - (rend_ - rbeg_);
    } else if (have_header_ && sink_ready_ && sink_.prefix > rx_text_.size()) {
      want = sink_.prefix - rx_text_.size();
    } else {
      expect_large_ = false;  // a small payload: staged after all
    }
  }
  reading_ = true;
  socket_.async_read_some(asio::buffer(rbuf_.get() + rend_, want),
                          [self = shared_from_this()](std::error_code ec, size_t n) {
                            self->reading_ = false;
                            if (self->closed_) return;
                            if (ec) return self->close(self->io_error(ec, "reading"));
                            self->rend_ += n;
                            self->guarded([&] { self->process(); });
                          });
}

uint64_t TcpConnection::gather_direct() {
  // The destinations of the payload's next bytes, never past this frame (the bytes after
  // it are the next header). Returns how many bytes they take.
  direct_bufs_.clear();
  uint64_t total = std::min(sink_.dst_left, remaining_);
  direct_bufs_.emplace_back(sink_.dst, static_cast<size_t>(total));
  for (size_t i = 0; i < sink_.more_count && direct_bufs_.size() < kMaxDirectSegments && total < remaining_; ++i) {
    const uint64_t n = std::min(sink_.more[i].length, remaining_ - total);
    direct_bufs_.emplace_back(sink_.more[i].addr, static_cast<size_t>(n));
    total += n;
  }
  return total;
}

void TcpConnection::read_direct(uint64_t bytes) {
  // Receive the next `bytes` of the payload straight into their destinations (direct_bufs_,
  // from gather_direct): no staging copy.
  reading_ = reading_direct_ = true;
  set_low_watermark(std::min(bytes, kLowWatermarkMax));
  socket_.async_read_some(direct_bufs_, [self = shared_from_this()](std::error_code ec, size_t n) {
    self->reading_ = self->reading_direct_ = false;
    if (self->closed_) return;
    if (ec) return self->close(self->io_error(ec, "receiving a payload"));
    self->guarded([&] {
      self->sink_.advance(n);
      self->remaining_ -= n;
      if (self->remaining_ > 0) return self->schedule_read();  // direct again, or staging for small segments
      self->set_low_watermark(1);
      self->expect_large_ = true;
      self->finish_frame();
      self->process();
    });
  });
}

void TcpConnection::set_low_watermark(uint64_t bytes) {
  // While a large payload streams in, epoll reports the socket readable only once this
  // many bytes are queued (SO_RCVLOWAT), so each wake-up moves hundreds of KiB instead of
  // one loopback segment: far fewer recv and epoll_wait calls. Never above the bytes
  // still due in this payload (the sender writes whole frames; EOF and errors wake the
  // reader regardless), so it cannot wait for bytes that will not come; reset to 1
  // before any header read.
  const int want = bytes < kLowWatermarkMin ? 1 : static_cast<int>(bytes);
  if (want == rcvlowat_) return;
  if (::setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0) rcvlowat_ = want;
}

void TcpConnection::resume_reading() {
  if (!paused_ || closed_) return;
  paused_ = false;
  // Not inline: the caller may be inside another connection's frame handler.
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    self->guarded([&] {
      if (!self->closed_) self->process();
    });
  });
}

bool TcpConnection::release(uint64_t op_id) {
  if (op_id == 0 || !sink_ready_ || sink_.op_id != op_id) return true;
  if (reading_direct_) return false;
  sink_.dst = nullptr;  // drop the rest of this payload
  sink_.more_count = 0;
  sink_.op_id = 0;
  return true;
}

void TcpConnection::send(WriteItem item) {
  if (closed_) return;
  if (item.op_id() != 0) min_op_hint_ = std::min(min_op_hint_, item.op_id());
  queue_.push_back(std::move(item));
  schedule_flush();
}

WriteItem& TcpConnection::control() {
  // Append to the last queued item unless it is being written (its buffers are in iov_)
  // or belongs to an op (abandon() must be able to drop exactly that op's frames).
  if (queue_.size() <= writing_items_ || queue_.back().op_id() != 0) {
    queue_.emplace_back(0);
    queue_.back().meter(&budget_->bytes);
  }
  schedule_flush();
  return queue_.back();
}

void TcpConnection::schedule_flush() {
  // Write once the current handler returns, not at once: everything a handler queues
  // (all answers to one staging buffer of frames, all ops posted in a burst) goes out in
  // one vectored write instead of one syscall per frame. A post from the I/O thread to
  // its own context wakes nothing.
  if (closed_ || writing_items_ > 0 || flush_posted_) return;
  flush_posted_ = true;
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    self->flush_posted_ = false;
    self->guarded([&] {
      if (!self->closed_ && self->writing_items_ == 0) self->do_write();
    });
  });
}

void TcpConnection::do_write() {
  // Gather everything queued into one vectored write: small ops coalesce into a few
  // syscalls instead of one per item. sendmsg is called directly rather than through
  // asio::async_write, which caps each syscall at 64 KiB and 64 iovecs; here one call
  // takes up to IOV_MAX iovecs and as many bytes as the socket buffer has room for.
  if (writing_items_ == 0) {
    iov_.clear();
    iov_pos_ = 0;
    item_ends_.clear();
    for (const WriteItem& item : queue_) {
      if (writing_items_ > 0 && iov_.size() >= kMaxIov) break;
      item.append_buffers(iov_);
      item_ends_.push_back(iov_.size());
      ++writing_items_;
    }
    if (writing_items_ == 0) return;
  }
  const int fd = socket_.native_handle();
  while (iov_pos_ < iov_.size()) {
    msghdr msg{};
    msg.msg_iov = iov_.data() + iov_pos_;
    msg.msg_iovlen = std::min<size_t>(iov_.size() - iov_pos_, kMaxIov);
    const ssize_t sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        // The socket buffer is full: continue once it has room.
        socket_.async_wait(asio::socket_base::wait_write, [self = shared_from_this()](std::error_code ec) {
          if (self->closed_) return;
          if (ec) return self->close(self->io_error(ec, "sending"));
          self->guarded([&] { self->do_write(); });
        });
        return;
      }
      return close(io_error(std::error_code(errno, std::system_category()), "sending"));
    }
    for (auto left = static_cast<size_t>(sent); left > 0;) {  // skip what was sent
      iovec& v = iov_[iov_pos_];
      const size_t n = std::min(left, v.iov_len);
      v.iov_base = static_cast<uint8_t*>(v.iov_base) + n;
      v.iov_len -= n;
      left -= n;
      if (v.iov_len == 0) ++iov_pos_;
    }
    retire_written();
  }
  retire_written();  // every byte is sent (and items with no bytes at all)
  budget_->on_drained();
  if (!queue_.empty()) do_write();
}

void TcpConnection::retire_written() {
  // Items whose bytes have all reached the socket leave the queue now, not when the whole
  // write does. The peer may already have answered them: an acknowledgement handled while
  // the rest of this write waits for room (async_wait) ends their op, and abandon() must
  // not take bytes the kernel already has for bytes in transit (that closed healthy lanes
  // under bursts: issue 21, N2). Their staging leases and answer-budget bytes go now too.
  while (iov_pos_ < iov_.size() && iov_[iov_pos_].iov_len == 0) ++iov_pos_;
  const size_t first = item_ends_.size() - writing_items_;  // item_ends_ index of queue_.front()
  size_t done = 0;
  while (done < writing_items_ && item_ends_[first + done] <= iov_pos_) ++done;
  if (done == 0) return;
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<ptrdiff_t>(done));
  writing_items_ -= done;
  if (writing_items_ > 0) budget_->on_drained();
}

bool TcpConnection::moving(uint64_t op_id) const {
  if (op_id == 0) return false;
  if (sink_ready_ && sink_.op_id == op_id && reading_direct_) return true;
  if (op_id < min_op_hint_) return false;
  for (size_t i = 0; i < writing_items_ && i < queue_.size(); ++i) {
    if (queue_[i].op_id() == op_id && queue_[i].borrows_op_memory()) return true;
  }
  return false;
}

bool TcpConnection::has_queued(uint64_t op_id) const {
  if (op_id < min_op_hint_) return false;
  return std::any_of(queue_.begin(), queue_.end(), [&](const WriteItem& w) { return w.op_id() == op_id; });
}

bool TcpConnection::abandon(uint64_t op_id) {
  // Every op ends here, successful ones too, so the common case must not scan the queue:
  // ops are numbered in submission order, and one older than every op with an item queued
  // has nothing here (a burst of messages acknowledged in order costs O(1) each, not a scan
  // of the messages behind it).
  if (op_id < min_op_hint_) return true;
  // Items of the write in progress that still have bytes to send (retire_written drops the
  // rest). One that borrows no op memory (a staged GPU frame owns its slot) may finish: the
  // peer drops or ignores a frame of an op that ended.
  for (size_t i = 0; i < writing_items_ && i < queue_.size(); ++i) {
    if (queue_[i].op_id() == op_id && queue_[i].borrows_op_memory()) return false;
  }
  auto first = queue_.begin() + static_cast<ptrdiff_t>(std::min(writing_items_, queue_.size()));
  queue_.erase(std::remove_if(first, queue_.end(), [&](const WriteItem& w) { return w.op_id() == op_id; }),
               queue_.end());
  min_op_hint_ = UINT64_MAX;  // exact again: the oldest op still queued
  for (const WriteItem& w : queue_) {
    if (w.op_id() != 0) min_op_hint_ = std::min(min_op_hint_, w.op_id());
  }
  return true;
}

void TcpConnection::close(const Status& why) {
  if (closed_) return;
  closed_ = true;
  std::error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  queue_.clear();
  writing_items_ = 0;
  min_op_hint_ = UINT64_MAX;
  segment_uses_.clear();
  sink_ = {};  // nothing is placed any more
  budget_->on_drained();
  FrameHandler* handler = handler_;
  handler_ = nullptr;
  DLSLIME_DEBUG("lane {} ({}) closed: {}", lane_, role_ == Role::kDialed ? "dialed" : "accepted", why.to_string());
  if (handler) handler->on_closed(*this, why);
}

void TcpConnection::close_quietly() {
  if (closed_) return;
  if (writing_items_ == 0) {
    // Best effort, without blocking: the answers already queued (acknowledgements of
    // messages a local recv has completed, read responses) and a goodbye, so the peer
    // learns their outcome and sees an orderly shutdown, not a crash. Frames of local
    // ops are dropped: those ops are being cancelled. Items are whole frames, so
    // stopping at an item boundary keeps the stream well formed.
    uint8_t raw[kFrameHeaderSize];
    FrameHeader bye;
    bye.type = FrameType::kGoodbye;
    bye.length = 0;
    encode_frame_header(bye, raw);
    iov_.clear();
    for (const WriteItem& item : queue_) {
      if (item.op_id() != 0) continue;
      const size_t before = iov_.size();
      item.append_buffers(iov_);
      if (iov_.size() >= kMaxIov) {
        iov_.resize(before);
        break;
      }
    }
    iov_.push_back({raw, sizeof raw});
    msghdr msg{};
    msg.msg_iov = iov_.data();
    msg.msg_iovlen = iov_.size();
    (void)::sendmsg(socket_.native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  handler_ = nullptr;
  close(Status::cancelled("endpoint shut down"));
}

}  // namespace dlslime::tcp
