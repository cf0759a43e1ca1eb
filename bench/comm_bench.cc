// bench/comm: the alpha (latency) and beta (seconds per byte) of the fabric between the ranks of
// one launch, as `msaflow simulate` models it (docs/simulate.md): point-to-point, by ping-pong
// between ranks 0 and 1, and MPI_Allreduce of floats over every rank, fitted to the ring model
// msaflow's sync training is simulated with: t(n) = 2(p-1) alpha + 2(p-1)/p n beta.
//
//   mpirun -n 2 build/bench/bench_comm [--reps 100] [--max-bytes 4194304]     # one host
//   srun -N 2 -n 2 --mpi=pmix build/bench/bench_comm                          # two hosts
//
// Prints the ranks' hosts, a table per message size (medians over --reps, each timed by the
// slowest rank), the fitted figures, and the `msaflow simulate` options that carry them: a
// message between two nodes crosses both nodes' links in the model, so --latency is half the
// measured one-way latency and --link-bandwidth is 1 / beta. The last line is the same as JSON.
// Waiting ranks yield their core (OMPI_MCA_mpi_yield_when_idle=1 unless set), as msaflow's do.
#include <mpi.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "bench/bench_util.h"

namespace {

double Median(std::vector<double> v) { return msaflow::bench::Median(std::move(v)); }

// One-way time of an n-byte message between ranks 0 and 1 (half a round trip), median of reps;
// the other ranks wait at the barrier.
double PingPong(int rank, int64_t n, int reps, std::vector<char>& buf) {
  std::vector<double> t;
  const int count = static_cast<int>(n);
  for (int i = -3; i < reps; ++i) {  // three warm-up round trips
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    if (rank == 0) {
      MPI_Send(buf.data(), count, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(buf.data(), count, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
      MPI_Recv(buf.data(), count, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf.data(), count, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
    if (i >= 0) t.push_back((MPI_Wtime() - t0) / 2);
  }
  double m = rank == 0 ? Median(t) : 0, all = 0;
  MPI_Allreduce(&m, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return all;
}

// One MPI_Allreduce (sum) of n bytes of floats over every rank, the slowest rank's time, median.
double Allreduce(int64_t n, int reps, std::vector<float>& in, std::vector<float>& out) {
  std::vector<double> t;
  const int count = static_cast<int>(std::max<int64_t>(1, n / 4));
  for (int i = -3; i < reps; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    MPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double mine = MPI_Wtime() - t0, slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (i >= 0) t.push_back(slowest);
  }
  return Median(t);
}

// Least-squares slope of t over n.
double Slope(const std::vector<std::pair<double, double>>& pts) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : pts) sx += x, sy += y, sxx += x * x, sxy += x * y;
  const double k = static_cast<double>(pts.size());
  const double d = k * sxx - sx * sx;
  return d > 0 ? (k * sxy - sx * sy) / d : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Waiting ranks yield their core, as msaflow's own waits do (they poll with backoff): more
  // ranks than cores (the test cluster's "hosts" share two) otherwise measure time slices.
  ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CLI::App app{"bench/comm: latency and bandwidth of point-to-point messages and allreduce"};
  int reps = 100;
  int64_t max_bytes = 4 << 20;
  app.add_option("--reps", reps, "timed repetitions per size (median)")->capture_default_str();
  app.add_option("--max-bytes", max_bytes, "the largest message")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = rank == 0 ? app.exit(e) : 1;
    MPI_Finalize();
    return rc;
  }
  if (size < 2 || reps < 1 || max_bytes < 64 || max_bytes > (1LL << 30)) {
    if (rank == 0)
      std::fprintf(stderr, "bench_comm: needs at least 2 ranks, --reps >= 1 and --max-bytes in 64..2^30\n");
    MPI_Finalize();
    return 2;
  }
  // Where the ranks run.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> names(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Gather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);
  std::vector<int64_t> sizes;
  for (int64_t n = 8; n <= max_bytes; n *= 8) sizes.push_back(n);
  std::vector<char> buf(static_cast<size_t>(max_bytes));
  std::vector<float> in(static_cast<size_t>(max_bytes / 4 + 1), 1.f), out(in.size());
  std::vector<double> p2p, ar;
  for (const int64_t n : sizes) {
    p2p.push_back(PingPong(rank, n, reps, buf));
    ar.push_back(Allreduce(n, reps, in, out));
  }
  if (rank == 0) {
    std::set<std::string> hosts;
    std::string list;
    for (int r = 0; r < size; ++r) {
      const std::string h(&names[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]);
      hosts.insert(h);
      list += (r ? ", " : "") + h;
    }
    std::printf("%s\n", msaflow::bench::CpuLine().c_str());
    std::printf("bench/comm: %d ranks on %zu host(s): %s; medians of %d, the slowest rank's\n\n", size, hosts.size(),
                list.c_str(), reps);
    std::printf("  %10s %16s %14s %18s\n", "bytes", "one-way (ping)", "bandwidth", "allreduce (all)");
    for (size_t i = 0; i < sizes.size(); ++i)
      std::printf("  %10lld %13.2f us %9.3f GB/s %15.2f us\n", static_cast<long long>(sizes[i]), 1e6 * p2p[i],
                  static_cast<double>(sizes[i]) / p2p[i] / 1e9, 1e6 * ar[i]);
    // alpha: the smallest message's time; beta: the slope through the sizes of 32 KiB and more,
    // where the time grows with the bytes (eager/rendezvous switches sit below).
    std::vector<std::pair<double, double>> big_p2p, big_ar;
    for (size_t i = 0; i < sizes.size(); ++i)
      if (sizes[i] >= int64_t{32} * 1024) {
        big_p2p.emplace_back(static_cast<double>(sizes[i]), p2p[i]);
        big_ar.emplace_back(static_cast<double>(sizes[i]), ar[i]);
      }
    const double p = static_cast<double>(size);
    const double alpha = p2p.front(), beta = std::max(Slope(big_p2p), 1e-15);
    const double ar_alpha = ar.front() / (2 * (p - 1)), ar_beta = std::max(Slope(big_ar) * p / (2 * (p - 1)), 1e-15);
    std::printf("\n  point-to-point: alpha %.2f us, beta %.3g s/byte (%.3f GB/s)\n", 1e6 * alpha, beta, 1e-9 / beta);
    std::printf("  allreduce as a ring of %d: alpha %.2f us per step, beta %.3g s/byte (%.3f GB/s)\n", size,
                1e6 * ar_alpha, ar_beta, 1e-9 / ar_beta);
    std::printf("  msaflow simulate ... --latency %.3g --link-bandwidth %.3g\n", alpha / 2, 1 / beta);
    std::printf(
        "{\"ranks\": %d, \"hosts\": %zu, \"alpha_s\": %.6g, \"beta_s_per_byte\": %.6g, \"allreduce_alpha_s\": %.6g, "
        "\"allreduce_beta_s_per_byte\": %.6g, \"simulate\": {\"latency\": %.6g, \"link_bandwidth\": %.6g}}\n",
        size, hosts.size(), alpha, beta, ar_alpha, ar_beta, alpha / 2, 1 / beta);
  }
  MPI_Finalize();
  return 0;
}
