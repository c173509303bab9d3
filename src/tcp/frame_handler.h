#pragma once

#include <string_view>

#include "dlslime/status.h"
#include "tcp/frame_codec.h"
#include "tcp/payload_sink.h"

namespace dlslime::tcp {

class TcpConnection;

enum class RxAction { kContinue, kPause };

// Frame semantics live in the endpoint; the connection only moves bytes.
class FrameHandler {
 public:
  virtual ~FrameHandler() = default;
  // A header arrived and was validated. Fill `sink` for its payload, or pause reading
  // until resume_reading() (flow control for unmatched messages).
  virtual RxAction on_header(TcpConnection& conn, const FrameHeader& h, PayloadSink& sink) = 0;
  // The first sink.prefix payload bytes arrived: fill `sink` for the rest. Segments it
  // scatters into may be kept in conn.segments().
  virtual void on_prefix(TcpConnection& conn, const FrameHeader& h, std::string_view prefix, PayloadSink& sink) = 0;
  // The frame's payload is fully placed (called at once for frames without payload).
  virtual void on_frame(TcpConnection& conn, const FrameHeader& h, const PayloadSink& sink, std::string_view text) = 0;
  // The connection failed or was closed by the peer. Not called for close_quietly().
  virtual void on_closed(TcpConnection& conn, const Status& why) = 0;
};

}  // namespace dlslime::tcp
