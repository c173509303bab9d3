// NanoCtrl's optional bearer token: the header check itself, the server's 401s on every
// route but /healthz (both stores), the client's token and error, and the `nanoctrl` binary
// with --token-file (the token stays out of command lines, metadata, logs and metrics).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <sstream>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "dlslime/errors.h"
#include "dlslime/nanoctrl.h"
#include "dlslime/nanoctrl_client.h"
#include "nanoctrl/auth.h"
#include "redis_process.h"

using namespace std::chrono_literals;
using dlslime::NanoCtrlClient;
using dlslime::NanoCtrlConfig;
using dlslime::NanoCtrlServer;
using dlslime::nanoctrl::BearerAuth;
using nlohmann::json;
using nanoctrl_test::RedisProcess;

namespace {

const std::string kToken = "tok-7f3a9c1e5b2d4f60a8e1c3b5d7f9a0b2";
const std::string kWrong = "tok-00000000000000000000000000000000";

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One raw request (what the client library never sends); `auth` is the Authorization header.
httplib::Result raw(const std::string& url, const std::string& method, const std::string& path,
                    const std::string& auth = "", const std::string& body = "{}") {
  httplib::Client c(url);
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(10, 0);
  httplib::Headers h;
  if (!auth.empty()) h.emplace("Authorization", auth);
  if (method == "GET") return c.Get(path, h);
  return c.Post(path, h, body, "application/json");
}

// The value of one sample line of Prometheus text ("" when absent).
std::string sample(const std::string& metrics, const std::string& name) {
  auto at = metrics.find("\n" + name + " ");
  if (at == std::string::npos) return "";
  at += name.size() + 2;
  return metrics.substr(at, metrics.find('\n', at) - at);
}

// Sets an environment variable for one scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) { ::setenv(name.c_str(), value.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

}  // namespace

TEST(BearerAuth, DisabledPassesEverything) {
  BearerAuth auth("");
  EXPECT_FALSE(auth.enabled());
  EXPECT_EQ(auth.check(""), BearerAuth::Result::kOk);
  EXPECT_EQ(auth.check("Bearer anything"), BearerAuth::Result::kOk);
}

TEST(BearerAuth, ParsesTheHeader) {
  BearerAuth auth("s3cret");
  ASSERT_TRUE(auth.enabled());
  EXPECT_EQ(auth.check("Bearer s3cret"), BearerAuth::Result::kOk);
  EXPECT_EQ(auth.check("bearer s3cret"), BearerAuth::Result::kOk);  // the scheme is case-insensitive
  EXPECT_EQ(auth.check("  BEARER \t s3cret  "), BearerAuth::Result::kOk);
  EXPECT_EQ(auth.check(""), BearerAuth::Result::kMissing);
  EXPECT_EQ(auth.check("Bearer"), BearerAuth::Result::kMissing);
  EXPECT_EQ(auth.check("Bearer   "), BearerAuth::Result::kMissing);
  EXPECT_EQ(auth.check("Bearers3cret"), BearerAuth::Result::kMissing);
  EXPECT_EQ(auth.check("Basic czNjcmV0"), BearerAuth::Result::kMissing);
  EXPECT_EQ(auth.check("s3cret"), BearerAuth::Result::kMissing);
  EXPECT_EQ(auth.check("Bearer s3cre"), BearerAuth::Result::kWrong);   // a prefix
  EXPECT_EQ(auth.check("Bearer s3cret2"), BearerAuth::Result::kWrong); // longer
  EXPECT_EQ(auth.check("Bearer S3CRET"), BearerAuth::Result::kWrong);  // the token is case-sensitive
}

TEST(BearerAuth, TokenCharacters) {
  EXPECT_NO_THROW(dlslime::nanoctrl::validate_token("aZ09-._~+/=!", "t"));
  for (std::string bad : {std::string(""), std::string("has space"), std::string("line\nbreak"),
                          std::string("tab\t"), std::string("caf\xc3\xa9"), std::string(4097, 'a')}) {
    try {
      dlslime::nanoctrl::validate_token(bad, "the token");
      ADD_FAILURE() << "accepted a bad token of " << bad.size() << " bytes";
    } catch (const dlslime::InvalidArgumentError& e) {
      if (!bad.empty()) EXPECT_EQ(std::string(e.what()).find(bad), std::string::npos);  // never echoed
    }
  }
}

