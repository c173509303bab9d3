// The host-local link between the simulated RDMA devices of different processes
// (docs/rdma.md, "Across processes"). Each process's fabric listens on an abstract unix
// socket named after its pid, "@dlslime-sim_rdma0-<pid>"; a requester connects to the
// socket of the pid its QP's remote GID names and sends one request per WR; the
// responder's fabric checks it against its own QPs and MRs and moves the bytes itself
// with process_vm_readv/process_vm_writev, then answers. A connection that closes is a
// dead peer: its unanswered requests are lost, which the requester turns into ACK
// timeouts and, after its retry count, RETRY_EXC_ERR.
//
// Threads: one I/O thread per fabric reads both requests and answers and handles them
// under the fabric's mutex; the engine sends requests under that mutex. Sends block, which
// cannot deadlock in practice: each QP has at most one request in flight (stop-and-wait),
// so what one side can have queued towards the other is a few hundred bytes per QP, far
// below a socket's buffer.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "rdma/sim_device.h"

namespace dlslime::rdma::sim {

// Copies `total` bytes from the scatter list `src` (in process `src_pid`) to `dst` (in
// `dst_pid`); pid 0 is this process, and at most one side is another process. Returns 0
// or the errno of process_vm_readv/process_vm_writev (EFAULT for a short copy).
int move_bytes(pid_t dst_pid, const std::vector<Sge>& dst, pid_t src_pid, const std::vector<Sge>& src,
               uint64_t total);

// Logs why a copy into or out of process `pid` failed with `err`, naming what the user
// can change (ptrace permission for EPERM); once per pid and errno, so a flood of failing
// WRs cannot flood stderr.
void report_copy_error(pid_t pid, int err);
// What the ptrace scope permits, for the log line and the docs ("" without Yama).
std::string ptrace_scope_note();

class Link {
 public:
  // Listens for this process's peers; the I/O thread takes `fabric.mu` to handle them.
  explicit Link(Fabric& fabric);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // Sends `rq` to the fabric of `pid` (fabric.mu held), connecting first if needed.
  // Returns 0 and the connection's id in *link, or an errno (ECONNREFUSED: nothing
  // listens there any more, the process is gone).
  int send_request(pid_t pid, const Request& rq, uint64_t* link);

 private:
  struct Conn {
    int fd = -1;
    pid_t pid = 0;  // the peer process (SO_PEERCRED)
  };
  void run();
  uint64_t add_conn(int fd);                // fabric.mu held
  void close_conn(uint64_t id);             // fabric.mu held
  bool handle_message(uint64_t id, const uint8_t* data, size_t size);  // false: drop the connection
  void wake();

  Fabric& fabric_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  bool stop_ = false;                              // fabric.mu
  uint64_t next_id_ = 1;                           // fabric.mu
  std::unordered_map<uint64_t, Conn> conns_;       // fabric.mu; by id
  std::unordered_map<pid_t, uint64_t> by_pid_;     // fabric.mu; where requests to a pid go
  std::thread io_;
};

}  // namespace dlslime::rdma::sim
