#include "nanoctrl/redis_store.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <set>
#include <stdexcept>

#include <hiredis/hiredis.h>

#include "core/log.h"
#include "dlslime/errors.h"

namespace dlslime::nanoctrl {

namespace {

// Idle connections kept for reuse; more are closed when returned.
constexpr std::size_t kMaxIdle = 64;

timeval to_timeval(Millis ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

int parse_int(const std::string& s, int lo, int hi, const char* what, const std::string& url) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi) {
    throw InvalidArgumentError("invalid " + std::string(what) + " '" + s + "' in Redis URL '" + url +
                               "' (expected redis://[[user]:password@]host[:port][/db])");
  }
  return v;
}

std::string ms_str(Millis ms) { return std::to_string(ms.count()); }

const char* kPushScript =
    "if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[2]) then return -1 end\n"
    "local n = redis.call('RPUSH', KEYS[1], ARGV[1])\n"
    "if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end\n"
    "return n\n";

const char* kPopScript =
    "local items = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)\n"
    "if #items > 0 then redis.call('LTRIM', KEYS[1], #items, -1) end\n"
    "return items\n";

// Compare-and-delete in one step, so a delete never removes a value written after the check.
const char* kDelIfEqualScript =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end\n"
    "return 0\n";

std::string reply_string(const redisReply* r) { return std::string(r->str, r->len); }

}  // namespace

RedisUrl RedisUrl::parse(const std::string& url) {
  const std::string scheme = "redis://";
  if (url.rfind(scheme, 0) != 0) {
    throw InvalidArgumentError("Redis URL '" + url +
                               "' must start with redis:// (redis://[[user]:password@]host[:port][/db]; "
                               "TLS and unix sockets are not supported)");
  }
  RedisUrl out;
  std::string rest = url.substr(scheme.size());
  if (auto slash = rest.find('/'); slash != std::string::npos) {
    std::string db = rest.substr(slash + 1);
    rest.resize(slash);
    if (!db.empty()) out.db = parse_int(db, 0, 1 << 20, "database number", url);
  }
  if (auto at = rest.rfind('@'); at != std::string::npos) {
    std::string auth = rest.substr(0, at);
    rest = rest.substr(at + 1);
    if (auto colon = auth.find(':'); colon != std::string::npos) {
      out.user = auth.substr(0, colon);
      out.password = auth.substr(colon + 1);
    } else {
      out.password = auth;  // redis://password@host, as redis-py accepts
    }
  }
  std::string host = rest;
  std::string port;
  if (!rest.empty() && rest.front() == '[') {  // [v6 address]:port
    auto close = rest.find(']');
    if (close == std::string::npos) throw InvalidArgumentError("unterminated '[' in Redis URL '" + url + "'");
    host = rest.substr(1, close - 1);
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':') throw InvalidArgumentError("bad host in Redis URL '" + url + "'");
      port = rest.substr(close + 2);
    }
  } else if (auto colon = rest.rfind(':'); colon != std::string::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (!host.empty()) out.host = host;
  if (!port.empty()) out.port = parse_int(port, 1, 65535, "port", url);
  return out;
}

std::string RedisUrl::to_string() const {
  std::string auth;
  if (!password.empty()) auth = user + ":***@";
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return "redis://" + auth + h + ":" + std::to_string(port) + "/" + std::to_string(db);
}

void RedisStore::ContextDeleter::operator()(redisContext* c) const { redisFree(c); }
void RedisStore::ReplyDeleter::operator()(redisReply* r) const { freeReplyObject(r); }

RedisStore::RedisStore(const RedisUrl& url, Millis timeout) : url_(url), timeout_(timeout) {}

RedisStore::~RedisStore() = default;

void RedisStore::unavailable(const std::string& what, const redisContext* conn) const {
  std::string detail = conn && conn->err ? std::string(": ") + conn->errstr : std::string();
  throw StoreUnavailable("Redis at " + url_.to_string() + " is unavailable (" + what + detail +
                         "); NanoCtrl retries on the next request");
}

RedisStore::Conn RedisStore::connect() {
  timeval tv = to_timeval(timeout_);
  Conn conn(redisConnectWithTimeout(url_.host.c_str(), url_.port, tv));
  if (!conn) unavailable("cannot allocate a connection", nullptr);
  if (conn->err) unavailable("connect failed", conn.get());
  redisSetTimeout(conn.get(), tv);
  auto check = [&](const std::vector<std::string>& args, const char* what) {
    Reply r = run(conn.get(), args);
    if (!r) unavailable(what, conn.get());
    if (r->type == REDIS_REPLY_ERROR) unavailable(std::string(what) + " refused: " + reply_string(r.get()), nullptr);
  };
  if (!url_.password.empty()) {
    if (url_.user.empty()) {
      check({"AUTH", url_.password}, "AUTH");
    } else {
      check({"AUTH", url_.user, url_.password}, "AUTH");
    }
  }
  if (url_.db != 0) check({"SELECT", std::to_string(url_.db)}, "SELECT");
  return conn;
}