TEST(NanoCtrlAuthConfig, NeverShowsTheToken) {
  NanoCtrlConfig c;
  EXPECT_EQ(c.to_json()["token"], "none");
  c.token = kToken;
  EXPECT_EQ(c.to_json()["token"], "set");
  EXPECT_EQ(c.to_string().find(kToken), std::string::npos);
  c.token = "two words";
  try {
    c.validate();
    ADD_FAILURE() << "a token with a space was accepted";
  } catch (const dlslime::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("token"), std::string::npos);
    EXPECT_EQ(std::string(e.what()).find("two words"), std::string::npos);
  }
  EXPECT_THROW(NanoCtrlServer{c}, dlslime::InvalidArgumentError);
}

namespace {

class AuthServerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "redis") redis_ = std::make_unique<RedisProcess>();
    NanoCtrlConfig c;
    c.port = 0;
    c.redis_url = redis_ ? redis_->url() : "";
    c.redis_timeout = 500ms;
    c.token = kToken;
    server_ = std::make_unique<NanoCtrlServer>(c);
    server_->start();
    url_ = server_->url();
  }
  void TearDown() override {
    server_->stop();
    server_.reset();
    redis_.reset();
  }

  std::unique_ptr<RedisProcess> redis_;
  std::unique_ptr<NanoCtrlServer> server_;
  std::string url_;
};

}  // namespace

TEST_P(AuthServerTest, RawRequestsNeedTheToken) {
  const std::string good = "Bearer " + kToken, wrong = "Bearer " + kWrong;
  // Without the header: 401, the JSON error body, the challenge header.
  for (auto [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"POST", "/query"}, {"POST", "/start_peer_agent"}, {"POST", "/mailbox/post"}, {"POST", "/mailbox/recv"},
           {"POST", "/register"}, {"GET", "/metrics"}, {"GET", "/"}, {"GET", "/v1/desired_topology/a"},
           {"POST", "/no_such_route"}}) {
    auto r = raw(url_, method, path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 401) << method << " " << path;
    EXPECT_EQ(r->get_header_value("WWW-Authenticate").rfind("Bearer", 0), 0u) << path;
    json body = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(body.is_object()) << r->body;
    EXPECT_EQ(body["status"], "error");
    EXPECT_NE(body["message"].get<std::string>().find("requires a bearer token"), std::string::npos) << r->body;

    auto w = raw(url_, method, path, wrong);
    ASSERT_TRUE(w);
    EXPECT_EQ(w->status, 401) << path;
    EXPECT_NE(w->body.find("token is wrong"), std::string::npos) << w->body;
    EXPECT_EQ(w->body.find(kWrong), std::string::npos);  // never echoed
    EXPECT_EQ(w->body.find(kToken), std::string::npos);
  }
  // Other schemes are "missing" too.
  EXPECT_EQ(raw(url_, "POST", "/query", "Basic " + kToken)->status, 401);

  // /healthz stays open and says that a token is needed.
  auto h = raw(url_, "GET", "/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["auth"], "bearer");

  // The right token works on every kind of route.
  auto reg = raw(url_, "POST", "/start_peer_agent", good, R"({"alias":"a"})");
  ASSERT_EQ(reg->status, 200) << reg->body;
  EXPECT_EQ(raw(url_, "POST", "/start_peer_agent", "bearer " + kToken, R"({"alias":"b"})")->status, 200);
  EXPECT_EQ(raw(url_, "POST", "/mailbox/post", good, R"({"to":"a","message":"hi","from":"b"})")->status, 200);
  auto got = raw(url_, "POST", "/mailbox/recv", good, R"({"alias":"a","timeout":1})");
  ASSERT_EQ(got->status, 200);
  EXPECT_EQ(json::parse(got->body)["messages"][0]["message"], "hi");
  EXPECT_EQ(raw(url_, "POST", "/query", good)->status, 200);
  EXPECT_EQ(raw(url_, "GET", "/", good)->status, 200);
  EXPECT_EQ(raw(url_, "POST", "/no_such_route", good)->status, 404);  // routing once authenticated
  EXPECT_EQ(raw(url_, "POST", "/healthz", good)->status, 405);

  auto m = raw(url_, "GET", "/metrics", good);
  ASSERT_EQ(m->status, 200);
  // 9 routes x (missing + wrong), the Basic header counted as missing.
  EXPECT_EQ(sample(m->body, R"(nanoctrl_auth_failures_total{reason="missing"})"), "10");
  EXPECT_EQ(sample(m->body, R"(nanoctrl_auth_failures_total{reason="wrong"})"), "9");
  EXPECT_EQ(sample(m->body, R"(nanoctrl_errors_total{kind="unauthorized"})"), "19");
  EXPECT_EQ(sample(m->body, R"(nanoctrl_requests_total{route="/query",code="401"})"), "3");
  EXPECT_EQ(m->body.find(kToken), std::string::npos);
  EXPECT_EQ(m->body.find(kWrong), std::string::npos);
}

