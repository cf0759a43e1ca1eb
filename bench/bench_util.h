// Helpers shared by the benchmarks: medians, child processes started and stopped by PID,
// and waiting for a NAM server's ready file.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/files.h"

namespace msaflow::bench {

// One result as a line of JSON on stdout, flushed (a driver script reads them as they come).
inline void PrintJsonLine(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

// A bench's main body: an error becomes one line "NAME: what" on stderr and exit status 1.
template <typename F>
int ReportErrors(const char* name, F&& body) {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

// "cpu: <model>, N cores; AVX2 yes, AVX-512 no, VNNI no": what a bench ran on, for its first
// line. Ratios against other libraries differ between CPUs, so a figure means little without it.
inline std::string CpuLine() {
  std::string model = "unknown model", flags;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (line.rfind("model name", 0) == 0 && model == "unknown model") model = line.substr(colon + 2);
    if (line.rfind("flags", 0) == 0 && flags.empty()) flags = " " + line.substr(colon + 1) + " ";
  }
  auto has = [&](const char* f) { return flags.find(std::string(" ") + f + " ") != std::string::npos; };
  auto yes = [](bool b) { return b ? "yes" : "no"; };
  return "cpu: " + model + ", " + std::to_string(std::thread::hardware_concurrency()) + " cores; AVX2 " +
         yes(has("avx2")) + ", AVX-512 " + yes(has("avx512f")) + ", VNNI " + yes(has("avx512_vnni") || has("avx_vnni"));
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A child process we started and stop by PID.
struct Child {
  pid_t pid = -1;
  ~Child() { Stop(); }
  void Start(const std::vector<std::string>& argv, const std::string& log) {
    pid = fork();
    if (pid < 0) ThrowErrno("fork");
    if (pid == 0) {
      FILE* f = std::fopen(log.c_str(), "w");
      if (f) {
        dup2(fileno(f), 1);
        dup2(fileno(f), 2);
      }
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
  }
  void Stop() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      int st;
      waitpid(pid, &st, 0);
      pid = -1;
    }
  }
};

inline std::string WaitReady(const std::string& ready, const Child& c, const std::string& log) {
  for (int i = 0; i < 200; ++i) {
    if (PathExists(ready)) {
      auto j = nlohmann::json::parse(ReadFile(ready), nullptr, false);
      if (!j.is_discarded()) return j.at("uri");
    }
    int st;
    if (waitpid(c.pid, &st, WNOHANG) == c.pid)
      Throw(ErrorKind::kUnavailable, "the NAM server exited at start; its log: " + ReadFile(log));
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  Throw(ErrorKind::kUnavailable, "the NAM server did not become ready; its log: " + ReadFile(log));
}

}  // namespace msaflow::bench
