#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <httplib.h>

#include "nanoctrl/thread_pool.h"

// httplib serves a connection on one worker thread for its whole life and reads a request
// byte by byte with a timeout per read, so a client that sends one header byte every few
// seconds holds a worker indefinitely, and 1,100 of them starve heartbeats (issue 10,
// item 14). The gate keeps every connection off the workers while it waits for a request:
// one epoll thread reads each request's head (and a small body) into a buffer with a deadline
// for the whole read, and hands the connection to a worker only once the request is
// complete. Between requests (keep-alive) the connection comes back to the gate. Workers
// therefore only ever serve complete requests (or stream a large body, under the same
// deadline), so slow or idle clients cannot take them from health checks and heartbeats.
namespace dlslime::nanoctrl {

using GateClock = std::chrono::steady_clock;

struct GateLimits {
  // A request's line, headers and body must all arrive within this long of its first byte.
  std::chrono::milliseconds request_read_timeout{10000};
  // An idle connection (no byte of a next request) is closed after this long.
  std::chrono::milliseconds keep_alive_timeout{5000};
  // One socket read or write on a worker may wait at most this long.
  std::chrono::milliseconds io_timeout{5000};
  // Request heads longer than this are refused (431) without reading on.
  std::size_t max_head_bytes = 16 * 1024;
  // Bodies with a Content-Length up to this are read by the gate too (heartbeats, posts);
  // larger and chunked bodies are streamed by the worker.
  std::size_t prebuffer_body_bytes = 16 * 1024;
  std::size_t max_threads = 1024;
  // After an answer that leaves a body unread: discard up to this many bytes, for at most
  // drain_time, and close once the client has been silent for drain_quiet.
  std::size_t max_drain_bytes = 1 << 20;
  std::chrono::milliseconds drain_time{1000};
  std::chrono::milliseconds drain_quiet{100};
};

// One accepted connection.
struct GateConnection {
  int fd = -1;
  std::string buffered;  // bytes read ahead of the HTTP parser
  std::size_t consumed = 0;
  GateClock::time_point idle_since;
  GateClock::time_point first_byte{};  // of the current request; {} before it
  bool close_after_response = false;   // its request body was left unread
  // Closing after an answer to a request whose body was not read: the gate discards what
  // the client still sends for a moment, so that closing does not reset the connection
  // before the client has read the answer.
  bool draining = false;
  std::size_t drained = 0;
  GateClock::time_point drain_until{};
  GateClock::time_point last_data{};
};

// The httplib::Stream a worker serves one request of a GateConnection through: the gate's
// buffer first, then the socket, with every read bounded by the request's deadline. Uses
// poll(), so descriptors above FD_SETSIZE work.
class GateStream final : public httplib::Stream {
 public:
  GateStream(GateConnection& conn, GateClock::time_point deadline, std::chrono::milliseconds io_timeout)
      : conn_(conn), deadline_(deadline), io_timeout_(io_timeout) {}

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, std::size_t size) override;
  ssize_t write(const char* ptr, std::size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override;

 private:
  // Waits for `events` up to the I/O timeout (reads: also the request deadline).
  bool wait(short events, bool reading) const;

  GateConnection& conn_;
  GateClock::time_point deadline_;
  std::chrono::milliseconds io_timeout_;
};

class ConnectionGate {
 public:
  // Serves the one complete request at the head of the stream on a worker; returns true
  // when the connection may carry another request.
  using Serve = std::function<bool(httplib::Stream&)>;

  ConnectionGate(GateLimits limits, Serve serve);
  ~ConnectionGate();
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  void start();
  // Takes an accepted socket (any thread).
  void add(int fd);
  // Closes waiting connections, cuts the ones being served and joins every thread.
  void stop();

  // Marks the connection the calling worker is serving to close after this response:
  // its request body was not read, so the next bytes are not a request.
  static void close_after_response();
  // Whether the calling worker's connection closes after this response.
  static bool closing_after_response();

  std::size_t waiting() const;  // connections held between or before requests
  std::size_t threads() const { return pool_.threads(); }
  std::size_t busy() const { return pool_.busy(); }
  uint64_t dropped_read_timeout() const { return dropped_read_timeout_.load(); }
  uint64_t dropped_head_too_large() const { return dropped_head_too_large_.load(); }

 private:
  using ConnPtr = std::shared_ptr<GateConnection>;

  void run();
  void wake();
  enum class ReadResult { kOpen, kEof, kError };
  // Reads what the socket has into the buffer (or discards it while draining).
  ReadResult read_available(GateConnection& c);
  // Handles a readable connection; false when it is to be closed.
  bool on_readable(const ConnPtr& c);
  // Closes connections past their deadline.
  void sweep(GateClock::time_point now);
  void forget(int fd);
  // True once the buffered bytes hold a whole request head (and a small body).
  bool request_ready(const GateConnection& c) const;
  void dispatch(const ConnPtr& c);
  void serve_on_worker(const ConnPtr& c);
  // Answers `status` with a JSON error and closes (best effort: the socket may be full).
  void refuse(GateConnection& c, int status, const std::string& message);
  void close_conn(GateConnection& c);

  const GateLimits limits_;
  const Serve serve_;
  GrowingThreadPool pool_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread reactor_;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mu_;
  std::vector<ConnPtr> incoming_;                    // new or returning, for the reactor
  std::set<int> serving_;                            // fds on workers (cut at stop)
  std::unordered_map<int, ConnPtr> waiting_;         // reactor thread only
  std::atomic<std::size_t> waiting_count_{0};
  std::atomic<uint64_t> dropped_read_timeout_{0};
  std::atomic<uint64_t> dropped_head_too_large_{0};
};

}  // namespace dlslime::nanoctrl