TEST_P(AuthServerTest, ClientWithTheTokenWorks) {
  NanoCtrlClient c(url_, "job", 10s, kToken);
  EXPECT_TRUE(c.has_token());
  EXPECT_EQ(c.start_peer_agent({{"alias", "rx"}})["name"], "rx");
  EXPECT_EQ(c.start_peer_agent({{"alias", "tx"}})["name"], "tx");
  EXPECT_EQ(c.heartbeat("rx"), "ok");
  c.register_mr("tx", "kv", {{"addr", 4096}, {"length", 64}});
  EXPECT_EQ(c.get_mr_info("tx", "kv")->at("length"), 64);
  EXPECT_EQ(c.set_desired_topology("tx", {"rx"})["status"], "ok");
  EXPECT_TRUE(c.get_desired_topology("tx").has_value());  // a GET with a query string
  c.register_entity("svc", "k", "service", json::object());
  EXPECT_EQ(c.list_entities().size(), 1u);
  auto waiter = std::async(std::launch::async, [&] { return c.recv("rx", 10s); });
  EXPECT_EQ(c.post("rx", {{"n", 1}}, "tx"), 1u);
  auto got = waiter.get();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0]["message"]["n"], 1);
  EXPECT_EQ(c.query().size(), 2u);
  EXPECT_EQ(c.cleanup("tx")["status"], "ok");
}

