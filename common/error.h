// Errors crossing module boundaries. Every message names where the problem is (file, JSON
// pointer, NAM object, ONNX node) and what was expected. The CLI maps kinds to exit codes
// (docs/cli.md).
#pragma once

#include <stdexcept>
#include <string>

namespace msaflow {

enum class ErrorKind {
  kInvalidInput,  // a user-supplied file or argument is malformed (pipeline, model, dataset)
  kNotFound,      // a named thing (file, NAM object, layer) does not exist
  kCorrupt,       // stored bytes fail their checksum or framing
  kUnsupported,   // well-formed, but outside what msaflow implements (an ONNX operator, ...)
  kIo,            // the operating system refused (open, write, fsync, rename, spawn)
  kTaskFailed,    // a launched task exited non-zero
  kUnavailable,   // a service (the NAM server) is unreachable or did not answer in time
  kCapacity,      // a bounded resource is full ("NAM full (used/capacity)")
  kInternal,
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind), message_(what) {}
  ErrorKind kind() const { return kind_; }
  // The whole message, NUL bytes included (what() ends at the first one).
  const std::string& message() const { return message_; }

 private:
  ErrorKind kind_;
  std::string message_;
};

// Shorthands: throw Invalid("pipeline.json: /rounds/max: expected ...").
[[noreturn]] void Throw(ErrorKind kind, const std::string& what);
// "<what>: <strerror(errno)>" as kIo.
[[noreturn]] void ThrowErrno(const std::string& what);

const char* ErrorKindName(ErrorKind kind);

}  // namespace msaflow
