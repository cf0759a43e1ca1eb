// Inference in `msaflow serve`: the Open Inference Protocol v2 subset that Triton, KServe and
// ONNX Runtime's server share (GET /v2/models/{name}, POST /v2/models/{name}/infer), over a
// run's champion or an exported model, each behind a dynamic batcher (inference/batcher.h).
//
// Model names (docs/inference.md): a name given with `msaflow serve --model NAME=PATH` (a run
// directory or a file `msaflow export` wrote), shared by every user; the caller's own runs by
// id, `<run-id>` (its champion) or `<run-id>:<candidate>`; and `<pipeline>@champion`, the best
// champion among the caller's finished runs of that pipeline, which moves when a better one
// finishes.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "inference/batcher.h"
#include "service/registry.h"
#include "service/users.h"

namespace msaflow::service {

class ModelServer {
 public:
  // models: NAME -> PATH. Throws Error for a model that cannot be loaded (before serving).
  ModelServer(const Registry& registry, const std::map<std::string, std::string>& models, inference::BatchOptions o);

  // GET /v2/models/{name}: name, versions, platform, inputs and outputs with their shapes.
  nlohmann::json Metadata(const User& u, const std::string& name);
  // POST /v2/models/{name}/infer: the request body as JSON text -> the response. Throws ApiError
  // 400 for a malformed request (naming the field), 404 for an unknown model, 503 when the
  // model's queue is full.
  nlohmann::json Infer(const User& u, const std::string& name, const std::string& body);

 private:
  struct Loaded {
    std::string name, source;  // as asked, and the file or run it came from
    std::shared_ptr<inference::Batcher> batcher;
  };
  Loaded Resolve(const User& u, const std::string& name);
  std::shared_ptr<inference::Batcher> Load(const std::string& path, const std::string& candidate);

  const Registry& registry_;
  std::map<std::string, std::string> models_;
  inference::BatchOptions o_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<inference::Batcher>> loaded_;  // by path + ":" + candidate
};

}  // namespace msaflow::service