TEST_P(AuthServerTest, ClientWithoutOrWithAWrongTokenIsRefused) {
  NanoCtrlClient none(url_);
  EXPECT_FALSE(none.has_token());
  EXPECT_EQ(none.healthz()["status"], "ok");  // open
  try {
    none.query();
    ADD_FAILURE() << "no 401";
  } catch (const dlslime::AuthenticationError& e) {
    EXPECT_NE(std::string(e.what()).find("401"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("requires a bearer token"), std::string::npos) << e.what();
  }
  NanoCtrlClient wrong(url_, "", 10s, kWrong);
  try {
    wrong.start_peer_agent({{"alias", "x"}});
    ADD_FAILURE() << "no 401";
  } catch (const dlslime::AuthenticationError& e) {
    EXPECT_NE(std::string(e.what()).find("token is wrong"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find(kWrong), std::string::npos);
  }
  EXPECT_THROW(wrong.post("x", "hi"), dlslime::AuthenticationError);
  EXPECT_THROW(wrong.recv("x", 0ms), dlslime::AuthenticationError);
  EXPECT_THROW(NanoCtrlClient(url_, "", 10s, "bad token"), dlslime::InvalidArgumentError);
}

TEST_P(AuthServerTest, ClientTakesTheTokenFromTheEnvironment) {
  {
    ScopedEnv env("DLSLIME_NANOCTRL_TOKEN", kToken);
    NanoCtrlClient c(url_);
    EXPECT_TRUE(c.has_token());
    EXPECT_EQ(c.start_peer_agent({{"alias", "e"}})["name"], "e");
    NanoCtrlClient explicit_wins(url_, "", 10s, kWrong);
    EXPECT_THROW(explicit_wins.query(), dlslime::AuthenticationError);
  }
  {
    ScopedEnv env("DLSLIME_NANOCTRL_TOKEN", "");  // empty = unset
    EXPECT_FALSE(NanoCtrlClient(url_).has_token());
  }
}

INSTANTIATE_TEST_SUITE_P(Stores, AuthServerTest, ::testing::Values("memory", "redis"),
                         [](const auto& info) { return info.param; });

TEST(NanoCtrlAuthOff, TokenlessServerIgnoresHeaders) {
  NanoCtrlConfig c;
  c.port = 0;
  NanoCtrlServer server(c);
  server.start();
  EXPECT_EQ(raw(server.url(), "POST", "/query")->status, 200);
  EXPECT_EQ(raw(server.url(), "POST", "/query", "Bearer whatever")->status, 200);
  EXPECT_EQ(json::parse(raw(server.url(), "GET", "/healthz")->body)["auth"], "none");
  NanoCtrlClient with_token(server.url(), "", 10s, kToken);
  EXPECT_EQ(with_token.start_peer_agent({{"alias", "a"}})["name"], "a");
  auto m = raw(server.url(), "GET", "/metrics");
  ASSERT_EQ(m->status, 200);
  EXPECT_EQ(sample(m->body, R"(nanoctrl_auth_failures_total{reason="missing"})"), "0");
  server.stop();
}

// The binary: `start --token-file` keeps the token off the daemon's command line, out of the
// metadata file and the log; status checks the token; stop needs none.
TEST(NanoCtrlAuthBinary, StartWithTokenFile) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("nanoctrl-auth-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::path token_file = dir / "token";
  std::ofstream(token_file) << "  " << kToken << "  \nsecond line ignored\n";
  fs::path wrong_file = dir / "wrong";
  std::ofstream(wrong_file) << kWrong << "\n";
  std::string pid_file = (dir / "nc.pid").string(), log_file = (dir / "nc.log").string();
  int port = nanoctrl_test::free_port();
  std::string url = "http://127.0.0.1:" + std::to_string(port);
  auto run = [](const std::string& args) {
    std::string cmd = "env -u NANOCTRL_TOKEN " + std::string(NANOCTRL_BINARY) + " " + args + " >/dev/null 2>&1";
    int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  ASSERT_EQ(run("start --port " + std::to_string(port) + " --pid-file " + pid_file + " --log-file " + log_file +
                " --token-file " + token_file.string()),
            0);
  // Stops the daemon even when an assertion below ends the test early.
  struct StopDaemon {
    std::function<int(const std::string&)> run;
    std::string pid_file;
    bool done = false;
    ~StopDaemon() {
      if (!done) run("stop --force --pid-file " + pid_file);
    }
  } stop_daemon{run, pid_file};
  EXPECT_EQ(run("status --pid-file " + pid_file), 0);  // /healthz needs no token
  EXPECT_EQ(run("status --pid-file " + pid_file + " --token-file " + token_file.string()), 0);
  EXPECT_EQ(run("status --pid-file " + pid_file + " --token-file " + wrong_file.string()), 1);
  EXPECT_EQ(run("status --url " + url + " --token " + kToken), 0);
  EXPECT_EQ(run("status --pid-file " + pid_file + " --token x --token-file " + token_file.string()), 2);
  EXPECT_EQ(run("status --pid-file " + pid_file + " --token-file " + (dir / "absent").string()), 1);

  NanoCtrlClient c(url, "", 10s, kToken);
  EXPECT_EQ(c.start_peer_agent({{"alias", "via-daemon"}})["name"], "via-daemon");
  EXPECT_THROW(NanoCtrlClient(url).query(), dlslime::AuthenticationError);

  std::ifstream pid_in(pid_file);
  long pid = 0;
  pid_in >> pid;
  ASSERT_GT(pid, 0);
  std::string cmdline = read_file("/proc/" + std::to_string(pid) + "/cmdline");
  EXPECT_NE(cmdline.find("server"), std::string::npos);
  EXPECT_EQ(cmdline.find(kToken), std::string::npos);
  std::string meta = read_file(pid_file + ".json");
  EXPECT_EQ(json::parse(meta)["config"]["token"], "set");
  EXPECT_EQ(meta.find(kToken), std::string::npos);

  EXPECT_EQ(run("stop --pid-file " + pid_file), 0);
  stop_daemon.done = true;
  std::string log = read_file(log_file);
  EXPECT_NE(log.find("bearer token required"), std::string::npos) << log;
  EXPECT_EQ(log.find(kToken), std::string::npos) << log;
  fs::remove_all(dir);
}
