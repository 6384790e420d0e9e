// The Redis kernel store (src/store_redis/, FLASHATTN_KERNEL_STORE) against
// a real redis-server this test starts on loopback (a free port and a unix
// socket in a scratch directory, a password, no persistence), with emulator
// runtimes in forked processes:
//  - process A with an empty local cache fills Redis; process B with another
//    empty local cache builds nothing (0 compiles, 0 misses);
//  - a stored value with a flipped blob byte (wrong hash) and one that is not
//    a row at all are discarded, rebuilt and written back intact;
//  - a server that stops answering (SIGSTOP), then dies (SIGKILL), between
//    launches never fails or hangs a launch: the errors are counted.
// Exit 77 (ctest SKIP) only when redis-server is not installed.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "flashattn.h"
#include "support/cache_fixture.h"
#include "support/cmocka.hh"

using fa::test::fork_child;
using fa::test::seconds_since;
using fa::test::wait_exit;

namespace {

constexpr const char *kPassword = "fa-test-secret";
constexpr int kDb = 3;  // not 0: the URL's database is selected

struct Server {
  std::string dir, sock, redis_server;
  int port = 0;
  pid_t pid = -1;
};
Server g_server;

// The first executable `name` on PATH, then in /usr/sbin and /usr/bin.
std::string find_program(const char *name) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/sbin:/usr/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    const std::string cand = path.substr(start, end - start) + "/" + name;
    if (end > start && access(cand.c_str(), X_OK) == 0) return cand;
    start = end + 1;
  }
  return "";
}

// A loopback TCP port nobody listens on now.
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a;
  std::memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr *>(&a), &n) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// ---- a minimal RESP client over the unix socket (to inspect and damage values) ----

struct Reply {
  char type = 0;  // '+', '-', ':', '$', '*'; 0 on a connection error
  bool nil = false;
  std::string str;                 // status, error, integer text or bulk string
  std::vector<std::string> items;  // an array of bulk strings
};

