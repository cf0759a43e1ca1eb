// Open MPI inside a module process. MpiSession initialises MPI (a process started without
// mpirun or srun is a singleton: rank 0 of 1), chooses the OpenMP threads per rank, and
// finalises; MpiComm implements Comm over an MPI communicator.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "parallel/comm.h"

namespace msaflow::parallel {

class MpiComm : public Comm {
 public:
  // Takes ownership of `comm` unless it is MPI_COMM_WORLD.
  explicit MpiComm(MPI_Comm comm);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void AllreduceSum(float* data, size_t n) override;
  void AllreduceSum(double* data, size_t n) override;
  void StartSum(float* data, size_t n) override;
  void ProgressSums() override;
  void FinishSums() override;
  ArgMax AllreduceArgMax(ArgMax mine) override;
  void Bcast(void* data, size_t bytes, int root) override;
  std::vector<std::string> Gather(const std::string& mine, int root) override;
  void Barrier() override;
  std::unique_ptr<Comm> Split(int color, int key) override;
  std::unique_ptr<SharedCounter> MakeCounter() override;
  void Send(int dest, int tag, const std::string& bytes) override;
  void Post(int dest, int tag, std::string bytes) override;
  void Flush() override;
  int Recv(int source, int tag, std::string* bytes, int* tag_out) override;

 private:
  struct Posted {
    std::string bytes;  // header + payload, alive until the send completes
    std::vector<MPI_Request> requests;
  };
  void TestPosted();  // frees the posted sends that completed

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<std::unique_ptr<Posted>> posted_;
  std::vector<MPI_Request> sums_;  // StartSum's, until FinishSums
};

class MpiSession {
 public:
  // MPI_Init_thread (funneled) when an MPI launcher started this process; otherwise it is a
  // job of one rank that needs no MPI, and world() is a SelfComm (an MPI singleton start forks
  // a daemon per process: ~0.4 s of every single-rank step here). Unless OMP_NUM_THREADS is
  // set, each rank gets max(1, usable cores / ranks on its node) OpenMP threads.
  MpiSession(int* argc, char*** argv);
  ~MpiSession();  // MPI_Finalize, when MPI was initialised
  // Whether mpirun, srun --mpi=pmix/pmi2 or another PMI launcher started this process.
  static bool LaunchedByMpi();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  Comm& world() { return *world_; }
  int threads() const { return threads_; }
  // Ends every rank of the job with `code` (after an error on this one, so that no rank is
  // left waiting in a collective). Does nothing for a job of one rank.
  void AbortIfParallel(int code);

 private:
  std::unique_ptr<Comm> world_;
  bool mpi_ = false;
  int threads_ = 1;
};

}  // namespace msaflow::parallel
