#include "tcp/tcp_endpoint_impl.h"

// TcpEndpointImpl's frame dispatch (tcp::FrameHandler), on the I/O thread: each frame
// from the peer goes to the part that owns its state. Answers to our ops go to the
// Initiator, the peer's reads and writes to the TargetServer, messages and notifications to
// the MessageMatcher, and a goodbye to the Pairing.
namespace dlslime {

using tcp::FrameHeader;
using tcp::FrameType;
using tcp::PayloadSink;
using tcp::RxAction;
using tcp::TcpConnection;

RxAction TcpEndpointImpl::on_header(TcpConnection& conn, const FrameHeader& h, PayloadSink& sink) {
  switch (h.type) {
    case FrameType::kWriteData:
      sink.prefix = h.offset * tcp::kPieceSize;  // the list
      return gpu_.regions.any() ? target_.reserve_staging(conn, h) : RxAction::kContinue;
    case FrameType::kReadRequest:
      sink.collect = true;
      return gpu_.regions.any() ? target_.admit_read(conn) : RxAction::kContinue;
    case FrameType::kWriteAck:
    case FrameType::kSendAck:
    case FrameType::kNotify:
    case FrameType::kNotifyAck: sink.collect = true; return RxAction::kContinue;
    case FrameType::kReadData: return initiator_.on_read_header(conn, h, sink);
    case FrameType::kSendData: return matcher_.on_header(conn, h, sink);
    case FrameType::kGoodbye: return RxAction::kContinue;
    case FrameType::kSameHost:
    case FrameType::kPullDone: sink.collect = true; return RxAction::kContinue;
    case FrameType::kPullWrite: sink.collect = true; return target_.admit_pull(conn);
    case FrameType::kPullRead: sink.collect = true; return RxAction::kContinue;  // bounded by grant_read
    case FrameType::kReadGrant: sink.collect = true; return RxAction::kContinue;
    case FrameType::kReadRelease: return RxAction::kContinue;
    case FrameType::kPullSend: sink.collect = true; return matcher_.admit_pulled(conn);
    case FrameType::kSendCopied: sink.collect = true; return RxAction::kContinue;
  }
  return RxAction::kContinue;
}

void TcpEndpointImpl::on_prefix(TcpConnection& conn, const FrameHeader& h, std::string_view list,
                                PayloadSink& sink) {
  target_.on_write_prefix(conn, h, list, sink);  // only write frames have a prefix
}

void TcpEndpointImpl::on_frame(TcpConnection& conn, const FrameHeader& h, const PayloadSink& /*sink*/,
                               std::string_view text) {
  switch (h.type) {
    case FrameType::kWriteData: target_.on_write_frame(conn, h); return;
    case FrameType::kReadRequest: target_.answer_read(conn, h, text); return;
    case FrameType::kWriteAck: initiator_.on_write_ack(conn, h, text); return;
    case FrameType::kReadData: initiator_.on_read_frame(conn, h, text); return;
    case FrameType::kSendAck: initiator_.on_send_ack(conn, h, text); return;
    case FrameType::kSendData: matcher_.on_frame(conn, h); return;
    case FrameType::kNotify: matcher_.on_notification(conn, h, text); return;
    case FrameType::kNotifyAck: initiator_.on_notify_ack(conn, h, text); return;
    case FrameType::kSameHost:
      if (conn.role() == TcpConnection::Role::kDialed) return same_host_.on_answer(conn, h, text);
      return same_host_.on_request(conn, h, text);
    case FrameType::kPullWrite:
    case FrameType::kPullRead:
    case FrameType::kPullSend:
      if (conn.role() != TcpConnection::Role::kAccepted || same_host_.trusted_pid(conn) == 0 || !options_.same_host) {
        // Not a violation: an op planned for the path may meet a connection made since.
        const Status refused =
            Status::not_connected("the same-host path is not established on this connection; submit the op again");
        if (h.type == FrameType::kPullSend) return TargetServer::ack(conn, FrameType::kSendCopied, h.op_id, refused);
        FrameHeader r;
        r.type = h.type == FrameType::kPullRead ? FrameType::kReadGrant : FrameType::kPullDone;
        r.op_id = h.op_id;
        r.index = h.index;
        r.offset = h.offset;
        return TargetServer::add_status(conn.control(), r, refused);
      }
      if (h.type == FrameType::kPullSend) return matcher_.on_pulled(conn, h, text, same_host_.trusted_pid(conn));
      if (h.type == FrameType::kPullRead) return target_.grant_read(conn, h, text);
      return target_.serve_pull(conn, h, text, same_host_.trusted_pid(conn));
    case FrameType::kPullDone: initiator_.on_pull_done(conn, h, text); return;
    case FrameType::kSendCopied: initiator_.on_send_copied(conn, h, text); return;
    case FrameType::kReadGrant: initiator_.on_read_grant(conn, h, text); return;
    case FrameType::kReadRelease: target_.release_read(conn, h); return;
    case FrameType::kGoodbye:
      // The peer sends nothing more on this connection, but what it sent earlier on its
      // other connections (the acknowledgement of a message, say) may still be unread
      // there. Its ops fail only once every connection has said goodbye or closed.
      if (pairing_.remove_lane(conn)) on_closed(conn, Status::peer_closed("the peer endpoint shut down"));
      return;
  }
}

}  // namespace dlslime
