#include "service/inference_api.h"

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>

#include "common/error.h"
#include "common/files.h"
#include "inference/champion.h"
#include "kernels/image_codec.h"
#include "record/run_dir.h"
#include "service/api_error.h"

namespace msaflow::service {

using nlohmann::json;

namespace {

constexpr size_t kMaxLoaded = 16;  // models kept loaded; the least recently asked-for idle one goes

bool ValidModelName(const std::string& s) {
  if (s.empty() || s.size() > 200) return false;
  return std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '.' || c == '_' || c == '-' || c == '@' || c == ':';
  });
}

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Standard base64 (RFC 4648, padded) -> bytes; false if it is not.
bool Base64Decode(const std::string& in, std::string* out) {
  if (in.empty() || in.size() % 4 != 0 || in.size() > (64u << 20)) return false;
  out->resize(in.size() / 4 * 3);
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out->data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  if (n < 0) return false;
  size_t pad = 0;
  if (in[in.size() - 1] == '=') ++pad;
  if (in[in.size() - 2] == '=') ++pad;
  out->resize(static_cast<size_t>(n) - pad);
  return true;
}

ApiError Bad(const std::string& message) { return ApiError(400, "bad_request", message); }

// The tensor's data, flat (a nested array is taken in row-major order), exactly `count` values.
std::vector<const json*> Flat(const json& data, size_t count) {
  std::vector<const json*> out;
  out.reserve(count);
  std::vector<const json*> stack{&data};
  // Depth first, in order: children pushed in reverse.
  while (!stack.empty()) {
    const json* v = stack.back();
    stack.pop_back();
    if (v->is_array()) {
      for (auto it = v->rbegin(); it != v->rend(); ++it) stack.push_back(&*it);
      if (stack.size() > count + 64) throw Bad(fmt::format("inputs[0].data: more values than its shape's {}", count));
    } else {
      out.push_back(v);
      if (out.size() > count) throw Bad(fmt::format("inputs[0].data: more values than its shape's {}", count));
    }
  }
  if (out.size() != count)
    throw Bad(fmt::format("inputs[0].data: {} values; its shape says {}", out.size(), count));
  return out;
}

}  // namespace

ModelServer::ModelServer(const Registry& registry, const std::map<std::string, std::string>& models,
                         inference::BatchOptions o)
    : registry_(registry), models_(models), o_(o) {
  for (const auto& [name, path] : models_) {
    if (!ValidModelName(name) || name.find('@') != std::string::npos || name.find(':') != std::string::npos)
      Throw(ErrorKind::kInvalidInput, "--model " + name + "=...: a model name is letters, digits, '.', '_' and '-'");
    try {
      Load(path, "");
    } catch (const ApiError& e) {
      Throw(ErrorKind::kInvalidInput, "--model " + name + "=" + path + ": " + e.what());
    }
  }
}

std::shared_ptr<inference::Batcher> ModelServer::Load(const std::string& path, const std::string& candidate) {
  const std::string key = path + ":" + candidate;
  std::lock_guard<std::mutex> l(mu_);
  if (auto it = loaded_.find(key); it != loaded_.end()) return it->second;
  std::unique_ptr<inference::Classifier> c;
  try {
    c = EndsWith(path, ".onnx") ? inference::Classifier::FromOnnx(path)
                                : std::make_unique<inference::Classifier>(inference::OpenTrainedModel(path, candidate));
  } catch (const Error& e) {
    throw ApiError(e.kind() == ErrorKind::kNotFound ? 404 : 409, "model_unavailable", e.what());
  }
  if (!c->note().empty()) std::fprintf(stderr, "msaflow serve: model %s: %s\n", key.c_str(), c->note().c_str());
  if (loaded_.size() >= kMaxLoaded)
    for (auto it = loaded_.begin(); it != loaded_.end(); ++it)
      if (it->second.use_count() == 1) {  // nobody is inferring with it
        loaded_.erase(it);
        break;
      }
  auto b = std::make_shared<inference::Batcher>(std::move(c), o_);
  loaded_[key] = b;
  return b;
}

