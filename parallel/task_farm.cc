#include "parallel/task_farm.h"

#include <cstring>

#include "common/error.h"

namespace msaflow::parallel {
namespace {

constexpr int kTagAsk = 201, kTagTask = 202;

class CounterFarm : public TaskFarm {
 public:
  CounterFarm(Comm& comm, int64_t tasks) : counter_(comm.MakeCounter()), tasks_(tasks) {}
  int64_t Next() override {
    if (done_) return -1;
    int64_t k = counter_->Next();
    if (k >= tasks_) done_ = true;
    return done_ ? -1 : k;
  }

 private:
  std::unique_ptr<SharedCounter> counter_;
  int64_t tasks_;
  bool done_ = false;
};

class DispatcherFarm : public TaskFarm {
 public:
  DispatcherFarm(Comm& comm, int64_t tasks) : comm_(comm), tasks_(tasks) {}
  bool works() const override { return comm_.size() == 1 || comm_.rank() != 0; }
  int64_t Next() override {
    if (comm_.size() == 1) return next_ < tasks_ ? next_++ : -1;
    if (comm_.rank() == 0) {
      Serve();
      return -1;
    }
    if (done_) return -1;
    comm_.Send(0, kTagAsk, "");
    std::string msg;
    comm_.Recv(0, kTagTask, &msg, nullptr);
    int64_t k = -1;
    if (msg.size() != sizeof k) Throw(ErrorKind::kCorrupt, "task farm: a reply of " + std::to_string(msg.size()) + " bytes");
    std::memcpy(&k, msg.data(), sizeof k);
    if (k < 0) done_ = true;
    return k;
  }

 private:
  // Answers requests until every other rank has been told there is nothing left.
  void Serve() {
    int finished = 0;
    std::string msg, reply(sizeof(int64_t), '\0');
    while (finished < comm_.size() - 1) {
      int from = comm_.Recv(kAnySource, kTagAsk, &msg, nullptr);
      int64_t k = next_ < tasks_ ? next_++ : -1;
      if (k < 0) ++finished;
      std::memcpy(reply.data(), &k, sizeof k);
      comm_.Post(from, kTagTask, reply);
    }
    comm_.Flush();
  }

  Comm& comm_;
  int64_t tasks_, next_ = 0;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<TaskFarm> MakeTaskFarm(Comm& comm, int64_t tasks, workflow::FarmKind kind) {
  switch (kind) {
    case workflow::FarmKind::kCounter:
      return std::make_unique<CounterFarm>(comm, tasks);
    case workflow::FarmKind::kDispatcher:
      return std::make_unique<DispatcherFarm>(comm, tasks);
  }
  Throw(ErrorKind::kInternal, "MakeTaskFarm: an unknown farm kind");
}

}  // namespace msaflow::parallel
