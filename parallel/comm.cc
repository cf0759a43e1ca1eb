#include "parallel/comm.h"

#include "common/error.h"

namespace msaflow::parallel {

void SelfComm::Send(int dest, int, const std::string&) {
  Throw(ErrorKind::kInternal, "SelfComm: no rank " + std::to_string(dest) + " to send to (one rank only)");
}

int SelfComm::Recv(int source, int, std::string*, int*) {
  Throw(ErrorKind::kInternal, "SelfComm: no rank " + std::to_string(source) + " to receive from (one rank only)");
}

}  // namespace msaflow::parallel