ModelServer::Loaded ModelServer::Resolve(const User& u, const std::string& name) {
  if (!ValidModelName(name))
    throw ApiError(404, "no_model", "no model named that (a name is letters, digits and . _ - @ :)");
  if (auto it = models_.find(name); it != models_.end()) return {name, it->second, Load(it->second, "")};
  std::string run, candidate;
  if (EndsWith(name, "@champion")) {
    const std::string pipeline = name.substr(0, name.size() - 9);
    double best = -1;
    for (const json& r : registry_.List(u, 0, 100000)) {  // newest first: a tie keeps the newest
      if (r.value("pipeline", "") != pipeline || r.value("state", "") != "finished" || !r.contains("champion")) continue;
      const double acc = r["champion"].value("accuracy", 0.0);
      if (acc > best) {
        best = acc;
        run = r.value("id", "");
      }
    }
    if (run.empty()) throw ApiError(404, "no_model", "no finished run of pipeline '" + pipeline + "' is yours");
  } else {
    const size_t colon = name.find(':');
    run = name.substr(0, colon);
    if (colon != std::string::npos) candidate = name.substr(colon + 1);
  }
  const std::string dir = registry_.RunDir(u, run);  // 404 when it is not the caller's
  if (!record::HasResults(dir)) throw ApiError(404, "no_model", "run " + run + " has not finished");
  return {name, dir, Load(dir, candidate)};
}

json ModelServer::Metadata(const User& u, const std::string& name) {
  const Loaded m = Resolve(u, name);
  const inference::Classifier& c = m.batcher->model();
  const auto& in = c.input();
  const inference::BatchStats st = m.batcher->stats();
  const json shape = c.raw_pixels() ? json::array({-1, c.PreparedSize()}) : json::array({-1, in.channels, in.height, in.width});
  return {{"name", name},
          {"versions", json::array({"1"})},
          {"platform", "msaflow"},
          {"inputs", json::array({{{"name", "image"}, {"datatype", "FP32"}, {"shape", shape}}})},
          {"outputs", json::array({{{"name", "probabilities"}, {"datatype", "FP32"}, {"shape", {-1, c.classes()}}}})},
          {"parameters",
           {{"classes", c.class_names()},
            {"inputs_accepted",
             {"FP32 [N, ...as above]: images prepared as the run prepared them",
              "UINT8 [N, height, width, channels]: images, prepared here", "BYTES [N]: PNG or JPEG files, base64"}},
            {"max_batch", o_.max_batch},
            {"max_delay_ms", o_.max_delay_ms},
            {"served", {{"requests", st.requests}, {"images", st.images}, {"batches", st.batches}, {"refused", st.refused}}}}}};
}

