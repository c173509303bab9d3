// The `nanoctrl` command line: server (foreground), start / stop / status (a daemon with a
// pid file). Shared by the installed binary (main.cpp) and `python -m dlslime.nanoctrl`.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "dlslime/errors.h"
#include "dlslime/logging.h"
#include "dlslime/nanoctrl.h"

extern char** environ;

namespace dlslime {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* kUsage = R"(usage: nanoctrl [server|start|stop|status] [options]

  server   run in the foreground until SIGINT/SIGTERM (the default command)
  start    run `nanoctrl server` as a daemon; returns once it answers /healthz
  stop     stop the daemon (SIGTERM; --force adds SIGKILL after --timeout)
  status   say whether the daemon runs and is healthy (exit 0), is unhealthy (1)
           or is not running (3)

server / start options:
  --host HOST              bind address (default 127.0.0.1)
  --port PORT              port, 0 = any free one (default 4479)
  --advertise-host HOST    with a wildcard --host, the address other hosts are told
                           (default: the default route's interface address)
  --advertise-interface IF with a wildcard --host, advertise IF's IPv4 address instead
  --redis-url URL          redis://[[user]:password@]host[:port][/db]; default
                           $NANOCTRL_REDIS_URL, else the in-memory store
  --key-prefix STR         prefix of every Redis key (default "nanoctrl:")
  --ttl SEC                agent/entity lifetime without heartbeats (default 60)
  --max-body BYTES         largest request body (default 1048576)
  --max-threads N          most HTTP worker threads (default 1024)
  --max-waiters N          most blocked mailbox receives (default max-threads/2)
  --max-wait SEC           longest mailbox receive wait (default 60)
  --mailbox-max N          most messages queued per mailbox (default 4096)
  --mailbox-ttl SEC        idle mailbox lifetime (default 600)
  --keep-alive SEC         idle HTTP connection timeout (default 5)
  --request-timeout SEC    a request's headers and body must arrive within SEC of its
                           first byte, else 408 (default 10)
  --redis-timeout SEC      Redis connect/command timeout (default 2)
  --log-level LEVEL        trace|debug|info|warn|error|off (default info)
  --token TOKEN            require `Authorization: Bearer TOKEN` on every route but
                           /healthz (default $NANOCTRL_TOKEN; none = no authentication).
                           Visible on the command line (ps): prefer --token-file or
                           the variable
  --token-file PATH        read the token from the first line of PATH (stripped)
  --pid-file PATH          pid file; its metadata goes to PATH.json (default
                           $NANOCTRL_RUNTIME_DIR, $XDG_RUNTIME_DIR/nanoctrl or
                           /tmp/nanoctrl-$UID, file nanoctrl.pid)
start options:
  --log-file PATH          daemon output (default: next to the pid file, nanoctrl.log)
  --wait SEC               how long to wait for /healthz (default 15)
                           (the daemon gets the token through its environment, never
                           on its command line)
stop options:
  --timeout SEC            how long to wait for the exit (default 8)
  --force                  SIGKILL if it has not exited by then
status options:
  --url URL                check this server's /healthz instead of the daemon's
  --token, --token-file    also check that the server accepts this token (default
                           $NANOCTRL_TOKEN); exit 1 if it refuses it
(stop accepts --token/--token-file too and ignores them: it only signals the process.)
)";

struct Args {
  std::string command = "server";
  std::map<std::string, std::string> opts;
  bool force = false;
};

const std::vector<std::string> kServerOptions = {
    "host",       "port",        "redis-url",   "key-prefix", "ttl",       "max-body",      "max-threads",
    "max-waiters", "max-wait",   "mailbox-max", "mailbox-ttl", "keep-alive", "request-timeout", "redis-timeout",
    "log-level",  "advertise-host", "advertise-interface"};

bool known_option(const std::string& cmd, const std::string& name) {
  auto in = [&](std::initializer_list<const char*> list) {
    for (const char* n : list) {
      if (name == n) return true;
    }
    return false;
  };
  bool server_opt = std::find(kServerOptions.begin(), kServerOptions.end(), name) != kServerOptions.end();
  if (name == "pid-file" || name == "token" || name == "token-file") return true;
  if (cmd == "server") return server_opt;
  if (cmd == "start") return server_opt || in({"log-file", "wait"});
  if (cmd == "stop") return in({"timeout"});
  if (cmd == "status") return in({"url"});
  return false;
}

Args parse_args(const std::vector<std::string>& argv) {
  Args a;
  std::size_t i = 0;
  if (!argv.empty() && !argv[0].empty() && argv[0][0] != '-') {
    a.command = argv[0];
    i = 1;
    if (a.command != "server" && a.command != "start" && a.command != "stop" && a.command != "status") {
      throw InvalidArgumentError("unknown command '" + a.command + "'");
    }
  }
  for (; i < argv.size(); ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      a.command = "help";
      return a;
    }
    if (arg.rfind("--", 0) != 0) throw InvalidArgumentError("unexpected argument '" + arg + "'");
    std::string name = arg.substr(2), value;
    if (name == "force" && a.command == "stop") {
      a.force = true;
      continue;
    }
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else {
      if (i + 1 >= argv.size()) throw InvalidArgumentError("option --" + name + " needs a value");
      value = argv[++i];
    }
    if (!known_option(a.command, name)) {
      throw InvalidArgumentError("unknown option --" + name + " for `nanoctrl " + a.command + "`");
    }
    a.opts[name] = value;
  }
  return a;
}