RedisStore::Conn RedisStore::acquire(bool* reused) {
  {
    std::lock_guard lock(mu_);
    if (!idle_.empty()) {
      Conn c = std::move(idle_.back());
      idle_.pop_back();
      *reused = true;
      return c;
    }
  }
  *reused = false;
  return connect();
}

void RedisStore::release(Conn conn) {
  std::lock_guard lock(mu_);
  if (idle_.size() < kMaxIdle && !interrupted_) idle_.push_back(std::move(conn));
}

void RedisStore::drop_idle() {
  std::vector<Conn> dead;
  std::lock_guard lock(mu_);
  dead.swap(idle_);
}

RedisStore::Reply RedisStore::run(redisContext* conn, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> argvlen;
  argv.reserve(args.size());
  argvlen.reserve(args.size());
  for (const auto& a : args) {
    argv.push_back(a.data());
    argvlen.push_back(a.size());
  }
  void* r = redisCommandArgv(conn, static_cast<int>(args.size()), argv.data(), argvlen.data());
  return Reply(static_cast<redisReply*>(r));
}

RedisStore::Reply RedisStore::command(const std::vector<std::string>& args) {
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    Conn conn = acquire(&reused);
    Reply r = run(conn.get(), args);
    if (!r) {
      // A connection from the pool may have died with the previous Redis process: drop all
      // idle ones (they share its fate) and try once more on a fresh connection.
      if (reused && attempt == 0) {
        drop_idle();
        continue;
      }
      unavailable(args.front() + " failed", conn.get());
    }
    if (r->type == REDIS_REPLY_ERROR) {
      std::string msg = reply_string(r.get());
      release(std::move(conn));
      // LOADING, MASTERDOWN, NOAUTH, ...: the server is there but cannot serve yet.
      if (msg.rfind("LOADING", 0) == 0 || msg.rfind("MASTERDOWN", 0) == 0 || msg.rfind("NOAUTH", 0) == 0 ||
          msg.rfind("BUSY", 0) == 0 || msg.rfind("TRYAGAIN", 0) == 0 || msg.rfind("READONLY", 0) == 0) {
        unavailable(args.front() + " refused: " + msg, nullptr);
      }
      throw std::runtime_error("Redis " + args.front() + " failed: " + msg);
    }
    release(std::move(conn));
    return r;
  }
}

void RedisStore::ping() { command({"PING"}); }

std::optional<std::string> RedisStore::get(const std::string& key) {
  Reply r = command({"GET", key});
  if (r->type == REDIS_REPLY_STRING) return reply_string(r.get());
  return std::nullopt;
}

std::vector<std::optional<std::string>> RedisStore::mget(const std::vector<std::string>& keys) {
  std::vector<std::optional<std::string>> out;
  if (keys.empty()) return out;
  std::vector<std::string> args{"MGET"};
  args.insert(args.end(), keys.begin(), keys.end());
  Reply r = command(args);
  out.resize(keys.size());
  if (r->type == REDIS_REPLY_ARRAY) {
    for (size_t i = 0; i < r->elements && i < keys.size(); ++i) {
      if (r->element[i]->type == REDIS_REPLY_STRING) out[i] = reply_string(r->element[i]);
    }
  }
  return out;
}

void RedisStore::set(const std::string& key, const std::string& value, Millis ttl) {
  if (ttl.count() > 0) {
    command({"SET", key, value, "PX", ms_str(ttl)});
  } else {
    command({"SET", key, value});
  }
}

bool RedisStore::set_if_absent(const std::string& key, const std::string& value, Millis ttl) {
  Reply r = ttl.count() > 0 ? command({"SET", key, value, "PX", ms_str(ttl), "NX"})
                            : command({"SET", key, value, "NX"});
  return r->type == REDIS_REPLY_STATUS;  // "OK"; nil when the key existed
}

bool RedisStore::del_if_equal(const std::string& key, const std::string& value) {
  Reply r = command({"EVAL", kDelIfEqualScript, "1", key, value});
  return r->type == REDIS_REPLY_INTEGER && r->integer == 1;
}

bool RedisStore::expire(const std::string& key, Millis ttl) {
  Reply r = ttl.count() > 0 ? command({"PEXPIRE", key, ms_str(ttl)}) : command({"PERSIST", key});
  if (ttl.count() <= 0) return get(key).has_value();
  return r->type == REDIS_REPLY_INTEGER && r->integer == 1;
}

