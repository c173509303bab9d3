#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_config.h"

namespace dlslime::bench {

// One row of the table: one message size.
struct ResultRow {
  uint64_t msg_size = 0;
  uint32_t batch = 0;
  uint32_t iters = 0;
  double total_mb = 0;  // bytes per batch / 1e6
  double max_bw_gbps = 0;  // bytes per batch / min latency, in 1e9 B/s
  double avg_bw_gbps = 0;  // bytes per batch / mean latency
  double min_lat_us = 0;
  double avg_lat_us = 0;
  double p99_lat_us = 0;
  double msgs_per_s = 0;  // items (messages for send) per second at the mean latency
  // send: messages per second that completed at the target's posted receives, from posting the
  // first timed batch to the last completion. The table's rate column: with eager sends a
  // sender may run ahead of the receiver, so this is the end-to-end message rate.
  double recv_msgs_per_s = 0;
  // CPU time (user + sys, all threads, getrusage) of each process over the warmup and timed
  // batches, and the bytes those batches moved per CPU-second of both processes together.
  double cpu_initiator_s = 0;
  double cpu_target_s = 0;
  double bytes_per_cpu_s = 0;
  bool verified = false;

  // Fills the latency and bandwidth columns from per-batch latencies in seconds.
  void set_latencies(std::vector<double> seconds);
  nlohmann::ordered_json to_json() const;  // keys in table order
};

// user + sys CPU seconds of this process, all threads.
double process_cpu_seconds();

// MORI-IO's boxed table, plus P99 latency (and the message rate for send), printed row by
// row to stdout as sizes finish.
class TablePrinter {
 public:
  TablePrinter(std::string title, bool with_rate);
  void header() const;
  void row(const ResultRow& r) const;
  void footer() const;

 private:
  std::string title_;
  std::vector<std::string> columns_;
};

// Progress on stderr: a redrawn bar on a terminal, or one line per size.
class ProgressReporter {
 public:
  explicit ProgressReporter(Progress mode);
  void begin_size(size_t index, size_t count, uint64_t size, uint32_t batch, uint32_t total_batches);
  void update(uint32_t batches_done);
  void clear();  // before printing a table row

 private:
  bool bar_ = false;
  bool lines_ = false;
  bool drawn_ = false;
  std::string label_;
  uint32_t total_ = 0;
  std::chrono::steady_clock::time_point last_draw_{};
};

void write_json_report(const std::string& path, const nlohmann::json& config, const std::vector<ResultRow>& rows);
// Runs `python3 -m dlslime.bench_plot` ($DLSLIME_PYTHON overrides the interpreter). Throws
// std::runtime_error with the reason if it fails.
void run_plot(const std::string& json_path, const std::string& png_path);

}  // namespace dlslime::bench
