#include "bench_report.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

namespace dlslime::bench {

void ResultRow::set_latencies(std::vector<double> seconds) {
  iters = static_cast<uint32_t>(seconds.size());
  if (seconds.empty()) return;
  std::sort(seconds.begin(), seconds.end());
  const double bytes = static_cast<double>(msg_size) * batch;
  const double min_s = seconds.front();
  const double avg_s = std::accumulate(seconds.begin(), seconds.end(), 0.0) / static_cast<double>(seconds.size());
  // Nearest-rank percentile.
  const auto rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(seconds.size())));
  const double p99_s = seconds[std::clamp<size_t>(rank, 1, seconds.size()) - 1];
  total_mb = bytes / 1e6;
  min_lat_us = min_s * 1e6;
  avg_lat_us = avg_s * 1e6;
  p99_lat_us = p99_s * 1e6;
  max_bw_gbps = min_s > 0 ? bytes / min_s / 1e9 : 0;
  avg_bw_gbps = avg_s > 0 ? bytes / avg_s / 1e9 : 0;
  msgs_per_s = avg_s > 0 ? batch / avg_s : 0;
}

nlohmann::ordered_json ResultRow::to_json() const {
  return {{"msg_size", msg_size},
          {"batch", batch},
          {"total_mb", total_mb},
          {"max_bw_gbps", max_bw_gbps},
          {"avg_bw_gbps", avg_bw_gbps},
          {"min_lat_us", min_lat_us},
          {"avg_lat_us", avg_lat_us},
          {"p99_lat_us", p99_lat_us},
          {"iters", iters},
          {"msgs_per_s", msgs_per_s},
          {"recv_msgs_per_s", recv_msgs_per_s},
          {"cpu_initiator_s", cpu_initiator_s},
          {"cpu_target_s", cpu_target_s},
          {"bytes_per_cpu_s", bytes_per_cpu_s},
          {"verified", verified}};
}

double process_cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

// ---------------------------------------------------------------------------------------

TablePrinter::TablePrinter(std::string title, bool with_rate) : title_(std::move(title)) {
  columns_ = {"MsgSize (B)",  "BatchSize",    "TotalSize (MB)", "Max BW (GB/s)",
              "Avg BW (GB/s)", "Min Lat (us)", "Avg Lat (us)",   "P99 Lat (us)"};
  if (with_rate) columns_.emplace_back("Recv Rate (Mmsg/s)");
}

namespace {

std::string rule(const std::vector<std::string>& columns, bool joints) {
  std::string s = "+";
  for (size_t i = 0; i < columns.size(); ++i) {
    s += std::string(columns[i].size() + 2, '-');
    s += (joints || i + 1 == columns.size()) ? "+" : "-";
  }
  return s;
}

}  // namespace

void TablePrinter::header() const {
  const std::string top = rule(columns_, false);
  const size_t inner = top.size() - 2;
  std::string title = title_.size() > inner ? title_.substr(0, inner) : title_;
  const std::string joints = rule(columns_, true);
  std::string out = fmt::format("{}\n|{:^{}}|\n{}\n|", top, title, inner, joints);
  for (const auto& c : columns_) out += fmt::format(" {} |", c);
  out += fmt::format("\n{}\n", joints);
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
}

void TablePrinter::row(const ResultRow& r) const {
  std::vector<std::string> cells = {
      fmt::format("{}", r.msg_size),          fmt::format("{}", r.batch),
      fmt::format("{:.2f}", r.total_mb),      fmt::format("{:.2f}", r.max_bw_gbps),
      fmt::format("{:.2f}", r.avg_bw_gbps),   fmt::format("{:.2f}", r.min_lat_us),
      fmt::format("{:.2f}", r.avg_lat_us),    fmt::format("{:.2f}", r.p99_lat_us)};
  if (columns_.size() > cells.size()) cells.push_back(fmt::format("{:.3f}", r.recv_msgs_per_s / 1e6));
  std::string out = "|";
  for (size_t i = 0; i < columns_.size(); ++i) out += fmt::format("{:^{}}|", cells[i], columns_[i].size() + 2);
  out += "\n";
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
}

void TablePrinter::footer() const {
  std::fputs((rule(columns_, true) + "\n").c_str(), stdout);
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------------------

ProgressReporter::ProgressReporter(Progress mode) {
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  bar_ = mode == Progress::kBar || (mode == Progress::kAuto && tty);
  lines_ = mode == Progress::kLines || (mode == Progress::kAuto && !tty);
}

void ProgressReporter::begin_size(size_t index, size_t count, uint64_t size, uint32_t batch, uint32_t total_batches) {
  label_ = fmt::format("[{}/{}] {} B x {}", index + 1, count, size, batch);
  total_ = total_batches;
  if (lines_) {
    std::fprintf(stderr, "dlslime-bench: %s: %u batches\n", label_.c_str(), total_batches);
    std::fflush(stderr);
  }
  last_draw_ = {};
  update(0);
}

void ProgressReporter::update(uint32_t done) {
  if (!bar_) return;
  const auto now = std::chrono::steady_clock::now();
  if (done != 0 && done != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  constexpr int kWidth = 30;
  const int filled = total_ ? static_cast<int>(static_cast<uint64_t>(done) * kWidth / total_) : kWidth;
  std::fprintf(stderr, "\r%s [%s%s] %u/%u\033[K", label_.c_str(), std::string(filled, '#').c_str(),
               std::string(kWidth - filled, '.').c_str(), done, total_);
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressReporter::clear() {
  if (!drawn_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  drawn_ = false;
}

// ---------------------------------------------------------------------------------------

void write_json_report(const std::string& path, const nlohmann::json& config, const std::vector<ResultRow>& rows) {
  nlohmann::ordered_json doc;
  doc["config"] = nlohmann::ordered_json::parse(config.dump());
  doc["rows"] = nlohmann::ordered_json::array();
  for (const auto& r : rows) doc["rows"].push_back(r.to_json());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) throw std::runtime_error(fmt::format("cannot write --json {}", path));
    out << doc.dump(2) << "\n";
    if (!out) throw std::runtime_error(fmt::format("cannot write --json {}", path));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error(fmt::format("cannot write --json {}", path));
  }
}

void run_plot(const std::string& json_path, const std::string& png_path) {
  const char* env_python = std::getenv("DLSLIME_PYTHON");
  const std::string python = env_python && *env_python ? env_python : "python3";
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("--plot: fork failed");
  if (pid == 0) {
    ::execlp(python.c_str(), python.c_str(), "-m", "dlslime.bench_plot", json_path.c_str(), "-o", png_path.c_str(),
             static_cast<char*>(nullptr));
    std::fprintf(stderr, "dlslime-bench: --plot: cannot run %s\n", python.c_str());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error("--plot: lost track of the plotting process");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error(fmt::format(
        "--plot: `{} -m dlslime.bench_plot` failed (it needs the dlslime Python package and matplotlib; "
        "set DLSLIME_PYTHON to the interpreter that has them). The JSON is in {}",
        python, json_path));
  }
}

}  // namespace dlslime::bench