std::size_t RedisStore::del(const std::vector<std::string>& keys) {
  if (keys.empty()) return 0;
  std::vector<std::string> args{"DEL"};
  args.insert(args.end(), keys.begin(), keys.end());
  Reply r = command(args);
  return r->type == REDIS_REPLY_INTEGER ? static_cast<std::size_t>(r->integer) : 0;
}

int64_t RedisStore::incr(const std::string& key) {
  Reply r = command({"INCR", key});
  return r->integer;
}

std::vector<std::string> RedisStore::keys(const std::string& pattern) {
  std::set<std::string> found;  // SCAN may return a key more than once
  std::string cursor = "0";
  do {
    Reply r = command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) throw std::runtime_error("unexpected SCAN reply");
    cursor = reply_string(r->element[0]);
    const redisReply* batch = r->element[1];
    for (size_t i = 0; i < batch->elements; ++i) found.insert(reply_string(batch->element[i]));
  } while (cursor != "0");
  return {found.begin(), found.end()};
}

std::optional<std::size_t> RedisStore::list_push(const std::string& key, const std::string& value,
                                                 std::size_t max_len, Millis ttl) {
  Reply r = command({"EVAL", kPushScript, "1", key, value, std::to_string(max_len), ms_str(ttl)});
  if (r->type != REDIS_REPLY_INTEGER || r->integer < 0) return std::nullopt;
  return static_cast<std::size_t>(r->integer);
}

std::size_t RedisStore::list_len(const std::string& key) {
  Reply r = command({"LLEN", key});
  return r->type == REDIS_REPLY_INTEGER ? static_cast<std::size_t>(r->integer) : 0;
}

std::vector<std::string> RedisStore::list_pop(const std::string& key, std::size_t max, Millis wait) {
  std::vector<std::string> out;
  auto pop_now = [&](std::size_t n) {
    Reply r = command({"EVAL", kPopScript, "1", key, std::to_string(n)});
    if (r->type == REDIS_REPLY_ARRAY) {
      for (size_t i = 0; i < r->elements; ++i) out.push_back(reply_string(r->element[i]));
    }
  };
  pop_now(max);
  if (!out.empty() || wait.count() <= 0 || interrupted_) return out;

  // BLPOP on a connection of its own, with a socket timeout that covers the wait.
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.3f", std::max<double>(static_cast<double>(wait.count()), 1.0) / 1000.0);
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    Conn conn = acquire(&reused);
    redisSetTimeout(conn.get(), to_timeval(wait + timeout_));
    {
      std::lock_guard lock(mu_);
      if (interrupted_) return out;
      blocked_fds_.insert(conn->fd);
    }
    const auto started = std::chrono::steady_clock::now();
    Reply r = run(conn.get(), {"BLPOP", key, secs});
    {
      std::lock_guard lock(mu_);
      blocked_fds_.erase(conn->fd);
    }
    if (!r) {
      if (interrupted_) return out;
      // A stale pooled connection (Redis restarted) fails at once; one that waited out the
      // socket timeout found Redis unresponsive (stopped, overloaded), and waiting again
      // would double the caller's wait (hostile review 16k: 65 s for a 30 s poll).
      const bool failed_at_once = std::chrono::steady_clock::now() - started < wait;
      if (reused && attempt == 0 && failed_at_once) {
        drop_idle();
        continue;
      }
      unavailable("BLPOP failed", conn.get());
    }
    if (r->type == REDIS_REPLY_ERROR) unavailable("BLPOP refused: " + reply_string(r.get()), nullptr);
    redisSetTimeout(conn.get(), to_timeval(timeout_));
    bool got = r->type == REDIS_REPLY_ARRAY && r->elements == 2;
    if (got) out.push_back(reply_string(r->element[1]));
    release(std::move(conn));
    if (got && max > 1) pop_now(max - 1);
    return out;
  }
}

void RedisStore::set_add(const std::string& key, const std::string& member) { command({"SADD", key, member}); }

std::vector<std::string> RedisStore::set_members(const std::string& key) {
  Reply r = command({"SMEMBERS", key});
  std::vector<std::string> out;
  if (r->type == REDIS_REPLY_ARRAY) {
    for (size_t i = 0; i < r->elements; ++i) out.push_back(reply_string(r->element[i]));
  }
  return out;
}

void RedisStore::interrupt() {
  std::lock_guard lock(mu_);
  interrupted_ = true;
  for (int fd : blocked_fds_) ::shutdown(fd, SHUT_RDWR);
  idle_.clear();
}

}  // namespace dlslime::nanoctrl
