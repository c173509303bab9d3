// cma_loop: the raw cross-memory-attach baseline of the TCP same-host path
// (docs/tcp.md "Same-host path", docs/performance.md). Two processes, as dlslime-bench
// runs them: the parent holds the source buffer, a forked child copies batches out of it
// into its own buffer with process_vm_readv, as a same-host target pulls a write. Same
// sizes, batch and strided slot layout (each item in its own slot, a page of guard after
// it) as `dlslime-bench --op write`, one syscall per batch of up to IOV_MAX items, no
// protocol at all: the memory-copy limit the path is measured against.
//
// usage: cma_loop [--sizes A,B,C] [--batch N] [--iters N] [--warmup N] [--one-slot] [--json]
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Args {
  std::vector<uint64_t> sizes{8, 65536, 1 << 20};
  uint32_t batch = 256;
  uint32_t iters = 20;
  uint32_t warmup = 3;
  bool json = false;
  bool one_slot = false;  // every item copies the first slot onto the first slot (cache-resident)
};

uint64_t parse_size(const std::string& s) {
  char* end = nullptr;
  uint64_t v = std::strtoull(s.c_str(), &end, 10);
  if (*end == 'K' || *end == 'k') v <<= 10;
  if (*end == 'M' || *end == 'm') v <<= 20;
  if (*end == 'G' || *end == 'g') v <<= 30;
  return v;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "cma_loop: %s\nusage: cma_loop [--sizes A,B,C] [--batch N] [--iters N] [--warmup N] [--one-slot] [--json]\n",
               why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + arg).c_str());
      return argv[++i];
    };
    if (arg == "--sizes") {
      a.sizes.clear();
      std::string list = next();
      for (size_t p = 0; p <= list.size();) {
        const size_t q = std::min(list.find(',', p), list.size());
        a.sizes.push_back(parse_size(list.substr(p, q - p)));
        p = q + 1;
      }
    } else if (arg == "--batch") {
      a.batch = static_cast<uint32_t>(std::stoul(next()));
    } else if (arg == "--iters") {
      a.iters = static_cast<uint32_t>(std::stoul(next()));
    } else if (arg == "--warmup") {
      a.warmup = static_cast<uint32_t>(std::stoul(next()));
    } else if (arg == "--one-slot") {
      a.one_slot = true;
    } else if (arg == "--json") {
      a.json = true;
    } else {
      usage(("unknown option " + arg).c_str());
    }
  }
  if (a.sizes.empty() || a.batch == 0 || a.iters == 0) usage("sizes, batch and iters must be positive");
  return a;
}

uint64_t slot_stride(uint64_t size) {
  const uint64_t page = 4096;
  return (size + page - 1) / page * page + page;  // a guard page after each item
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  uint64_t bytes = 0;
  for (uint64_t s : a.sizes) bytes = std::max(bytes, slot_stride(s) * a.batch);
  auto* src = static_cast<uint8_t*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (src == MAP_FAILED) usage("cannot map the source buffer");
  for (uint64_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 31 + 7);
  const pid_t parent = getpid();
  int ready[2];
  if (pipe(ready) != 0) usage("pipe failed");
  const pid_t child = fork();
  if (child < 0) usage("fork failed");
  if (child > 0) {  // the parent only holds its memory until the child is done
    close(ready[1]);
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  }
  auto* dst = static_cast<uint8_t*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (dst == MAP_FAILED) usage("cannot map the destination buffer");
  std::memset(dst, 0, bytes);
  if (a.json) std::printf("[");
  if (!a.json) {
    std::printf("| MsgSize (B) | BatchSize | Avg BW (GB/s) | Avg Lat (us) |\n|---|---|---|---|\n");
  }
  bool first = true;
  for (uint64_t size : a.sizes) {
    const uint64_t stride = slot_stride(size);
    std::vector<iovec> local(a.batch), remote(a.batch);
    for (uint32_t i = 0; i < a.batch; ++i) {
      // The bench's write rotation: item i goes from a permuted source slot to slot i.
      const uint32_t from = (i * 7 + 3) % a.batch;
      local[i] = {dst + (a.one_slot ? 0 : i * stride), size};
      remote[i] = {src + (a.one_slot ? 0 : from * stride), size};
    }
    double total_s = 0;
    for (uint32_t k = 0; k < a.warmup + a.iters; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      for (uint32_t at = 0; at < a.batch; at += IOV_MAX) {
        const uint32_t n = std::min<uint32_t>(IOV_MAX, a.batch - at);
        const ssize_t got = process_vm_readv(parent, &local[at], n, &remote[at], n, 0);
        if (got != static_cast<ssize_t>(n * size)) {
          std::fprintf(stderr, "cma_loop: process_vm_readv: %s\n", got < 0 ? std::strerror(errno) : "short copy");
          return 1;
        }
      }
      const auto t1 = std::chrono::steady_clock::now();
      if (k >= a.warmup) total_s += std::chrono::duration<double>(t1 - t0).count();
    }
    const double avg_s = total_s / a.iters;
    const double gbps = static_cast<double>(size) * a.batch / avg_s / 1e9;
    if (a.json) {
      std::printf("%s{\"size\": %llu, \"batch\": %u, \"avg_gbps\": %.4f, \"avg_lat_us\": %.2f}", first ? "" : ", ",
                  static_cast<unsigned long long>(size), a.batch, gbps, avg_s * 1e6);
    } else {
      std::printf("| %llu | %u | %.2f | %.2f |\n", static_cast<unsigned long long>(size), a.batch, gbps, avg_s * 1e6);
    }
    first = false;
  }
  if (a.json) std::printf("]\n");
  return 0;
}
