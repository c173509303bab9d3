#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace dlslime::bench {

using Clock = std::chrono::steady_clock;

// The bootstrap and control path between initiator and target (never the measured data):
// JSON messages, each framed by a 4-byte big-endian length, over a stream socket. The
// loopback pair uses a socketpair() made by the parent; two hosts use TCP (the target
// listens, the initiator dials). Every wait has a deadline.
class ControlError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ControlChannel {
 public:
  // Takes ownership of a connected stream socket.
  explicit ControlChannel(int fd);
  ~ControlChannel();
  ControlChannel(ControlChannel&& other) noexcept;
  ControlChannel& operator=(ControlChannel&&) = delete;
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // Waits for one initiator on [host:]port. `on_listening` gets the bound "host:port"
  // (useful with port 0) before the wait starts.
  static ControlChannel accept_one(const std::string& listen, Clock::time_point deadline,
                                   const std::function<void(const std::string&)>& on_listening);
  // Dials host:port, retrying until the deadline so the target may start second.
  static ControlChannel dial(const std::string& peer, Clock::time_point deadline);

  void send(const nlohmann::json& msg);
  // Throws ControlError on EOF, a malformed message or the deadline.
  nlohmann::json receive(Clock::time_point deadline);
  // A message if one is waiting now; nullopt otherwise. Throws ControlError on EOF.
  std::optional<nlohmann::json> poll();

  // The peer's IP address as seen on this socket; empty for a socketpair.
  std::string peer_ip() const;

 private:
  bool read_exact(void* out, size_t n, Clock::time_point deadline);
  int fd_ = -1;
};

// Splits "host:port" or "[v6]:port"; a bare "port" gives `default_host`. Throws ControlError.
std::pair<std::string, uint16_t> split_host_port(const std::string& text, const std::string& default_host);

}  // namespace dlslime::bench
