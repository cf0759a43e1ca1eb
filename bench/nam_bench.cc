// bench/nam: put and get throughput of 64 MiB objects through the NAM server, next to memcpy
// and to Redis (Debian's redis-server on loopback, SET/GET of the same objects), all measured
// in this run on this machine. Targets (issue 3): a same-node get >= 0.5x memcpy, and a
// get over tcp;ofi_rxm >= 4x Redis.
//
//   bench_nam --msaflow build/msaflow [--size 64MiB] [--reps 8] [--check]
//
// Each figure is the median of --reps timed operations after one warm-up; buffers are reused
// (no page faults in the timed part) as they are for memcpy.
#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "nam/fabric_store.h"
#include "nam/pool.h"
#include "bench/bench_util.h"

namespace {

using namespace msaflow;
using Steady = std::chrono::steady_clock;
using bench::Child;
using bench::Median;
using bench::WaitReady;

// GiB/s of `op` moving `bytes`, median of `reps` after a warm-up.
double Measure(size_t bytes, int reps, const std::function<void()>& op) {
  op();
  std::vector<double> rates;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Steady::now();
    op();
    double s = std::chrono::duration<double>(Steady::now() - t0).count();
    rates.push_back(static_cast<double>(bytes) / s / (1024.0 * 1024 * 1024));
  }
  return Median(rates);
}

struct Row {
  std::string what;
  double put, get;
};