double to_seconds(const std::string& name, const std::string& v) {
  try {
    std::size_t pos = 0;
    double d = std::stod(v, &pos);
    if (pos != v.size() || !(d >= 0)) throw std::invalid_argument(v);
    return d;
  } catch (const std::exception&) {
    throw InvalidArgumentError("--" + name + " needs a non-negative number of seconds, got '" + v + "'");
  }
}

uint64_t to_uint(const std::string& name, const std::string& v, uint64_t max) {
  try {
    std::size_t pos = 0;
    unsigned long long n = std::stoull(v, &pos);
    if (pos != v.size() || n > max || v[0] == '-') throw std::invalid_argument(v);
    return n;
  } catch (const std::exception&) {
    throw InvalidArgumentError("--" + name + " needs an integer from 0 to " + std::to_string(max) + ", got '" + v +
                               "'");
  }
}

// The token from --token, --token-file (first line, whitespace stripped) or $NANOCTRL_TOKEN,
// in that order; "" = none. Errors never contain the token.
std::string token_from(const Args& a) {
  auto tok = a.opts.find("token");
  auto file = a.opts.find("token-file");
  if (tok != a.opts.end() && file != a.opts.end()) {
    throw InvalidArgumentError("give either --token or --token-file, not both");
  }
  if (tok != a.opts.end()) {
    if (tok->second.empty()) throw InvalidArgumentError("--token must not be empty");
    return tok->second;
  }
  if (file != a.opts.end()) {
    std::ifstream in(file->second);
    if (!in) {
      throw Error(StatusCode::kFailed,
                  "cannot read --token-file " + file->second + ": " + std::strerror(errno));
    }
    std::string line;
    std::getline(in, line);
    const char* ws = " \t\r\n\v\f";
    auto first = line.find_first_not_of(ws);
    if (first == std::string::npos) {
      throw Error(StatusCode::kFailed, "--token-file " + file->second + ": the first line is empty");
    }
    line = line.substr(first, line.find_last_not_of(ws) - first + 1);
    return line;
  }
  if (const char* env = std::getenv("NANOCTRL_TOKEN"); env && *env) return env;
  return "";
}

std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

NanoCtrlConfig config_from(const Args& a) {
  NanoCtrlConfig c;
  auto get = [&](const char* n) -> std::optional<std::string> {
    auto it = a.opts.find(n);
    if (it == a.opts.end()) return std::nullopt;
    return it->second;
  };
  if (auto v = get("host")) c.host = *v;
  if (auto v = get("advertise-host")) c.advertise_host = *v;
  if (auto v = get("advertise-interface")) c.advertise_interface = *v;
  if (auto v = get("port")) c.port = static_cast<uint16_t>(to_uint("port", *v, 65535));
  if (auto v = get("redis-url")) {
    c.redis_url = *v;
  } else if (const char* env = std::getenv("NANOCTRL_REDIS_URL"); env && *env) {
    c.redis_url = env;
  }
  if (auto v = get("key-prefix")) c.key_prefix = *v;
  if (auto v = get("ttl")) c.ttl = ms(to_seconds("ttl", *v));
  if (auto v = get("max-body")) c.max_body_bytes = to_uint("max-body", *v, 1ull << 32);
  if (auto v = get("max-threads")) c.max_threads = static_cast<uint32_t>(to_uint("max-threads", *v, 100000));
  if (auto v = get("max-waiters")) c.max_waiters = static_cast<uint32_t>(to_uint("max-waiters", *v, 100000));
  if (auto v = get("max-wait")) c.max_wait = ms(to_seconds("max-wait", *v));
  if (auto v = get("mailbox-max")) c.mailbox_max_messages = static_cast<uint32_t>(to_uint("mailbox-max", *v, 1u << 30));
  if (auto v = get("mailbox-ttl")) c.mailbox_ttl = ms(to_seconds("mailbox-ttl", *v));
  if (auto v = get("keep-alive")) c.keep_alive_timeout = ms(to_seconds("keep-alive", *v));
  if (auto v = get("request-timeout")) c.request_read_timeout = ms(to_seconds("request-timeout", *v));
  if (auto v = get("redis-timeout")) c.redis_timeout = ms(to_seconds("redis-timeout", *v));
  c.token = token_from(a);
  c.validate();
  return c;
}

