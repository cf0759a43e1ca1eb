// The communication a module step needs, behind one interface: MpiComm (parallel/mpi_comm.h)
// for real ranks under mpirun or srun --mpi=pmix, SelfComm for one rank without MPI (tests,
// and the ranks of mode "independent", which train alone).
// Waits are polite: a rank waiting for a message or a collective sleeps between polls, so
// ranks oversubscribed on few cores leave the CPU to the ranks that compute.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace msaflow::parallel {

inline constexpr int kAnySource = -1;
inline constexpr int kAnyTag = -1;

// A value and its owner for an argmax over ranks: the largest metric wins, equal metrics go to
// the smallest index (MPI_MAXLOC's rule); NaN never wins.
struct ArgMax {
  double metric = 0;
  int index = -1;
};

// A counter every rank of a communicator draws from: Next() returns 0, 1, 2, ... across all
// ranks together, each value exactly once.
class SharedCounter {
 public:
  virtual ~SharedCounter() = default;
  virtual int64_t Next() = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void AllreduceSum(float* data, size_t n) = 0;
  virtual void AllreduceSum(double* data, size_t n) = 0;
  // Sums that overlap computation (a training step's gradient buckets, summed while the
  // backward pass goes on): StartSum begins summing data[0, n) over the ranks in place and
  // returns at once; every rank starts the same sums, of the same sizes, in the same order.
  // ProgressSums moves the started sums along (MPI progresses a nonblocking collective only
  // inside MPI calls: call it between pieces of the computation); FinishSums waits for all of
  // them. The data must not be touched between StartSum and FinishSums.
  virtual void StartSum(float* data, size_t n) = 0;
  virtual void ProgressSums() = 0;
  virtual void FinishSums() = 0;
  virtual ArgMax AllreduceArgMax(ArgMax mine) = 0;
  virtual void Bcast(void* data, size_t bytes, int root) = 0;
  // `root` receives every rank's bytes in rank order; the others receive an empty vector.
  virtual std::vector<std::string> Gather(const std::string& mine, int root) = 0;
  virtual void Barrier() = 0;
  // Collective: a counter held by rank 0, drawn from with one-sided atomics (MPI_Fetch_and_op).
  virtual std::unique_ptr<SharedCounter> MakeCounter() = 0;
  // Ranks passing the same color form a communicator, ordered by key.
  virtual std::unique_ptr<Comm> Split(int color, int key) = 0;
  virtual void Send(int dest, int tag, const std::string& bytes) = 0;
  // Sends without waiting for the receiver: the message is on its way when Post returns, and
  // completes while this rank goes on (every Recv moves it along). Flush waits for all of them.
  virtual void Post(int dest, int tag, std::string bytes) = 0;
  virtual void Flush() = 0;
  // Blocks until a message matching source/tag (kAnySource, kAnyTag) arrives; returns its
  // source and stores its tag in *tag_out when given.
  virtual int Recv(int source, int tag, std::string* bytes, int* tag_out = nullptr) = 0;
};

// One rank, no MPI: collectives return their input; there is no peer to send to.
class SelfComm : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void AllreduceSum(float*, size_t) override {}
  void AllreduceSum(double*, size_t) override {}
  void StartSum(float*, size_t) override {}
  void ProgressSums() override {}
  void FinishSums() override {}
  ArgMax AllreduceArgMax(ArgMax mine) override { return mine; }
  void Bcast(void*, size_t, int) override {}
  std::vector<std::string> Gather(const std::string& mine, int) override { return {mine}; }
  void Barrier() override {}
  std::unique_ptr<Comm> Split(int, int) override { return std::make_unique<SelfComm>(); }
  std::unique_ptr<SharedCounter> MakeCounter() override;
  void Send(int dest, int tag, const std::string& bytes) override;
  void Post(int dest, int tag, std::string bytes) override { Send(dest, tag, bytes); }
  void Flush() override {}
  int Recv(int source, int tag, std::string* bytes, int* tag_out) override;
};

}  // namespace msaflow::parallel