json ModelServer::Infer(const User& u, const std::string& name, const std::string& body) {
  const Loaded m = Resolve(u, name);
  inference::Batcher::Arrival arrival(m.batcher.get());  // the batch thread may wait for this one
  const inference::Classifier& c = m.batcher->model();
  const json req = json::parse(body, nullptr, false);
  if (req.is_discarded() || !req.is_object()) throw Bad("the body is not a JSON object");
  if (!req.contains("inputs") || !req["inputs"].is_array() || req["inputs"].size() != 1)
    throw Bad("inputs: expected an array of one tensor {name, shape, datatype, data}");
  const json& t = req["inputs"][0];
  if (!t.is_object() || !t.contains("shape") || !t.contains("datatype") || !t.contains("data"))
    throw Bad("inputs[0]: expected {name, shape, datatype, data}");
  if (!t["datatype"].is_string()) throw Bad("inputs[0].datatype: expected FP32, UINT8 or BYTES");
  const std::string type = t["datatype"];
  std::vector<int64_t> shape;
  if (!t["shape"].is_array() || t["shape"].empty() || t["shape"].size() > 4) throw Bad("inputs[0].shape: expected 1 to 4 sizes");
  for (const auto& d : t["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 1 || d.get<int64_t>() > 16384)
      throw Bad("inputs[0].shape: each size a whole number from 1 to 16384");
    shape.push_back(d.get<int64_t>());
  }
  const int64_t n = shape[0];
  if (n > o_.max_queue) throw Bad(fmt::format("inputs[0].shape: {} images; at most {} a request", n, o_.max_queue));
  std::vector<float> x;
  if (type == "FP32") {
    const auto& in = c.input();
    const std::vector<int64_t> want = c.raw_pixels() ? std::vector<int64_t>{n, c.PreparedSize()}
                                                     : std::vector<int64_t>{n, in.channels, in.height, in.width};
    if (shape != want) throw Bad(fmt::format("inputs[0].shape: [{}]; this model takes FP32 [{}]", fmt::join(shape, ", "),
                                             fmt::join(want, ", ")));
    const auto values = Flat(t["data"], static_cast<size_t>(n * c.PreparedSize()));
    x.resize(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      if (!values[i]->is_number()) throw Bad(fmt::format("inputs[0].data[{}]: expected a number", i));
      x[i] = values[i]->get<float>();
    }
  } else if (type == "UINT8") {
    if (shape.size() != 4 || (shape[3] != 1 && shape[3] != 3))
      throw Bad(fmt::format("inputs[0].shape: [{}]; UINT8 images are [N, height, width, channels] with 1 or 3 channels",
                            fmt::join(shape, ", ")));
    const int64_t px = shape[1] * shape[2] * shape[3];
    if (n * px > (int64_t{64} << 20)) throw Bad("inputs[0]: over 64 Mi pixels in one request");
    const auto values = Flat(t["data"], static_cast<size_t>(n * px));
    std::vector<kernels::DecodedImage> images(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      auto& im = images[static_cast<size_t>(i)];
      im.rows = shape[1];
      im.cols = shape[2];
      im.channels = shape[3];
      im.pixels.resize(static_cast<size_t>(px));
      for (int64_t j = 0; j < px; ++j) {
        const json& v = *values[static_cast<size_t>(i * px + j)];
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 255)
          throw Bad(fmt::format("inputs[0].data[{}]: expected a whole number from 0 to 255", i * px + j));
        im.pixels[static_cast<size_t>(j)] = static_cast<uint8_t>(v.get<int64_t>());
      }
    }
    x = c.Prepare(images);
  } else if (type == "BYTES") {
    if (shape.size() != 1) throw Bad("inputs[0].shape: BYTES are [N], one encoded image each");
    const auto values = Flat(t["data"], static_cast<size_t>(n));
    std::vector<kernels::DecodedImage> images;
    for (int64_t i = 0; i < n; ++i) {
      const json& v = *values[static_cast<size_t>(i)];
      std::string bytes;
      if (!v.is_string() || !Base64Decode(v.get<std::string>(), &bytes))
        throw Bad(fmt::format("inputs[0].data[{}]: expected a PNG or JPEG file in base64", i));
      try {
        images.push_back(kernels::DecodeImage(bytes, fmt::format("inputs[0].data[{}]", i)));
      } catch (const Error& e) {
        throw Bad(e.what());
      }
    }
    try {
      x = c.Prepare(images);
    } catch (const Error& e) {
      throw Bad(e.what());
    }
  } else {
    throw Bad("inputs[0].datatype: " + type.substr(0, 20) + "; expected FP32, UINT8 or BYTES");
  }
  std::vector<float> p;
  try {
    p = m.batcher->Infer(std::move(x), n, &arrival);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kUnavailable) throw ApiError(503, "busy", e.what());
    throw;
  }
  json out = {{"model_name", name},
              {"model_version", "1"},
              {"outputs", json::array({{{"name", "probabilities"},
                                        {"datatype", "FP32"},
                                        {"shape", {n, c.classes()}},
                                        {"data", p}}})}};
  if (req.contains("id") && req["id"].is_string()) out["id"] = req["id"];
  return out;
}

}  // namespace msaflow::service
