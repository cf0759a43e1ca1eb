#include "parallel/comm.h"

#include "common/error.h"

namespace msaflow::parallel {

namespace {
class LocalCounter : public SharedCounter {
 public:
  int64_t Next() override { return next_++; }

 private:
  int64_t next_ = 0;
};
}  // namespace

std::unique_ptr<SharedCounter> SelfComm::MakeCounter() { return std::make_unique<LocalCounter>(); }

void SelfComm::Send(int dest, int, const std::string&) {
  Throw(ErrorKind::kInternal, "SelfComm: no rank " + std::to_string(dest) + " to send to (one rank only)");
}

int SelfComm::Recv(int source, int, std::string*, int*) {
  Throw(ErrorKind::kInternal, "SelfComm: no rank " + std::to_string(source) + " to receive from (one rank only)");
}

}  // namespace msaflow::parallel
