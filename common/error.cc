#include "common/error.h"

#include <cerrno>
#include <cstring>

namespace msaflow {

void Throw(ErrorKind kind, const std::string& what) { throw Error(kind, what); }

void ThrowErrno(const std::string& what) {
  throw Error(ErrorKind::kIo, what + ": " + std::strerror(errno));
}

const char* ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidInput: return "invalid input";
    case ErrorKind::kNotFound: return "not found";
    case ErrorKind::kCorrupt: return "corrupt";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kIo: return "i/o error";
    case ErrorKind::kTaskFailed: return "task failed";
    case ErrorKind::kUnavailable: return "unavailable";
    case ErrorKind::kCapacity: return "capacity";
    case ErrorKind::kInternal: return "internal error";
  }
  return "error";
}

}  // namespace msaflow
