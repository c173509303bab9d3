#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace dlslime {

// A small pool of threads for memory copies that must not run on an I/O thread: one
// 256 MiB copy would stall every other peer of that thread for tens of milliseconds. Jobs
// run in the order they were submitted, several at once; each is a bounded piece of work
// (a transport splits large transfers into chunks before submitting them), and its owner
// bounds how many it has queued.
//
// One pool per process, made at first use and never destroyed: a job's completion may
// drop the last reference to the endpoint that submitted it, on a worker, and a pool owned
// by endpoints would then have to join the thread it runs on. Idle workers cost nothing. A
// fork() child makes its own (the parent's threads do not exist there).
class CopyWorkers {
 public:
  explicit CopyWorkers(unsigned threads);
  CopyWorkers(const CopyWorkers&) = delete;
  CopyWorkers& operator=(const CopyWorkers&) = delete;

  // This process's pool (DLSLIME_COPY_THREADS threads, default min(4, cores); a bad value
  // raises InvalidArgumentError when the pool is made).
  static CopyWorkers& shared();

  // Runs `job` on a worker. Jobs must not throw (one that does is logged and dropped).
  void submit(std::function<void()> job);
  unsigned size() const { return static_cast<unsigned>(threads_.size()); }

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
};

}  // namespace dlslime
