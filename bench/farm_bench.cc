// The evaluate step's task farm: how many trivial tasks per second one launch dispatches, by
// the one-sided counter and by a dispatcher rank, against static round-robin dealing (no
// coordination at all) measured in the same run; and the overhead per task on tasks of a
// fixed length. Run under mpirun (docs/benchmarks.md):
//   mpirun -n 2 build/bench/bench_farm [--tasks 200000] [--task-us 200]
// (no more ranks than cores, or the overhead measures the oversubscription).
// Goal: >= 15,000 tasks/s and <= 0.1 ms overhead per task (10x the best published pilot
// system, ~1,500 tasks/s).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "bench/bench_util.h"
#include "parallel/mpi_comm.h"
#include "parallel/task_farm.h"

namespace {

using msaflow::parallel::Comm;

// Runs `tasks` tasks of `task_us` busy microseconds through `kind` ("static": rank r takes
// r, r + size, ...); returns the wall time of the slowest rank and the tasks this rank ran.
double RunFarm(Comm& comm, const std::string& kind, int64_t tasks, int task_us, int64_t* mine) {
  comm.Barrier();
  auto t0 = std::chrono::steady_clock::now();
  *mine = 0;
  auto work = [&] {
    if (task_us <= 0) return;
    auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(task_us);
    while (std::chrono::steady_clock::now() < until) {
    }
  };
  if (kind == "static") {
    for (int64_t k = comm.rank(); k < tasks; k += comm.size()) {
      work();
      ++*mine;
    }
  } else {
    auto farm = msaflow::parallel::MakeTaskFarm(comm, tasks, *msaflow::workflow::FarmKindFromName(kind));
    while (farm->Next() >= 0) {
      work();
      ++*mine;
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  comm.AllreduceSum(&secs, 1);  // ranks end within one task of each other: the mean is the wall
  return secs / comm.size();
}

}  // namespace

int main(int argc, char** argv) {
  msaflow::parallel::MpiSession mpi(&argc, &argv);
  Comm& comm = mpi.world();
  int64_t tasks = 200000;
  int task_us = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tasks")) tasks = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--task-us")) task_us = std::atoi(argv[i + 1]);
  }
  const bool root = comm.rank() == 0;
  if (root) std::printf("%s\n", msaflow::bench::CpuLine().c_str());
  if (root)
    std::printf("%d ranks on %u cores; %lld trivial tasks, then %lld tasks of %d us\n", comm.size(),
                std::thread::hardware_concurrency(), static_cast<long long>(tasks),
                static_cast<long long>(tasks / 20), task_us);
  double base = 0;
  for (const char* kind : {"static", "counter", "dispatcher"}) {
    int64_t mine = 0;
    RunFarm(comm, kind, tasks / 10, 0, &mine);  // warm-up
    double trivial = RunFarm(comm, kind, tasks, 0, &mine);
    double rate = static_cast<double>(tasks) / trivial;
    // Overhead: wall x working ranks, less the tasks' own time, per task.
    const int64_t timed = tasks / 20;
    double wall = RunFarm(comm, kind, timed, task_us, &mine);
    int workers = std::string(kind) == "dispatcher" && comm.size() > 1 ? comm.size() - 1 : comm.size();
    double overhead_ms = 1e3 * (wall * workers - static_cast<double>(timed) * task_us * 1e-6) / static_cast<double>(timed);
    if (std::string(kind) == "static") base = overhead_ms;
    if (root && std::string(kind) == "static")
      std::printf("%-10s (no coordination: the reference)                     overhead %.4f ms/task\n", kind,
                  overhead_ms);
    else if (root)
      std::printf("%-10s %10.0f tasks/s (%.0fx the published 1,500/s; goal 15,000)   overhead %.4f ms/task, "
                  "%+.4f vs static (goal <= 0.1)\n",
                  kind, rate, rate / 1500.0, overhead_ms, overhead_ms - base);
  }
  return 0;
}
