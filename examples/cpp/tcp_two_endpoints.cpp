// Two TcpEndpoints in one process: a one-sided write, a one-sided read and a two-sided
// message, each checked byte for byte. Exits non-zero on any mismatch or error.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <dlslime/dlslime.h>

int main() {
  using namespace std::chrono_literals;
  try {
    dlslime::TcpEndpoint a("127.0.0.1", 0);
    dlslime::TcpEndpoint b("127.0.0.1", 0);

    std::vector<char> src(1 << 16), dst(1 << 16, 0);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i % 251);
    const int32_t h_src = a.register_memory_region("src", reinterpret_cast<uintptr_t>(src.data()), 0, src.size());
    b.register_memory_region("dst", reinterpret_cast<uintptr_t>(dst.data()), 0, dst.size());

    // Symmetric connect; b's regions travel in its endpoint_info.
    a.connect(b.endpoint_info());
    b.connect(a.endpoint_info());
    const int32_t h_dst = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"]);

    auto w = a.write({{h_src, h_dst, /*target_offset=*/0, /*source_offset=*/0, src.size()}});
    if (w.wait_for(10s) != 0 || src != dst) {
      std::fprintf(stderr, "write failed: %s\n", w.message().c_str());
      return 1;
    }

    std::vector<char> back(256, 0);
    const int32_t h_back = a.register_memory_region("back", reinterpret_cast<uintptr_t>(back.data()), 0, back.size());
    auto r = a.read({{h_back, h_dst, /*remote*/ 1000, /*local*/ 0, back.size()}});
    if (r.wait_for(10s) != 0 || !std::equal(back.begin(), back.end(), dst.begin() + 1000)) {
      std::fprintf(stderr, "read failed: %s\n", r.message().c_str());
      return 1;
    }

    std::string msg = "hello from dlslime " DLSLIME_VERSION_STRING;
    std::vector<char> inbox(128, 0);
    auto rv = b.recv({reinterpret_cast<uintptr_t>(inbox.data()), 0, inbox.size()});
    auto sd = a.send({reinterpret_cast<uintptr_t>(msg.data()), 0, msg.size()});
    if (sd.wait_for(10s) != 0 || rv.wait_for(10s) != 0 || rv.nbytes() != msg.size() ||
        std::string(inbox.data(), rv.nbytes()) != msg) {
      std::fprintf(stderr, "send/recv failed: %s %s\n", sd.message().c_str(), rv.message().c_str());
      return 1;
    }
    std::printf("ok: wrote %zu B, read %zu B, received \"%s\"\n", src.size(), back.size(),
                std::string(inbox.data(), rv.nbytes()).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