fs::path default_pid_file() {
  fs::path dir;
  if (const char* d = std::getenv("NANOCTRL_RUNTIME_DIR"); d && *d) {
    dir = d;
  } else if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x) {
    dir = fs::path(x) / "nanoctrl";
  } else {
    dir = fs::path("/tmp") / ("nanoctrl-" + std::to_string(::getuid()));
  }
  return dir / "nanoctrl.pid";
}

fs::path pid_file_of(const Args& a) {
  auto it = a.opts.find("pid-file");
  return it != a.opts.end() ? fs::path(it->second) : default_pid_file();
}

fs::path meta_file_of(const fs::path& pid_file) { return fs::path(pid_file.string() + ".json"); }

void write_atomically(const fs::path& path, const std::string& content) {
  fs::path tmp = path.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << content;
    if (!out) throw Error(StatusCode::kFailed, "cannot write " + tmp.string());
  }
  fs::rename(tmp, path);
}

std::optional<pid_t> read_pid(const fs::path& pid_file) {
  std::ifstream in(pid_file);
  long pid = 0;
  if (!(in >> pid) || pid <= 0) return std::nullopt;
  return static_cast<pid_t>(pid);
}

json read_meta(const fs::path& pid_file) {
  std::ifstream in(meta_file_of(pid_file));
  if (!in) return json::object();
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  return j.is_object() ? j : json::object();
}

// Alive and not a zombie.
bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (std::getline(stat, line)) {
    auto close = line.rfind(')');
    if (close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z') return false;
  }
  return true;
}

// Guards against a recycled pid: the process must be a nanoctrl.
bool is_nanoctrl(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return cmd.find("nanoctrl") != std::string::npos;
}

void remove_files_of(const fs::path& pid_file, pid_t pid) {
  std::error_code ec;
  if (read_pid(pid_file) == pid) fs::remove(pid_file, ec);
  if (read_meta(pid_file).value("pid", 0L) == pid) fs::remove(meta_file_of(pid_file), ec);
}

// GET url/healthz: the body on 200, nullopt otherwise (message in *why).
std::optional<json> health(const std::string& url, std::string* why) {
  httplib::Client c(url);
  c.set_connection_timeout(1, 0);
  c.set_read_timeout(3, 0);
  auto res = c.Get("/healthz");
  if (!res) {
    if (why) *why = "no answer: " + httplib::to_string(res.error());
    return std::nullopt;
  }
  json body = json::parse(res->body, nullptr, false);
  if (res->status != 200) {
    if (why) {
      *why = "HTTP " + std::to_string(res->status) +
             (body.is_object() && body.contains("message") ? ": " + body["message"].get<std::string>() : "");
    }
    return std::nullopt;
  }
  return body.is_object() ? body : json::object();
}

// Whether the server at `url` accepts `token` (GET /metrics, which needs it when the server
// has one). Empty optional: accepted; otherwise why not.
std::optional<std::string> token_refused(const std::string& url, const std::string& token) {
  httplib::Client c(url);
  c.set_connection_timeout(1, 0);
  c.set_read_timeout(3, 0);
  c.set_bearer_token_auth(token);
  auto res = c.Get("/metrics");
  if (!res) return "no answer: " + httplib::to_string(res.error());
  if (res->status == 200) return std::nullopt;
  json body = json::parse(res->body, nullptr, false);
  std::string msg = body.is_object() && body.contains("message") && body["message"].is_string()
                        ? body["message"].get<std::string>()
                        : res->body.substr(0, 200);
  return "HTTP " + std::to_string(res->status) + ": " + msg;
}

