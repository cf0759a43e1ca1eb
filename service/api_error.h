// What the service answers when a request cannot be served: an HTTP status and the body
// {"error": {"code", "message", "pointer"?, "hint"?}} (docs/service.md).
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace msaflow::service {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string code, const std::string& message, std::string pointer = "", std::string hint = "")
      : std::runtime_error(message), status_(status), code_(std::move(code)), pointer_(std::move(pointer)),
        hint_(std::move(hint)) {}
  int status() const { return status_; }
  const std::string& code() const { return code_; }
  nlohmann::json Body() const {
    nlohmann::json e = {{"code", code_}, {"message", what()}};
    if (!pointer_.empty()) e["pointer"] = pointer_;
    if (!hint_.empty()) e["hint"] = hint_;
    return {{"error", e}};
  }

 private:
  int status_;
  std::string code_, pointer_, hint_;
};

}  // namespace msaflow::service