// Redis on loopback at `port`: SET and GET of `src`, GiB/s (median of `reps`) into *set, *get.
void MeasureRedis(const std::string& redis, int port, const std::string& dir, const std::string& src, int reps,
                  double* set, double* get) {
  Child rs;
  rs.Start({redis, "--port", std::to_string(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--proto-max-bulk-len", "2gb", "--client-query-buffer-limit", "2gb", "--dir", dir},
           dir + "/redis.log");
  redisContext* c = nullptr;
  for (int i = 0; i < 200 && (!c || c->err); ++i) {
    if (c) redisFree(c);
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    c = redisConnect("127.0.0.1", port);
  }
  if (!c || c->err) Throw(ErrorKind::kUnavailable, "redis-server did not come up: " + ReadFile(dir + "/redis.log"));
  std::string got;
  const size_t size = src.size();
  *set = Measure(size, reps, [&] {
    auto* r = static_cast<redisReply*>(redisCommand(c, "SET %s %b", "bench/object", src.data(), src.size()));
    if (!r || r->type == REDIS_REPLY_ERROR) Throw(ErrorKind::kIo, "redis SET failed");
    freeReplyObject(r);
  });
  *get = Measure(size, reps, [&] {
    auto* r = static_cast<redisReply*>(redisCommand(c, "GET %s", "bench/object"));
    if (!r || r->type != REDIS_REPLY_STRING) Throw(ErrorKind::kIo, "redis GET failed");
    got.assign(r->str, r->len);
    freeReplyObject(r);
  });
  if (got != src) Throw(ErrorKind::kCorrupt, "redis returned other bytes");
  redisFree(c);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench/nam: NAM put/get throughput vs memcpy and Redis"};
  std::string exe = "build/msaflow", size_text = "64MiB", redis = "/usr/bin/redis-server";
  int reps = 8;
  bool check = false;
  app.add_option("--msaflow", exe, "the msaflow binary (starts the servers)")->capture_default_str();
  app.add_option("--size", size_text, "object size")->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions (median reported)")->capture_default_str();
  app.add_option("--redis-server", redis, "redis-server binary")->capture_default_str();
  app.add_flag("--check", check, "exit 1 if a target is missed");
  CLI11_PARSE(app, argc, argv);
  try {
    const size_t size = nam::ParseSize(size_text, "--size");
    std::string dir = std::filesystem::temp_directory_path() / ("msaflow-bench-nam-" + std::to_string(getpid()));
    MakeDirs(dir);
    std::string src(size, '\0');
    std::mt19937_64 rng(42);
    for (size_t i = 0; i + 8 <= size; i += 8) {
      uint64_t v = rng();
      std::memcpy(&src[i], &v, 8);
    }
    std::string dst(size, '\0');
    std::printf("%s\n", bench::CpuLine().c_str());
    std::printf("bench/nam: %s objects, median of %d, on %u cores\n", HumanBytes(size).c_str(), reps,
                std::thread::hardware_concurrency());

    double mcpy = Measure(size, reps, [&] { std::memcpy(dst.data(), src.data(), size); });
    std::vector<Row> rows;

    // The NAM server, once per provider; each client transport against it.
    struct Config {
      std::string provider, transport, label;
    };
    std::vector<Config> configs = {{"tcp", "rma", "NAM tcp;ofi_rxm, RMA"},
                                   {"shm", "rma", "NAM shm, RMA"},
                                   {"tcp", "map", "NAM same-node mapped pool"}};
    int port = 17000 + static_cast<int>(getpid() % 20000);
    for (const auto& cfg : configs) {
      Child server;
      std::string ready = dir + "/ready-" + cfg.provider + "-" + cfg.transport + ".json";
      std::string log = dir + "/server-" + cfg.provider + "-" + cfg.transport + ".log";
      server.Start({exe, "nam", "serve", "--listen", "127.0.0.1:" + std::to_string(port++), "--provider", cfg.provider,
                    "--capacity", std::to_string(size * 4 + (64 << 20)), "--ready-file", ready},
                   log);
      std::string uri = WaitReady(ready, server, log);
      uri += (uri.find('?') == std::string::npos ? "?" : "&") + std::string("transport=") + cfg.transport;
      nam::FabricStore store(uri);
      std::string buf;
      double put = Measure(size, reps, [&] { store.Put("bench/object", src, nlohmann::json::object()); });
      double get = Measure(size, reps, [&] { store.GetInto("bench/object", buf); });
      if (buf != src) Throw(ErrorKind::kCorrupt, cfg.label + ": the bytes read back differ from those written");
      rows.push_back({cfg.label, put, get});
    }

    // Redis on loopback, SET/GET of the same bytes.
    double rset = 0, rget = 0;
    const bool have_redis = PathExists(redis);
    if (have_redis) MeasureRedis(redis, port++, dir, src, reps, &rset, &rget);

    std::printf("\n  %-28s %10s %10s %12s %12s\n", "path", "put GiB/s", "get GiB/s", "get/memcpy", "get/Redis");
    std::printf("  %-28s %10.2f %10.2f %12s %12s\n", "memcpy (same process)", mcpy, mcpy, "1.00", "");
    if (have_redis) std::printf("  %-28s %10.2f %10.2f %12.2f %12s\n", "Redis 7 on loopback", rset, rget, rget / mcpy, "1.00");
    for (const auto& r : rows) {
      char vs_redis[32] = "n/a";
      if (have_redis) std::snprintf(vs_redis, sizeof vs_redis, "%.2f", r.get / rget);
      std::printf("  %-28s %10.2f %10.2f %12.2f %12s\n", r.what.c_str(), r.put, r.get, r.get / mcpy, vs_redis);
    }
    const Row& tcp = rows[0];
    const Row& mapped = rows[2];
    bool same_node_ok = mapped.get >= 0.5 * mcpy;
    bool tcp_ok = !have_redis || tcp.get >= 4 * rget;
    std::printf("\ntargets: same-node get >= 0.5x memcpy: %.2fx %s\n", mapped.get / mcpy, same_node_ok ? "met" : "MISSED");
    if (have_redis)
      std::printf("         tcp;ofi_rxm get >= 4x Redis: %.2fx %s\n", tcp.get / rget, tcp_ok ? "met" : "MISSED");
    else
      std::printf("         tcp;ofi_rxm get >= 4x Redis: not measured (no %s)\n", redis.c_str());
    std::filesystem::remove_all(dir);
    return check && !(same_node_ok && tcp_ok) ? 1 : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_nam: error: %s\n", e.what());
    return 1;
  }
}