std::string tail(const fs::path& file, std::size_t max_bytes = 2000) {
  std::ifstream in(file, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s.size() > max_bytes ? s.substr(s.size() - max_bytes) : s;
}

int run_server(const Args& a) {
  NanoCtrlConfig config = config_from(a);
  set_log_level(a.opts.count("log-level") ? a.opts.at("log-level") : "info");

  // SIGINT/SIGTERM are taken by sigwait below: block them before the server's threads
  // start, so that they inherit the mask and the signal reaches this thread.
  sigset_t sigs, old;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &sigs, &old);
  struct Restore {
    sigset_t* mask;
    ~Restore() { pthread_sigmask(SIG_SETMASK, mask, nullptr); }
  } restore{&old};

  NanoCtrlServer server(config);
  server.start();
  std::optional<fs::path> pid_file;
  if (a.opts.count("pid-file")) {
    pid_file = fs::path(a.opts.at("pid-file"));
    json meta = {{"pid", ::getpid()},
                 {"url", server.url()},
                 {"advertised_url", server.advertised_url()},
                 {"port", server.port()},
                 {"config", config.to_json()},
                 {"started_at", std::chrono::duration_cast<std::chrono::seconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count()}};
    write_atomically(meta_file_of(*pid_file), meta.dump(2) + "\n");
    write_atomically(*pid_file, std::to_string(::getpid()) + "\n");
  }
  std::cout << "nanoctrl serving " << server.url();
  if (server.advertised_url() != server.url()) std::cout << ", other hosts: " << server.advertised_url();
  std::cout << " (store: "
            << config.to_json().value("store", std::string("memory"))
            << (config.token.empty() ? "" : ", bearer token required") << ")" << std::endl;

  int sig = 0;
  sigwait(&sigs, &sig);
  std::cout << "nanoctrl: signal " << sig << ", stopping" << std::endl;
  server.stop();
  if (pid_file) remove_files_of(*pid_file, ::getpid());
  return 0;
}