class Resp {
 public:
  explicit Resp(const std::string &sock) {
    fd_ = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a;
    std::memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", sock.c_str());
    timeval tv{2, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd_, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~Resp() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  Reply cmd(const std::vector<std::string> &argv) {
    std::string out = "*" + std::to_string(argv.size()) + "\r\n";
    for (const std::string &a : argv) out += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
    if (fd_ < 0 || send(fd_, out.data(), out.size(), MSG_NOSIGNAL) != ssize_t(out.size()))
      return Reply();
    return read_reply();
  }

 private:
  bool fill() {
    char buf[65536];
    const ssize_t n = recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return false;
    in_.append(buf, size_t(n));
    return true;
  }
  bool line(std::string *out) {
    size_t at;
    while ((at = in_.find("\r\n")) == std::string::npos)
      if (!fill()) return false;
    *out = in_.substr(0, at);
    in_.erase(0, at + 2);
    return true;
  }
  bool bulk(long n, std::string *out) {
    while (in_.size() < size_t(n) + 2)
      if (!fill()) return false;
    *out = in_.substr(0, size_t(n));
    in_.erase(0, size_t(n) + 2);
    return true;
  }
  Reply read_reply() {
    Reply r;
    std::string head;
    if (!line(&head) || head.empty()) return r;
    r.type = head[0];
    r.str = head.substr(1);
    if (r.type == '$') {
      const long n = std::atol(r.str.c_str());
      r.nil = n < 0;
      if (n >= 0 && !bulk(n, &r.str)) r.type = 0;
    } else if (r.type == '*') {
      const long count = std::atol(r.str.c_str());
      for (long i = 0; i < count; ++i) {
        std::string h, item;
        if (!line(&h) || h.empty() || h[0] != '$' || !bulk(std::atol(h.c_str() + 1), &item)) {
          r.type = 0;
          break;
        }
        r.items.push_back(item);
      }
    }
    return r;
  }
  int fd_ = -1;
  std::string in_;
};

// A connection to the test server, authenticated, on database kDb.
struct Admin {
  Resp r{g_server.sock};
  Admin() {
    r.cmd({"AUTH", kPassword});
    r.cmd({"SELECT", std::to_string(kDb)});
  }
  std::vector<std::string> keys() { return r.cmd({"KEYS", "flashattn:*"}).items; }
  std::string get(const std::string &k) { return r.cmd({"GET", k}).str; }
  bool set(const std::string &k, const std::string &v) { return r.cmd({"SET", k, v}).str == "OK"; }
};

bool start_server() {
  Server &s = g_server;
  for (int attempt = 0; attempt < 5; ++attempt) {
    s.port = free_port();
    const std::string port = std::to_string(s.port);
    const std::string log = s.dir + "/redis.log";
    std::fflush(nullptr);
    s.pid = fork();
    if (s.pid == 0) {
      execl(s.redis_server.c_str(), s.redis_server.c_str(), "--port", port.c_str(), "--bind",
            "127.0.0.1", "--unixsocket", s.sock.c_str(), "--unixsocketperm", "700", "--save", "",
            "--appendonly", "no", "--dir", s.dir.c_str(), "--logfile", log.c_str(), "--requirepass",
            kPassword, "--daemonize", "no", static_cast<char *>(nullptr));
      _exit(127);
    }
    const auto t0 = std::chrono::steady_clock::now();
    while (seconds_since(t0) < 10) {
      int status = 0;
      if (waitpid(s.pid, &status, WNOHANG) == s.pid) break;  // exited: port taken?
      Resp r(s.sock);
      if (r.ok() && r.cmd({"AUTH", kPassword}).str == "OK") return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(s.pid, SIGKILL);
    waitpid(s.pid, nullptr, 0);
    s.pid = -1;
  }
  return false;
}

int setup(void **) {
  g_server.dir = fa::test::temp_dir("store_redis", "server");
  g_server.sock = g_server.dir + "/redis.sock";
  if (!start_server()) {
    std::printf("cannot start %s (see %s/redis.log)\n", g_server.redis_server.c_str(),
                g_server.dir.c_str());
    return -1;
  }
  return 0;
}

int teardown(void **) {
  if (g_server.pid > 0) {
    kill(g_server.pid, SIGKILL);
    waitpid(g_server.pid, nullptr, 0);
  }
  fa::test::rm_rf(g_server.dir);
  return 0;
}

std::string tcp_url() {
  return std::string("redis://:") + kPassword + "@127.0.0.1:" + std::to_string(g_server.port) +
         "/" + std::to_string(kDb);
}
std::string unix_url() {
  return std::string("unix://:") + kPassword + "@" + g_server.sock + "?db=" + std::to_string(kDb);
}

// ---- the processes -----------------------------------------------------------

constexpr int kDims[] = {32, 64};
constexpr int kKernels = 2;  // one forward kernel per head dim

// What a process saw.
struct Run {
  fa_cache_stats s = FA_CACHE_STATS_INIT;
  bool launched = true;
};

// In a child: a runtime with an empty local cache on `url`, the forward
// kernels of kDims launched and checked, and check(stats) ("" = as
// expected, else why not, printed) deciding the exit status.
template <typename F>
int cold_process(const std::string &url, F check) {
  setenv("FLASHATTN_KERNEL_STORE", url.c_str(), 1);
  const std::string dir = fa::test::temp_dir("store_redis", "local");
  fa_runtime *rt = fa::test::open_emulator_runtime(dir);
  if (rt == nullptr) return 1;
  Run run;
  uint32_t seed = 1;
  for (int d : kDims) run.launched = fa::test::launch_small_forward(rt, d, seed++) && run.launched;
  run.s = fa::test::cache_stats_of(rt);
  fa_runtime_destroy(rt);
  fa::test::rm_rf(dir);
  const std::string why = run.launched ? check(run.s) : "a launch failed";
  if (why.empty()) return 0;
  std::fprintf(
      stderr,
      "%s: compiles %llu misses %llu disk_hits %llu remote hits %llu misses %llu puts %llu "
      "errors %llu discarded %llu; kernel_store \"%s\" note \"%s\": %s\n",
      url.c_str(), (unsigned long long)run.s.compiles, (unsigned long long)run.s.misses,
      (unsigned long long)run.s.disk_hits, (unsigned long long)run.s.remote_hits,
      (unsigned long long)run.s.remote_misses, (unsigned long long)run.s.remote_puts,
      (unsigned long long)run.s.remote_errors, (unsigned long long)run.s.remote_discarded,
      run.s.kernel_store, run.s.kernel_store_note, why.c_str());
  return 1;
}

template <typename F>
int in_child(F fn) {
  return wait_exit(fork_child(fn, /*quiet=*/true, /*alarm_s=*/60));
}

std::string expect_cold_from_redis(const fa_cache_stats &s) {
  if (s.compiles != 0 || s.misses != 0) return "built kernels Redis holds";
  if (s.remote_hits != kKernels || s.disk_hits != kKernels) return "not every kernel from Redis";
  if (s.entries != kKernels) return "the Redis rows were not copied into the local cache";
  if (s.remote_errors != 0 || s.remote_discarded != 0) return "errors or discards";
  return "";
}

void test_warm_then_zero_compiles(void **) {
  // A fills Redis.
  assert_int_equal(in_child([] {
                     return cold_process(tcp_url(), [](const fa_cache_stats &s) -> std::string {
                       if (s.compiles < kKernels || s.misses != kKernels) return "no cold build";
                       if (s.remote_puts != kKernels || s.remote_misses != kKernels)
                         return "rows not written to Redis";
                       if (s.remote_errors != 0) return "errors";
                       const std::string name =
                           "redis://127.0.0.1:" + std::to_string(g_server.port) + "/3";
                       if (name != s.kernel_store) return "kernel_store is not the URL";
                       return "";
                     });
                   }),
                   0);
  Admin admin;
  const std::vector<std::string> keys = admin.keys();
  assert_int_equal(keys.size(), kKernels);
  for (const std::string &k : keys) {
    assert_true(k.rfind("flashattn:v1:", 0) == 0 && k.size() == 13 + 32);
    const std::string v = admin.get(k);
    // src/store_redis/README.md, "Value format": magic, 3 integers, 2 hashes,
    // then the key's length (8 bytes) and its 32 hex digits.
    assert_true(v.size() > 52 + 8 + 32);
    assert_true(v.compare(0, 8, "FAKROW01") == 0);
    assert_true(v.compare(52, 8, std::string("\x20\0\0\0\0\0\0\0", 8)) == 0);
    assert_true(v.compare(60, 32, k.substr(13)) == 0);
  }
  // B, with another empty local cache, through both addresses: nothing built.
  assert_int_equal(in_child([] { return cold_process(tcp_url(), expect_cold_from_redis); }), 0);
  assert_int_equal(in_child([] { return cold_process(unix_url(), expect_cold_from_redis); }), 0);
}

void test_planted_bad_rows_discarded(void **) {
  Admin admin;
  const std::vector<std::string> keys = admin.keys();
  assert_int_equal(keys.size(), kKernels);
  std::vector<std::string> good;
  for (const std::string &k : keys) good.push_back(admin.get(k));
  // A flipped byte near the end of the value (the PTX's tail: emulator rows
  // have no cubin) keeps the framing: only the hash can tell.
  std::string bad = good[0];
  assert_true(bad.size() > 200);
  bad[bad.size() - 20] ^= 0x01;
  assert_true(admin.set(keys[0], bad));
  assert_true(admin.set(keys[1], "not a kernel row"));  // a value the plugin cannot decode
  assert_int_equal(in_child([] {
                     return cold_process(tcp_url(), [](const fa_cache_stats &s) -> std::string {
                       if (s.remote_discarded != kKernels || s.discarded != kKernels)
                         return "not discarded";
                       if (s.remote_hits != 0 || s.misses != kKernels || s.compiles < kKernels)
                         return "a bad row was used";
                       if (s.remote_puts != kKernels)
                         return "the rebuilt rows were not written back";
                       return "";
                     });
                   }),
                   0);
  // Written back intact: the same bytes as before the damage.
  for (size_t i = 0; i < keys.size(); ++i) assert_true(admin.get(keys[i]) == good[i]);
  assert_int_equal(in_child([] { return cold_process(tcp_url(), expect_cold_from_redis); }), 0);
}

void test_server_going_away(void **) {
  const pid_t server = g_server.pid;
  const int rc = in_child([server] {
    setenv("FLASHATTN_KERNEL_STORE", tcp_url().c_str(), 1);
    const std::string dir = fa::test::temp_dir("store_redis", "away");
    fa_runtime *rt = fa::test::open_emulator_runtime(dir);
    if (rt == nullptr) return 1;
    bool ok = fa::test::launch_small_forward(rt, 32, 11);  // from Redis
    const fa_cache_stats s0 = fa::test::cache_stats_of(rt);
    // The server stops answering: the get times out (500 ms), the kernel is
    // built here, the put fails at once (backoff).
    kill(server, SIGSTOP);
    auto t0 = std::chrono::steady_clock::now();
    ok = fa::test::launch_small_forward(rt, 64, 12) && ok;
    const double stopped_s = seconds_since(t0);
    const fa_cache_stats s1 = fa::test::cache_stats_of(rt);
    // Then it is gone.
    kill(server, SIGKILL);
    t0 = std::chrono::steady_clock::now();
    ok = fa::test::launch_small_forward(rt, 128, 13) && ok;
    const double dead_s = seconds_since(t0);
    const fa_cache_stats s2 = fa::test::cache_stats_of(rt);
    fa_runtime_destroy(rt);
    // A new runtime while it is gone.
    const std::string dir2 = fa::test::temp_dir("store_redis", "away2");
    rt = fa::test::open_emulator_runtime(dir2);
    if (rt == nullptr) return 1;
    t0 = std::chrono::steady_clock::now();
    ok = fa::test::launch_small_forward(rt, 32, 14) && ok;
    const double fresh_s = seconds_since(t0);
    const fa_cache_stats s3 = fa::test::cache_stats_of(rt);
    fa_runtime_destroy(rt);
    fa::test::rm_rf(dir);
    fa::test::rm_rf(dir2);
    std::fprintf(stderr,
                 "stopped: %.2f s, errors %llu; dead: %.2f s, errors %llu; fresh runtime: %.2f s, "
                 "errors %llu, note \"%s\"\n",
                 stopped_s, (unsigned long long)s1.remote_errors, dead_s,
                 (unsigned long long)s2.remote_errors, fresh_s,
                 (unsigned long long)s3.remote_errors, s3.kernel_store_note);
    const bool counted = s0.remote_hits == 1 && s0.remote_errors == 0 && s1.remote_errors >= 1 &&
                         s2.remote_errors > s1.remote_errors && s2.compiles == 2 &&
                         s3.remote_errors >= 1 && s3.compiles == 1 && s3.kernel_store_note[0];
    const bool quick = stopped_s < 5 && dead_s < 5 && fresh_s < 5;
    if (!ok || !counted || !quick) {
      std::fprintf(stderr, "launched %d, counted %d, quick %d\n", ok, counted, quick);
      return 1;
    }
    return 0;
  });
  kill(server, SIGKILL);  // (the child did, unless it failed first)
  waitpid(server, nullptr, 0);
  g_server.pid = -1;
  assert_int_equal(rc, 0);
}

}  // namespace

int main(void) {
  g_server.redis_server = find_program("redis-server");
  if (g_server.redis_server.empty()) {
    std::printf("SKIP: redis-server is not installed (Debian: apt-get install redis-server)\n");
    return 77;
  }
  if (FA_STORE_REDIS_PLUGIN_PATH[0] == '\0') {
    std::printf(
        "FAIL: redis-server is installed but libflashattn_store_redis.so was not built "
        "(install libhiredis-dev and configure again)\n");
    return 1;
  }
  setenv("FLASHATTN_KERNEL_STORE_PLUGIN", FA_STORE_REDIS_PLUGIN_PATH, 1);
  setenv("FLASHATTN_QUIET", "1", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_warm_then_zero_compiles),
      cmocka_unit_test(test_planted_bad_rows_discarded),
      cmocka_unit_test(test_server_going_away),
  };
  return cmocka_run_group_tests_name("store_redis", tests, setup, teardown);
}
