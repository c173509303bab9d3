// The target: owns the remote side of every op. It fills or poisons its buffer for each size,
// posts the receives for send, verifies what was written or sent to it, and reports its CPU
// time. It prints nothing but errors (and, across hosts, where it listens).

#include <cstdio>

#include <fmt/format.h>

#include "bench_report.h"
#include "bench_session.h"

namespace dlslime::bench {

namespace {

class Target {
 public:
  Target(BenchConfig cfg, PeerLink& link, DataPath& data) : cfg_(std::move(cfg)), link_(link), data_(data) {}

  // Serves size requests until the initiator says bye.
  void serve();

 private:
  void run_size(const nlohmann::json& request);
  // Posts `batch` receives per batch and waits for them; returns the seconds from posting the
  // first timed batch to the completion of the last one.
  double receive_all(const SlotLayout& layout, uint32_t total_batches);

  BenchConfig cfg_;
  PeerLink& link_;
  DataPath& data_;
};

double Target::receive_all(const SlotLayout& layout, uint32_t total_batches) {
  std::vector<Future> recvs(layout.batch);
  const uintptr_t base = data_.buffer->address();
  Clock::time_point timed_start = Clock::now();
  for (uint32_t k = 0; k < total_batches; ++k) {
    if (k == cfg_.warmup) timed_start = Clock::now();
    for (uint32_t i = 0; i < layout.batch; ++i) {
      recvs[i] = data_.endpoint->recv(Chunk{base, layout.offset(i), layout.size});
    }
    for (uint32_t i = 0; i < layout.batch; ++i) {
      link_.wait(recvs[i], "recv");
      if (recvs[i].nbytes() != layout.size) {
        throw BenchFailure(fmt::format("recv {} of batch {} got {} bytes, expected {}", i, k, recvs[i].nbytes(),
                                       layout.size));
      }
    }
  }
  return std::chrono::duration<double>(Clock::now() - timed_start).count();
}

void Target::run_size(const nlohmann::json& request) {
  const size_t index = request.at("index").get<size_t>();
  const uint64_t size = request.at("size").get<uint64_t>();
  if (index >= cfg_.sizes.size() || cfg_.sizes[index] != size) {
    throw BenchFailure(fmt::format("protocol error: size request {} ({} B) is not in the run parameters", index, size));
  }
  const SlotLayout layout = SlotLayout::make(size, cfg_.batch, cfg_.contiguous);
  const uint64_t seed = pattern_seed(cfg_.seed, index);
  const uint8_t poison = poison_byte(index);
  const bool local_is_destination = cfg_.op != Op::kRead;
  if (local_is_destination) {
    fill_poison(*data_.buffer, poison);
  } else {
    fill_source(*data_.buffer, layout, seed);
  }
  const uint32_t total = cfg_.warmup + cfg_.iters;
  const double cpu0 = process_cpu_seconds();
  link_.send({{"type", "ready"}});
  const double recv_s = cfg_.op == Op::kSend ? receive_all(layout, total) : 0.0;

  const nlohmann::json finish = link_.expect("finish");
  const double cpu1 = process_cpu_seconds();
  nlohmann::json result = {{"type", "result"}, {"cpu_s", cpu1 - cpu0}, {"recv_s", recv_s}, {"ok", true}};
  if (cfg_.verify && local_is_destination) {
    const VerifyResult v = verify_destination(*data_.buffer, layout, seed, poison,
                                              finish.at("last_iter").get<uint64_t>(), cfg_.inject_corruption);
    result["ok"] = v.ok;
    result["bad_items"] = v.bad_items;
    result["error"] = v.first_error;
  }
  link_.send(result);
}

void Target::serve() {
  for (;;) {
    nlohmann::json msg = link_.expect_any();
    const std::string type = msg.value("type", std::string());
    if (type == "size") {
      run_size(msg);
    } else if (type == "bye") {
      link_.send({{"type", "bye"}, {"cpu_total_s", process_cpu_seconds()}});
      return;
    } else {
      throw BenchFailure(fmt::format("protocol error: unexpected '{}' from the initiator", type));
    }
  }
}

}  // namespace

int run_target(BenchConfig cfg) {
  const auto accept_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(cfg.timeout_s));
  const bool announce = cfg.control_fd < 0;
  ControlChannel channel = cfg.control_fd >= 0
                               ? ControlChannel(cfg.control_fd)
                               : ControlChannel::accept_one(cfg.listen, accept_deadline, [](const std::string& at) {
                                   std::fprintf(stderr, "dlslime-bench target: waiting for an initiator on %s\n",
                                                at.c_str());
                                   std::fflush(stderr);
                                 });
  PeerLink link(std::move(channel), cfg.timeout_s, "initiator");
  try {
    const nlohmann::json hello = link.expect("hello");
    apply_run_params(hello.at("params"), &cfg);
    DataPath data = DataPath::create(cfg);
    nlohmann::json reply = data.hello_payload();
    reply["type"] = "hello";
    link.send(reply);
    data.connect(hello, link.channel());
    link.send({{"type", "connected"}});
    link.expect("connected");
    Target(cfg, link, data).serve();
    if (announce) std::fprintf(stderr, "dlslime-bench target: run finished\n");
    return 0;
  } catch (const std::exception& e) {
    link.abort(e.what());
    throw;
  }
}

}  // namespace dlslime::bench