int run_start(const Args& a, const std::vector<std::string>& self_command) {
  const NanoCtrlConfig config = config_from(a);  // validate (and read the token file) before spawning
  fs::path pid_file = pid_file_of(a);
  fs::path dir = pid_file.parent_path().empty() ? fs::path(".") : pid_file.parent_path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(StatusCode::kFailed, "cannot create " + dir.string() + ": " + ec.message());
  if (auto pid = read_pid(pid_file); pid && process_alive(*pid) && is_nanoctrl(*pid)) {
    std::cerr << "nanoctrl is already running (pid " << *pid << ", " << read_meta(pid_file).value("url", "?")
              << "); stop it first (nanoctrl stop --pid-file " << pid_file.string() << ")" << std::endl;
    return 1;
  }
  fs::remove(pid_file, ec);
  fs::remove(meta_file_of(pid_file), ec);
  fs::path log_file = a.opts.count("log-file") ? fs::path(a.opts.at("log-file")) : dir / "nanoctrl.log";
  double wait_s = a.opts.count("wait") ? to_seconds("wait", a.opts.at("wait")) : 15.0;

  std::vector<std::string> argv = self_command;
  argv.push_back("server");
  for (const auto& [k, v] : a.opts) {
    // The token goes through the environment below: a command line is readable by anyone (ps).
    if (k == "log-file" || k == "wait" || k == "pid-file" || k == "token" || k == "token-file") continue;
    argv.push_back("--" + k);
    argv.push_back(v);
  }
  argv.push_back("--pid-file");
  argv.push_back(fs::absolute(pid_file).string());
  std::vector<char*> cargv;
  for (auto& s : argv) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  // The daemon's environment: ours, with NANOCTRL_TOKEN set to the resolved token (or
  // removed when there is none, which is then also what ours held).
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "NANOCTRL_TOKEN=", 15) != 0) env_strings.emplace_back(*e);
  }
  if (!config.token.empty()) env_strings.push_back("NANOCTRL_TOKEN=" + config.token);
  std::vector<char*> cenv;
  for (auto& s : env_strings) cenv.push_back(s.data());
  cenv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own session: the daemon outlives this terminal and its signals.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  pid_t child = 0;
  int rc = posix_spawn(&child, cargv[0], &actions, &attr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    std::cerr << "nanoctrl start: cannot run " << argv[0] << ": " << std::strerror(rc) << std::endl;
    return 1;
  }

  auto deadline = std::chrono::steady_clock::now() + ms(wait_s);
  std::string why = "it did not write " + meta_file_of(pid_file).string();
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(child, &status, WNOHANG) == child) {
      std::cerr << "nanoctrl start: the server exited ("
                << (WIFEXITED(status) ? "status " + std::to_string(WEXITSTATUS(status))
                                      : "signal " + std::to_string(WTERMSIG(status)))
                << "). Log " << log_file.string() << ":\n"
                << tail(log_file) << std::endl;
      return 1;
    }
    json meta = read_meta(pid_file);
    if (meta.value("pid", 0L) == child && meta.contains("url")) {
      std::string url = meta["url"].get<std::string>();
      if (health(url, &why)) {
        const std::string other = meta.value("advertised_url", url);
        std::cout << "nanoctrl started (pid " << child << ") at " << url
                  << (other != url ? ", other hosts: " + other : std::string()) << "; pid file "
                  << pid_file.string() << ", log " << log_file.string() << std::endl;
        return 0;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(child, SIGTERM);
  std::cerr << "nanoctrl start: not healthy after " << wait_s << " s (" << why << "); stopped it. Log "
            << log_file.string() << ":\n"
            << tail(log_file) << std::endl;
  return 1;
}

int run_stop(const Args& a) {
  fs::path pid_file = pid_file_of(a);
  double timeout_s = a.opts.count("timeout") ? to_seconds("timeout", a.opts.at("timeout")) : 8.0;
  auto pid = read_pid(pid_file);
  if (!pid || !process_alive(*pid) || !is_nanoctrl(*pid)) {
    std::error_code ec;
    fs::remove(pid_file, ec);
    fs::remove(meta_file_of(pid_file), ec);
    std::cout << "nanoctrl is not running (" << pid_file.string() << ")" << std::endl;
    return 0;
  }
  ::kill(*pid, SIGTERM);
  auto wait_exit = [&](double seconds) {
    auto deadline = std::chrono::steady_clock::now() + ms(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      if (!process_alive(*pid)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return !process_alive(*pid);
  };
  if (!wait_exit(timeout_s)) {
    if (!a.force) {
      std::cerr << "nanoctrl (pid " << *pid << ") did not exit within " << timeout_s
                << " s; use --force to kill it" << std::endl;
      return 1;
    }
    ::kill(*pid, SIGKILL);
    if (!wait_exit(5.0)) {
      std::cerr << "nanoctrl (pid " << *pid << ") survived SIGKILL" << std::endl;
      return 1;
    }
  }
  remove_files_of(pid_file, *pid);
  std::cout << "nanoctrl stopped (pid " << *pid << ")" << std::endl;
  return 0;
}

int run_status(const Args& a) {
  std::string url;
  std::optional<pid_t> pid;
  if (a.opts.count("url")) {
    url = a.opts.at("url");
    if (url.find("://") == std::string::npos) url = "http://" + url;
  } else {
    fs::path pid_file = pid_file_of(a);
    pid = read_pid(pid_file);
    if (!pid || !process_alive(*pid) || !is_nanoctrl(*pid)) {
      std::cout << "nanoctrl is not running (" << pid_file.string() << ")" << std::endl;
      return 3;
    }
    url = read_meta(pid_file).value("url", "");
    if (url.empty()) {
      std::cout << "nanoctrl (pid " << *pid << ") is starting" << std::endl;
      return 1;
    }
  }
  std::string why;
  auto body = health(url, &why);
  std::string who = pid ? "nanoctrl (pid " + std::to_string(*pid) + ") at " + url : "nanoctrl at " + url;
  if (!body) {
    std::cout << who << " is unhealthy: " << why << std::endl;
    return pid ? 1 : 3;
  }
  if (std::string token = token_from(a); !token.empty()) {
    if (auto refused = token_refused(url, token)) {
      std::cout << who << " is running but refuses the token: " << *refused << std::endl;
      return 1;
    }
  }
  std::cout << who << " is healthy (store " << body->value("store_url", "?") << ", up "
            << static_cast<int64_t>(body->value("uptime_s", 0.0)) << " s"
            << (body->value("auth", "") == "bearer" ? ", bearer token required" : "") << ")" << std::endl;
  return 0;
}

}  // namespace

int nanoctrl_main(const std::vector<std::string>& args, const std::vector<std::string>& self_command) {
  try {
    Args a = parse_args(args);
    if (a.command == "help") {
      std::cout << kUsage;
      return 0;
    }
    if (a.command == "server") return run_server(a);
    if (a.command == "start") return run_start(a, self_command);
    if (a.command == "stop") return run_stop(a);
    return run_status(a);
  } catch (const InvalidArgumentError& e) {
    // The reason last: `nanoctrl start` shows the tail of a daemon's output.
    std::cerr << kUsage << "\nnanoctrl: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "nanoctrl: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace dlslime
